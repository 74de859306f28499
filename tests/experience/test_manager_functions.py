"""The experience manager's pure functions: allocation, the template, inject and strip, queries."""

import json

import numpy as np
import pytest

from evolver.data.trajectory import Message
from evolver.experience import manager
from evolver.experience.manager import (EXPERIENCE_TEMPLATE, allocate_rollout_exp, allocate_train_modes,
                                        format_experiences, inject_experience, strip_experience, task_query)
from evolver.experience.records import TaskMemory


def test_template_is_agentevolvers():
  assert EXPERIENCE_TEMPLATE == "\n\nSome Related Experience to help you to complete the task:<EXP>{}</EXP>\n\n"


# -- rollout level ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,ratio,expected", [(8, 0.5, 4), (8, 0.3, 2), (5, 0.5, 2), (7, 0.5, 4), (3, 0.5, 2),
                                              (1, 0.5, 0), (8, 0.0, 0), (8, 1.0, 8), (0, 0.5, 0), (10, 0.25, 2)])
def test_mixed_counts_use_pythons_round(n, ratio, expected):
  assert expected == round(n * ratio)  # halves go to even: 2.5 -> 2, 3.5 -> 4, 0.5 -> 0
  for seed in range(5):
    chosen = allocate_rollout_exp(n, "mixed", ratio, np.random.default_rng(seed))
    assert chosen.dtype == bool and chosen.shape == (n,)
    assert int(chosen.sum()) == expected


def test_woexp_and_all():
  rng = np.random.default_rng(0)
  assert not allocate_rollout_exp(6, "woexp", 0.9, rng).any()
  assert allocate_rollout_exp(6, "all", 0.0, rng).all()
  assert allocate_rollout_exp(0, "all", 0.0, rng).shape == (0,)


def test_mixed_places_at_random_and_reproducibly():
  placements = {tuple(allocate_rollout_exp(16, "mixed", 0.5, np.random.default_rng(seed))) for seed in range(20)}
  assert len(placements) > 10  # different rngs, different positions
  assert all(sum(p) == 8 for p in placements)
  first = allocate_rollout_exp(16, "mixed", 0.5, np.random.default_rng(3))
  np.testing.assert_array_equal(first, allocate_rollout_exp(16, "mixed", 0.5, np.random.default_rng(3)))
  # every position is chosen sometimes
  hits = sum(allocate_rollout_exp(8, "mixed", 0.25, np.random.default_rng(s)).astype(int) for s in range(200))
  assert (hits > 0).all()


def test_rollout_bad_arguments():
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match="unknown rollout mode"):
    allocate_rollout_exp(4, "some", 0.5, rng)
  with pytest.raises(ValueError, match="in \\[0, 1\\]"):
    allocate_rollout_exp(4, "mixed", 1.5, rng)
  with pytest.raises(ValueError, match="non-negative"):
    allocate_rollout_exp(-1, "all", 0.5, rng)
  with pytest.raises(ValueError, match="Generator"):
    allocate_rollout_exp(4, "mixed", 0.5, np.random.RandomState(0))


# -- sample level ----------------------------------------------------------------------------------------------


def test_alldiscard_and_allkeep():
  rng = np.random.default_rng(0)
  assert allocate_train_modes(5, "alldiscard", 0.9, rng) == ["discard"] * 5
  assert allocate_train_modes(5, "allkeep", 0.0, rng) == ["keep"] * 5  # allkeep really keeps, whatever the ratio


@pytest.mark.parametrize("num_tasks,keepratio,expected", [(10, 0.5, 5), (7, 0.5, 3), (3, 0.99, 2), (4, 1.0, 4),
                                                          (4, 0.0, 0), (0, 0.5, 0), (9, 0.34, 3)])
def test_hybrid_counts_truncate(num_tasks, keepratio, expected):
  for seed in range(5):
    modes = allocate_train_modes(num_tasks, "hybrid", keepratio, np.random.default_rng(seed))
    assert len(modes) == num_tasks and set(modes) <= {"keep", "discard"}
    assert modes.count("keep") == expected == int(num_tasks * keepratio)


def test_hybrid_is_shuffled():
  orders = {tuple(allocate_train_modes(12, "hybrid", 0.5, np.random.default_rng(s))) for s in range(20)}
  assert len(orders) > 10
  assert allocate_train_modes(12, "hybrid", 0.5, np.random.default_rng(1)) == allocate_train_modes(
      12, "hybrid", 0.5, np.random.default_rng(1))


def test_train_modes_bad_arguments():
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match="unknown train sample mode"):
    allocate_train_modes(3, "discard", 0.5, rng)
  with pytest.raises(ValueError, match="in \\[0, 1\\]"):
    allocate_train_modes(3, "hybrid", -0.1, rng)


# -- inject and strip ------------------------------------------------------------------------------------------


def test_inject_appends_to_the_end():
  text = inject_experience("Your task is to find the key.", "go north twice")
  assert text == "Your task is to find the key." + EXPERIENCE_TEMPLATE.format("go north twice")
  assert inject_experience("task", "") == "task"
  assert inject_experience("task", "  \n") == "task"


