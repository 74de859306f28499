"""The summarizer: ReMe's pipeline with the extractive and the LLM backends, the LLM one also through the
OpenAI-compatible adapter of evolver.models.generate (the adapters themselves: tests/models/test_generate.py)."""

import json

import pytest

from evolver.data.trajectory import Message, Trajectory
from evolver.experience import summarizer as lib
from evolver.experience.embedders import HashingEmbedder
from evolver.experience.manager import inject_experience
from evolver.experience.records import ExperienceError
from evolver.experience.summarizer import (ExtractiveSummarizer, LLMSummarizer, SummarizerUnavailable,
                                           summarize_and_commit)
from evolver.experience.pool import ExperiencePool
from evolver.experience.store import ExperienceStore
from evolver.models.generate import OpenAIGenerate
from tests.experience.helpers import GOAL, LOSE, WIN, conversation
from tests.fake_http import EchoChat, echo_chat


def episode(goal, actions, score, task_id="", env="maze", final="Done.", item_id=""):
  data = {"messages": conversation(goal, actions, final=final), "score": score}
  if task_id:
    data["task_id"] = task_id
  data["metadata"] = {"env": env, "item_id": item_id or task_id}
  return data


def by_kind(memories):
  return {m.metadata["kind"]: m for m in memories}


@pytest.fixture()
def pool(tmp_path):
  return ExperiencePool(ExperienceStore(str(tmp_path)), "w1", HashingEmbedder(dim=256))


def test_extractive_records():
  trajectories = [episode(GOAL, WIN, 1.0, task_id="t1", item_id="maze/train/1#0"),
                  episode(GOAL, LOSE, 0.0, task_id="t1", final="A wall blocks the way.", item_id="maze/train/1#1")]
  result = ExtractiveSummarizer().summarize(trajectories, "w1")
  assert result.stats == {"trajectories": 2, "skipped": 0, "successes": 1, "failures": 1, "extracted": 3,
                          "invalid": 0, "duplicates": 0, "unparseable": 0}
  kinds = by_kind(result.memories)
  assert set(kinds) == {"success", "failure", "comparative"}
  for memory in result.memories:
    assert memory.when_to_use == GOAL  # the task's own text, not the rules
    assert memory.author == "extractive" and memory.workspace_id == "w1"
    assert memory.metadata["task_id"] == "t1" and memory.metadata["env"] == "maze"
    assert memory.metadata["tags"] == ["maze", memory.metadata["kind"]]
  assert kinds["success"].content == "This worked (score 1.00, 4 actions): move north x2 -> turn left -> open door."
  assert kinds["success"].metadata["source"] == ["maze/train/1#0"]
  failure = kinds["failure"].content
  assert "after 4 actions" in failure and "move north -> turn right -> move east" in failure
  assert "A wall blocks the way." in failure
  comparative = kinds["comparative"].content
  assert "agreed on the first 2 actions (move north x2)" in comparative
  assert 'the success did "turn left" where the failure did "turn right"' in comparative
  assert "The success went on: open door." in comparative
  assert kinds["comparative"].metadata["source"] == ["maze/train/1#0", "maze/train/1#1"]


def test_preprocess_threshold():
  trajectories = [episode(GOAL, WIN, 0.5, task_id="t1")]
  assert ExtractiveSummarizer().propose(trajectories, "w").stats["failures"] == 1
  result = ExtractiveSummarizer(success_threshold=0.5).propose(trajectories, "w")
  assert result.stats["successes"] == 1 and by_kind(result.memories).keys() == {"success"}


def test_one_record_per_kind_and_task_best_success_first():
  trajectories = [episode(GOAL, WIN + ["wait"], 1.0, task_id="t1"), episode(GOAL, WIN, 1.0, task_id="t1"),
                  episode("Your goal: reach the blue key.", ["move south"], 1.0, task_id="t2")]
  memories = ExtractiveSummarizer().summarize(trajectories, "w").memories
  assert len(memories) == 2
  assert "4 actions" in memories[0].content  # the shorter of the two successes
  assert memories[1].when_to_use == "Your goal: reach the blue key."


