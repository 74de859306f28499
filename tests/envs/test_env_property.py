"""Arbitrary text at every env's `step`: never an exception, always a well-formed answer.

Each env gets 250 examples of 4 strings each (1,000 strings per env), derandomized so the run is the same
every time. Afterwards the env must still work: reset, and the expert still finishes the task.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evolver import envs

NAMES = envs.names()

_TRICKY = st.sampled_from([
    "", " ", "\n", "Action:", "Action: ", "Action:\n\n", "Thought:", "Action: Action: Action:", "\x00",
    "Action: move up" * 50, "Action: get -1 oak log", "Action: get 99999999999999999999 sand",
    "Action: craft 0 x using", "Action: craft 2 a using 1 b, , ,", "Action: go to", "Action: pick up the",
    "Action: a b c d e", "Action: éèêëé", "Action: SELECT", "Action: SELECT 1/0", "Action: ;;;",
    'Action: finish\nAction Input: {"answer": null}', "Action: add_todo\nAction Input: []",
    'Action: complete_todo\nAction Input: {"id": true}', 'Action: get_weather\nAction Input: {"city": 1}',
    "Action: add_todo\nAction Input: {\"title\": \"" + "x" * 500 + "\"}", "Action Input: {}",
])
_REACT = st.builds(lambda thought, action: f"Thought: {thought}\nAction: {action}", st.text(max_size=40),
                   st.text(max_size=60))
_TURNS = st.lists(st.one_of(st.text(max_size=200), _TRICKY, _REACT), min_size=4, max_size=4)


@pytest.mark.parametrize("name", NAMES)
def test_arbitrary_strings_never_break_step(name):
  env = envs.make(name)
  env.reset(0)
  seen = []

  @settings(max_examples=250, derandomize=True, deadline=None, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
  @given(_TURNS)
  def run(turns):
    for text in turns:
      observation, reward, done, info = env.step(text)
      assert isinstance(observation, str) and observation
      assert isinstance(reward, float) and 0.0 <= reward <= 1.0
      assert isinstance(done, bool) and isinstance(info, dict) and isinstance(info["success"], bool)
      seen.append(text)
      if done:
        env.reset(len(seen) % env.num_tasks("train"))

  run()
  assert len(seen) >= 1000
  for index in (0, 1):
    env.reset(index, "eval")
    done = False
    while not done:
      _, reward, done, info = env.step(env.expert_action())
    assert info["success"]