@pytest.mark.parametrize("experience", [
    "plain", "regex (.*?) [a-z]+ ^$ \\d {} {0} | + ? \\", "two\nlines\n\nand blank ones\n", "<EXP>nested</EXP>",
    "ends with </EXP>\n\n and more", "unicode: 日本語 ✓", "Memory 1 :\n When to use: x\n Content: y\n"])
def test_round_trip(experience):
  base = "Instruction.\nYour task is: put a {clean} mug in $the$ cabinet (really)."
  injected = inject_experience(base, experience)
  stripped, found = strip_experience(injected)
  assert stripped == base
  assert len(found) == 1
  assert found[0].replace("</ EXP>", "</EXP>") == experience


def test_strip_removes_every_occurrence():
  text = "a" + EXPERIENCE_TEMPLATE.format("one") + "b" + EXPERIENCE_TEMPLATE.format("two\nlines") + "c"
  assert strip_experience(text) == ("abc", ["one", "two\nlines"])
  assert strip_experience("nothing here") == ("nothing here", [])
  twice = inject_experience(inject_experience("t", "x"), "y")
  assert strip_experience(twice) == ("t", ["x", "y"])


HEADER = "\n\nSome Related Experience to help you to complete the task:<EXP>"  # AgentEvolver's yaml template


@pytest.mark.parametrize("text,expected", [
    # AgentEvolver's manage_training_context (non-greedy, DOTALL, re.sub of every block) on literal messages.
    (f"Find the key.{HEADER}go north\nthen east</EXP>\n\nThen report.", ("Find the key.Then report.",
                                                                         ["go north\nthen east"])),
    (f"q{HEADER}e1</EXP>\n\nr{HEADER}e2</EXP>\n\n", ("qr", ["e1", "e2"])),  # two blocks, not one greedy match
    (f"t{HEADER}</EXP>\n\n", ("t", [""])),
    # Not the template: each stays as it is.
    (f"t{HEADER}e</EXP>", (f"t{HEADER}e</EXP>", [])),  # without the trailing blank line (exp_manager/README's)
    (f"t{HEADER}e</EXP>\n", (f"t{HEADER}e</EXP>\n", [])),
    (f"t{HEADER.lower()}e</exp>\n\n", (f"t{HEADER.lower()}e</exp>\n\n", [])),
    ("t <EXP>e</EXP>\n\n", ("t <EXP>e</EXP>\n\n", [])),  # the tags without the header
    (f"t{HEADER}never closed\n\n", (f"t{HEADER}never closed\n\n", [])),
    (HEADER[2:] + "e</EXP>\n\n", (HEADER[2:] + "e</EXP>\n\n", [])),  # without the leading blank line
])
def test_strip_on_literal_messages(text, expected):
  assert EXPERIENCE_TEMPLATE == HEADER + "{}</EXP>\n\n"
  assert strip_experience(text) == expected


# -- formatting and queries ------------------------------------------------------------------------------------


def _memory(when, content):
  return TaskMemory(workspace_id="w", when_to_use=when, content=content)


def test_format_experiences_as_reme():
  memories = [_memory("task A", "do x"), _memory("task B", "do y")]
  expected = "Memory 1 :\n When to use: task A\n Content: do x\n\nMemory 2 :\n When to use: task B\n Content: do y\n"
  assert format_experiences(memories) == expected
  assert format_experiences([(m, 0.5) for m in memories]) == expected
  assert format_experiences([m.to_json() for m in memories]) == expected
  assert format_experiences(memories, when_to_use=False) == "Memory 1 :\n Content: do x\n\nMemory 2 :\n Content: do y\n"
  assert format_experiences([]) == ""


AGENTGYM = [{"role": "user", "content": "You are in a maze. Rules: ..."}, {"role": "assistant", "content": "Ok."},
            {"role": "user", "content": "Your goal: reach the red door."},
            {"role": "assistant", "content": "Thought: go.\nAction: move north"},
            {"role": "user", "content": "You moved north."}]


def test_task_query_is_the_task_not_the_rules():
  assert task_query(AGENTGYM) == "Your goal: reach the red door."
  assert task_query([Message(**m) for m in AGENTGYM]) == "Your goal: reach the red door."
  assert task_query(json.dumps(AGENTGYM)) == "Your goal: reach the red door."
  assert task_query("  just the task text  ") == "just the task text"
  # AgentEvolver's init messages: a system prompt and the query
  assert task_query([{"role": "system", "content": "sys"}, {"role": "user", "content": "Book a flight"}]) == \
      "Book a flight"
  # AgentTraj's form
  assert task_query([{"from": "human", "value": "rules"}, {"from": "gpt", "value": "Ok."},
                     {"from": "human", "value": "the goal"}]) == "the goal"


def test_task_query_drops_injected_experience():
  messages = [dict(m) for m in AGENTGYM[:3]]
  messages[2]["content"] = inject_experience(messages[2]["content"], "old hint")
  assert task_query(messages) == "Your goal: reach the red door."
  assert task_query(json.dumps(messages)) == "Your goal: reach the red door."


def test_task_query_edge_cases():
  assert task_query('["not", "messages"]') == '["not", "messages"]'
  assert task_query("[1, 2") == "[1, 2"
  with pytest.raises(ValueError, match="no user message"):
    task_query([{"role": "assistant", "content": "hi"}])
  with pytest.raises(ValueError, match="role"):
    manager.as_messages([{"role": "robot", "content": "x"}])