def test_tasks_without_ids_group_by_their_text():
  trajectories = [episode(GOAL, WIN, 1.0), episode(GOAL, LOSE, 0.0)]
  assert by_kind(ExtractiveSummarizer().summarize(trajectories, "w").memories).keys() == {
      "success", "failure", "comparative"}


def test_injected_experience_is_not_part_of_the_condition():
  data = episode(GOAL, WIN, 1.0)
  data["messages"][2]["content"] = inject_experience(GOAL, "an old hint")
  memory = ExtractiveSummarizer().summarize([data], "w").memories[0]
  assert memory.when_to_use == GOAL


def test_evolver_trajectories():
  messages = [Message(**m) for m in conversation(GOAL, WIN)]
  good = Trajectory(item_id="maze/train/3", messages=messages, env="maze", reward=1.0, success=True)
  broken = Trajectory(item_id="maze/train/4", messages=messages, env="maze", failed=True, error="server lost")
  result = ExtractiveSummarizer().summarize([good, broken], "w")
  assert result.stats["trajectories"] == 2 and result.stats["skipped"] == 1 and result.stats["successes"] == 1
  memory = result.memories[0]
  assert memory.metadata["task_id"] == "maze/train/3" and memory.metadata["source"] == ["maze/train/3"]
  payload = lib.trajectory_payload(good)
  assert payload["score"] == 1.0 and payload["messages"][2] == {"role": "user", "content": GOAL}
  # the env's verdict decides over the score; a rollout's sample index names its source
  partial = Trajectory(item_id="textcraft/train/5", messages=messages, env="textcraft", reward=0.8, success=True)
  partial.sample = 2  # as a Rollout has
  memory = ExtractiveSummarizer().summarize([partial], "w").memories[0]
  assert memory.metadata["kind"] == "success" and memory.metadata["source"] == ["textcraft/train/5#2"]
  assert lib.trajectory_payload(partial)["metadata"]["trajectory_id"] == "textcraft/train/5#2"
  assert ExtractiveSummarizer().summarize([{"messages": conversation(GOAL, WIN), "score": 0.3,
                                            "metadata": {"success": True}}], "w").stats["successes"] == 1


def test_nothing_to_learn_and_malformed_input():
  no_actions = {"messages": [{"role": "user", "content": GOAL}], "score": 0.0}
  no_user = {"messages": [{"role": "assistant", "content": "hello"}], "score": 1.0}
  result = ExtractiveSummarizer().summarize([no_actions, no_user], "w")
  assert result.memories == [] and result.stats["skipped"] == 1 and result.stats["extracted"] == 0
  with pytest.raises(ExperienceError, match="no 'messages'"):
    ExtractiveSummarizer().summarize([{"score": 1.0}], "w")
  with pytest.raises(ExperienceError, match="score"):
    ExtractiveSummarizer().summarize([{"messages": [], "score": "high"}], "w")
  with pytest.raises(ExperienceError, match="workspace_id"):
    ExtractiveSummarizer().summarize([], "../x")
  with pytest.raises(ExperienceError, match="must be a list"):
    ExtractiveSummarizer().summarize({"messages": []}, "w")


def test_long_episodes_are_compressed():
  actions = [f"step {i}" for i in range(100)]
  memory = ExtractiveSummarizer(max_actions=10).summarize([episode(GOAL, actions, 1.0)], "w").memories[0]
  assert "step 9 -> ... (90 more)" in memory.content and len(memory.content) < 400


