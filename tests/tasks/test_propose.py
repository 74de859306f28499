"""Proposers: hindsight outcomes as proposals; the LLM proposer's parsing, replay and counts."""

import json

import pytest

from evolver.envs.base import TaskSpec
from evolver.tasks import explore, propose
from tests.tasks import fakes


def episode(world=2, actions=("right", "Thought: again\nAction: right"), failed=False):
  return explore.Exploration(env="line", world=world, episode=0, explorer="random", first_observation="Line world 2.",
                             actions=list(actions), observations=["You are at cell 1.", "You are at cell 2."],
                             hindsight=[fakes.FakeHindsight(TaskSpec("line", world, "train", {"cell": 1}),
                                                            ["right"], "reach cell 1")], failed=failed)


def test_hindsight_proposals_come_from_every_episode_that_did_not_fail():
  proposals = propose.propose_hindsight([episode(), episode(world=3, failed=True)])
  assert len(proposals) == 1
  p = proposals[0]
  assert (p.spec.target, p.actions, p.proposer, p.world, p.episode) == ({"cell": 1}, ("right",), "hindsight", 2, 0)


def test_hindsight_on_another_split_is_a_contract_violation():
  bad = episode()
  bad.hindsight = [fakes.FakeHindsight(TaskSpec("line", 2, "eval", {"cell": 1}), ["right"], "x")]
  with pytest.raises(ValueError, match="stay on the explored train world"):
    propose.propose_hindsight([bad])


def test_parse_reply_reads_json_lists_fences_and_task_blocks():
  item = {"query": "q", "confidence": 0.5, "action_sequence": ["right"]}
  assert propose.parse_reply(json.dumps([item])) == [item]
  assert propose.parse_reply(f"Sure!\n```json\n{json.dumps([item])}\n```\nDone.") == [item]
  assert propose.parse_reply(f"Here: {json.dumps([item, item])} hope it helps") == [item, item]
  assert propose.parse_reply(f"<task>{json.dumps(item)}</task>\n<task>{{bad</task>") == [item]
  assert propose.parse_reply("no json here") is None
  assert propose.parse_item({"query": "q", "confidence": 1, "action_sequence": "# step0\nright\n\n# step1\nleft"}) \
      == ("q", 1.0, ["right", "left"])
  for bad in ({"query": "", "confidence": 0.5, "action_sequence": ["a"]},
              {"query": "q", "confidence": "high", "action_sequence": ["a"]},
              {"query": "q", "confidence": 0.5, "action_sequence": []},
              {"query": "q", "confidence": 0.5, "action_sequence": [1]},
              {"query": "q", "action_sequence": ["a"]}, "text"):
    assert propose.parse_item(bad) is None


def test_llm_proposer_counts_good_bad_and_unreachable_proposals():
  episodes = [episode(world=2), episode(world=3), episode(world=4), episode(world=5, failed=True)]
  replies = {
      # world 2: one good task (reaches cells 1 and 2), one malformed, one that reaches nothing.
      2: json.dumps([{"query": "Walk to cell 2", "confidence": 0.9, "action_sequence": ["right", "right"]},
                     {"query": "no actions", "confidence": 0.9},
                     {"query": "Stand still", "confidence": 0.4, "action_sequence": ["look", "left"]}]),
      3: "I cannot help with that.",  # unparseable
      4: "```json\n[{\"query\": \"Go to cell 1\", \"confidence\": 0.7, \"action_sequence\": \"right\"}]\n```",
  }
  seen = []

  def generate(prompts):
    seen.extend(prompts)
    return [replies[world] for world in (2, 3, 4)]  # one prompt per episode that did not fail, in order

  proposals, counts, records = propose.propose_llm(episodes, generate, fakes.make)
  assert counts == {"prompts": 3, "unparseable": 1, "items": 4, "malformed": 1, "reaches_nothing": 1,
                    "proposals": 2}
  assert len(seen) == 3 and "Walk along a line" in seen[0] and ">>> STEP 1\nAction: right\n" in seen[0]
  # One record per prompt: the reply and what became of it, summing to the counts.
  assert [(r["world"], r["parsed"], r["items"], r["malformed"], r["reaches_nothing"], r["proposals"])
          for r in records] == [(2, True, 3, 1, 1, 1), (3, False, 0, 0, 0, 0), (4, True, 1, 0, 0, 1)]
  assert records[1]["reply"] == "I cannot help with that." and records[0]["env"] == "line"
  first, second = proposals
  # The query becomes the goal; the outcome it names ("cell 2") is the target, with the env's actions.
  assert first.spec == TaskSpec("line", 2, "train", {"cell": 2}, goal="Walk to cell 2")
  assert first.actions == ("right", "right") and first.confidence == 0.9 and first.proposer == "llm"
  assert second.spec == TaskSpec("line", 4, "train", {"cell": 1}, goal="Go to cell 1")


def test_llm_proposer_refuses_a_generate_that_loses_prompts():
  with pytest.raises(ValueError, match="1 prompts"):
    propose.propose_llm([episode()], lambda prompts: [], fakes.make)


def test_choose_outcome_prefers_the_words_of_the_query_then_the_latest():
  outcomes = [fakes.FakeHindsight(TaskSpec("line", 1, "train", {"cell": c}), ["right"] * c, f"reach cell {c}")
              for c in (1, 2, 3)]
  assert propose.choose_outcome("get to cell 2", outcomes).spec.target == {"cell": 2}
  assert propose.choose_outcome("go somewhere", outcomes).spec.target == {"cell": 3}


def test_parse_reply_takes_the_outermost_json_in_prose():
  item = {"query": "q", "confidence": 0.5, "action_sequence": ["right"]}
  assert propose.parse_reply(f"My task: {json.dumps(item)} That is all.") == [item]
  assert propose.parse_reply("[1, 2") is None
