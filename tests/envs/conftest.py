"""Fixtures for the env tests."""

import pytest

from tests.envs.helpers import ServerProcess


@pytest.fixture(scope="module")
def maze_server():
  server = ServerProcess("maze")
  yield server
  server.kill()