def test_dedup_within_the_batch_and_against_the_workspace(pool):
  trajectories = [episode(GOAL, WIN, 1.0, task_id="t1"), episode(GOAL, WIN, 1.0, task_id="t1-copy")]
  first = summarize_and_commit(pool, trajectories, step=3)
  assert len(first.memories) == 1 and first.stats["duplicates"] == 1
  assert pool.size == 1 and pool.workspace.all()[0].metadata["committed_step"] == 3
  again = summarize_and_commit(pool, trajectories, step=4)
  assert again.memories == [] and again.stats["duplicates"] == 2 and pool.size == 1
  other = summarize_and_commit(pool, [episode("Your goal: fetch the green ball.", ["pick up ball"], 1.0)], step=5)
  assert len(other.memories) == 1 and pool.size == 2
  # a pool in place of the workspace id: its workspace, deduplicated against it
  assert ExtractiveSummarizer().summarize(trajectories, pool).memories == []


def test_dedup_threshold(pool):
  near = [episode(GOAL, WIN, 1.0, task_id="a"), episode(GOAL + " ", WIN + ["wait"], 1.0, task_id="b")]
  assert len(ExtractiveSummarizer(dedup_threshold=0.8).summarize(near, "w1", pool=pool).memories) == 1
  assert len(ExtractiveSummarizer(dedup_threshold=0.999).summarize(near, "w1", pool=pool).memories) == 2
  # the same pair in two calls is judged as in one: the second is a duplicate of the stored first
  loose = ExtractiveSummarizer(dedup_threshold=0.8)
  assert len(summarize_and_commit(pool, near[:1], summarizer=loose).memories) == 1
  second = summarize_and_commit(pool, near[1:], summarizer=loose)
  assert second.memories == [] and second.stats["duplicates"] == 1
  assert len(summarize_and_commit(pool, near[1:], summarizer=ExtractiveSummarizer(dedup_threshold=0.999)).memories) == 1


# -- the LLM backend -------------------------------------------------------------------------------------------


def insight(when, experience, **extra):
  return {"when_to_use": when, "experience": experience, "tags": ["nav"], "confidence": 0.7,
          "step_type": "action", **extra}


class ScriptedModel:
  """Answers extraction prompts by kind and validation prompts with a verdict; records the prompts."""

  def __init__(self, extraction=None, validation=None):
    self.prompts = []
    self.extraction = extraction or {}
    self.validation = validation or (lambda prompt: '```json\n{"is_valid": true, "score": 0.9}\n```')

  def __call__(self, prompts):
    self.prompts.append(list(prompts))
    outputs = []
    for prompt in prompts:
      if prompt.startswith("You are an expert AI analyst tasked with validating"):
        outputs.append(self.validation(prompt))
      elif "successful trajectory" in prompt:
        outputs.append(self.extraction.get("success", "[]"))
      elif "failed trajectory" in prompt:
        outputs.append(self.extraction.get("failure", "[]"))
      else:
        outputs.append(self.extraction.get("comparative", "[]"))
    return outputs


def test_llm_summarizer():
  model = ScriptedModel({
      "success": "Here you go:\n```json\n" + json.dumps([insight("When the door is red", "Turn left at the wall")])
                 + "\n```",
      "failure": json.dumps([insight("When a wall blocks", "Do not turn right there"), {"no": "fields"}]),
      "comparative": "I think the first was better.",  # unparseable
  })
  trajectories = [episode(GOAL, WIN, 1.0, task_id="t1"), episode(GOAL, LOSE, 0.0, task_id="t1")]
  result = LLMSummarizer(model, model="qwen-test").summarize(trajectories, "w")
  assert result.stats["unparseable"] == 1 and result.stats["extracted"] == 2 and result.stats["invalid"] == 0
  kinds = by_kind(result.memories)
  assert kinds["success"].content == "Turn left at the wall" and kinds["success"].when_to_use == "When the door is red"
  assert kinds["success"].author == "qwen-test" and kinds["success"].score == 0.9
  assert kinds["failure"].metadata["confidence"] == 0.7 and kinds["failure"].metadata["tags"] == ["nav"]
  assert kinds["failure"].metadata["step_type"] == "action" and kinds["failure"].metadata["task_id"] == "t1"
  extraction_prompts = model.prompts[0]
  assert len(extraction_prompts) == 3  # success, failure, soft comparison
  assert GOAL in extraction_prompts[0] and "open door" in extraction_prompts[0]
  assert "Higher-Scoring Step Sequence (Score: 1.00)" in extraction_prompts[2]
  assert len(model.prompts[1]) == 2  # one validation per record


