"""The llama_cpp suite (the CPU reference on SmolLM2's GGUF file) is a suite that names its optional install."""

import sys

import pytest

from launch import benchmark


def test_it_is_a_suite_that_names_the_package_it_needs(monkeypatch):
  assert "llama_cpp" in benchmark.available_suites()
  monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp raises ImportError, installed or not
  with pytest.raises(SystemExit, match=r"pip install llama-cpp-python==0\.3\.36"):
    benchmark.main(["--suite", "llama_cpp", "--repeats", "1"])


def test_its_options_print_without_the_package(monkeypatch, capsys):
  monkeypatch.setitem(sys.modules, "llama_cpp", None)
  with pytest.raises(SystemExit) as exit_info:
    benchmark.main(["--suite", "llama_cpp", "--help"])
  assert exit_info.value.code == 0
  assert "--threads" in capsys.readouterr().out