def test_llm_validation_drops_and_counts():
  verdicts = iter(['```json\n{"is_valid": false, "score": 0.9}\n```', '{"is_valid": true, "score": 0.2}',
                   "no verdict at all", '```json\n{"is_valid": true, "score": 0.6}\n```'])
  model = ScriptedModel({"success": json.dumps([insight(f"case {i}", f"lesson number {i}") for i in range(4)])},
                        validation=lambda prompt: next(verdicts))
  result = LLMSummarizer(model).summarize([episode(GOAL, WIN, 1.0)], "w")
  assert [m.content for m in result.memories] == ["lesson number 3"]
  assert result.stats["invalid"] == 3 and result.stats["unparseable"] == 1
  unvalidated = LLMSummarizer(ScriptedModel({"success": json.dumps([insight("c", "a lesson")])}), validate=False)
  assert len(unvalidated.summarize([episode(GOAL, WIN, 1.0)], "w").memories) == 1


def test_llm_failures_are_reported_not_raised_as_anything_else():
  def broken(prompts):
    raise ConnectionError("refused")
  with pytest.raises(SummarizerUnavailable, match="refused"):
    LLMSummarizer(broken).summarize([episode(GOAL, WIN, 1.0)], "w")
  with pytest.raises(SummarizerUnavailable, match="answered 0 texts"):
    LLMSummarizer(lambda prompts: []).summarize([episode(GOAL, WIN, 1.0)], "w")


def test_parse_json_output():
  assert lib.parse_json_output('```json\n[{"a": 1}]\n```') == [{"a": 1}]
  assert lib.parse_json_output('Sure! [{"a": 1}] Hope it helps.') == [{"a": 1}]
  assert lib.parse_json_output('{"is_valid": true}') == {"is_valid": True}
  with pytest.raises(ValueError):
    lib.parse_json_output("nothing")
  single = {"condition": "c", "experience": "e"}
  assert lib.parse_insights(json.dumps(single)) == [single]


# -- the OpenAI-compatible adapter against a tiny local server -------------------------------------------------


@pytest.fixture()
def fake_openai():
  with echo_chat() as url:
    yield url


def test_llm_summarizer_through_the_adapter(fake_openai):
  # the echo is no JSON: every output is unparseable, nothing is raised
  summarizer = LLMSummarizer(OpenAIGenerate(fake_openai, "tiny", timeout_s=10))
  assert summarizer.author == "tiny"  # the adapter's model writes the memories
  result = summarizer.summarize([episode(GOAL, WIN, 1.0), episode(GOAL, LOSE, 0.0)], "w")
  assert result.memories == [] and result.stats["unparseable"] == 3
  assert EchoChat.requests[0][2]["temperature"] == 0.0  # greedy by default


def test_an_endpoint_that_fails_makes_the_summarizer_unavailable(fake_openai):
  for generate in (OpenAIGenerate(fake_openai, "broken", timeout_s=10, max_retries=0),
                   OpenAIGenerate("http://127.0.0.1:9/v1", "tiny", timeout_s=5, max_retries=0)):
    with pytest.raises(SummarizerUnavailable, match="the summarizer's model failed: APIUnavailable"):
      LLMSummarizer(generate).summarize([episode(GOAL, WIN, 1.0)], "w")
  assert LLMSummarizer(lambda prompts: prompts).author == "llm"
