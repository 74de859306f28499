"""Experience without training (`launch.eval --summarize_into DIR`, `--experience DIR`): a policy's own episodes
summarized into a real pool (SQLite store, index, embedder), then retrieved into the openings of an evaluation that
pairs with the same evaluation without it; the policy itself as the summarizer; refusals before anything loads.

  python -m pytest tests/launch/test_eval_experience.py -q
"""

import json
import os

import pytest

from evolver import envs
from evolver.data import agenttraj
from evolver.experience import manager as manager_lib
from evolver.experience.store import ExperienceStore
from evolver.models import generate as generate_lib
from evolver.train import evaluation
from launch import eval as eval_cli
from launch import sweep_report
from tests.fake_http import JSONHandler, serving

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED_BC = os.path.join(ROOT, "evolver", "assets", "checkpoints", "bc_tiny")
# Two maze tasks of the train split, short episodes: what every local run here plays.
EPISODES = ["--hf_checkpoint", SHARED_BC, "--envs", "maze", "--split", "train", "--num_tasks", "2",
            "--max_rounds", "3", "--max_new_tokens", "32"]
TEMPLATE_HEAD = manager_lib.EXPERIENCE_TEMPLATE.split("{}")[0]


@pytest.fixture()
def played(monkeypatch):
  """Spies on `evaluation.evaluate` as launch.eval calls it: [(the policy it was given, its rollouts)] per call."""
  calls = []
  real = evaluation.evaluate

  def spy(policy, *args, on_rollouts=None, **kwargs):
    kept = []

    def keep(rollouts):
      kept.extend(rollouts)
      if on_rollouts is not None:
        on_rollouts(rollouts)

    results = real(policy, *args, on_rollouts=keep, **kwargs)
    calls.append((policy, kept))
    return results

  monkeypatch.setattr(evaluation, "evaluate", spy)
  return calls


def read(path):
  with open(path) as f:
    return json.load(f)


def test_summarize_into_then_evaluate_with_it_paired(tmp_path, played):
  pool, plain, with_pool = str(tmp_path / "pool"), str(tmp_path / "plain.json"), str(tmp_path / "with_pool.json")
  eval_cli.main([*EPISODES, "--out", plain, "--summarize_into", pool])
  summary = read(plain)["experience_summary"]
  assert summary["summarizer"] == "extractive" and summary["pool"] == pool
  assert (summary["episodes"], summary["trajectories"], summary["size_before"]) == (2, 2, 0)
  assert summary["committed"] >= 1 and summary["size"] == summary["committed"] and summary["unparseable"] == 0
  # The pool on disk, read back by a fresh store: the episodes' memories, their condition the task's own text,
  # outside any run's history.
  with ExperienceStore(pool).open("default", create=False) as workspace:
    memories = workspace.all()
  maze = envs.make("maze")
  tasks = {maze.reset(i, "train").strip() for i in range(2)}
  assert len(memories) == summary["committed"]
  for memory in memories:
    assert memory.when_to_use in tasks and memory.author == "extractive"
    assert memory.metadata["env"] == "maze" and memory.metadata["committed_step"] is None

  results = eval_cli.main([*EPISODES, "--out", with_pool, "--experience", pool, "--baseline", plain,
                           "--save_episodes"])
  record = results["experience"]
  assert record == read(with_pool)["experience"]
  assert (record["pool"], record["size"], record["top_k"], record["episodes"], record["episodes_with"]) == \
      (pool, len(memories), 3, 2, 2)
  # Each opening carries its task's memories in the template, at the end of its last initial user message; without
  # them it is the opening the evaluation without experience played.
  (_, without), (_, given) = played
  assert [r.base_opening for r in without] == [None, None]
  for before, after in zip(without, given):
    assert (after.env, after.task_index, after.sample) == (before.env, before.task_index, before.sample)
    assert after.added["experience"] and after.base_opening == before.messages[:before.opening_len]
    last = after.messages[after.opening_len - 1].content
    assert TEMPLATE_HEAD in last and manager_lib.strip_experience(last)[0] == before.messages[2].content
    ids = {m.memory_id for m in memories}
    assert set(after.added["experience"]) <= ids
  episodes = read(with_pool)["episodes"]
  assert [e["experience"] for e in episodes] == [r.added["experience"] for r in given]
  # --save_episodes: the conversations as the policy saw them, memories in the opening, read back as AgentTraj.
  saved_path = str(tmp_path / "with_pool_episodes.json")
  saved = agenttraj.read_agenttraj(saved_path)
  assert [t.messages for t in saved] == [r.messages for r in given]
  assert all(TEMPLATE_HEAD in t.messages[after.opening_len - 1].content for t, after in zip(saved, given))
  items = read(saved_path)
  assert [(i["env"], i["task_index"], i["sample"], i["success"], i["turns"]) for i in items] == \
      [(e["env"], e["index"], e["sample"], e["success"], e["turns"]) for e in episodes]
  assert [i["added"]["experience"] for i in items] == [e["experience"] for e in episodes]
  assert not os.path.exists(str(tmp_path / "plain_episodes.json"))  # only where asked
  # The same tasks and sampling settings as without: paired.
  base = read(plain)
  assert [(e["env"], e["index"], e["sample"]) for e in episodes] == \
      [(e["env"], e["index"], e["sample"]) for e in base["episodes"]]
  assert sweep_report.pairing_mismatch(read(with_pool), base) == []
  paired = read(str(tmp_path / eval_cli.PAIRED_FILE))
  assert paired["baseline"] == plain and paired["experience"] == record
  assert (paired["greedy"]["overall"]["pairs"], paired["greedy"]["overall"]["tasks"]) == (2, 2)


def test_the_evaluated_policy_summarizes_its_own_episodes(tmp_path, played, monkeypatch):
  loads, replies = [], []
  load_hf, sample_replies = eval_cli.load_hf, generate_lib.sample_replies
  monkeypatch.setattr(eval_cli, "load_hf", lambda path: loads.append(path) or load_hf(path))

  def spy_replies(sampler, *args, **kwargs):
    replies.append(sampler)
    return sample_replies(sampler, *args, **kwargs)

  monkeypatch.setattr(generate_lib, "sample_replies", spy_replies)
  out = str(tmp_path / "eval.json")
  eval_cli.main(["--hf_checkpoint", SHARED_BC, "--envs", "maze", "--split", "train", "--num_tasks", "1",
                 "--max_rounds", "1", "--max_new_tokens", "16", "--out", out, "--summarize_into",
                 str(tmp_path / "pool"), "--summarizer", "policy", "--summarizer_max_new_tokens", "8"])
  summary = read(out)["experience_summary"]
  # One load: the summarizer samples through the evaluation's own sampler.
  assert loads == [SHARED_BC] and replies and all(s is played[0][0] for s in replies)
  assert summary["summarizer"] == "policy" and summary["max_new_tokens"] == 8 and summary["replies"] >= 1
  assert 0 <= summary["unparseable"] <= summary["replies"]
  # The first replies are kept as written, for the records.
  assert 1 <= len(summary["first_replies"]) <= min(8, summary["replies"])
  assert all(isinstance(reply, str) for reply in summary["first_replies"])
  assert summary["size"] - summary["size_before"] == summary["committed"]
  assert ExperienceStore(str(tmp_path / "pool")).exists("default")


def test_bad_experience_input_is_refused_before_anything_loads(tmp_path):
  empty_store, file = tmp_path / "empty_store", tmp_path / "file"
  empty_store.mkdir()
  file.write_text("x")
  with ExperienceStore(str(tmp_path / "no_memories")).open("default"):
    pass
  model = ["--hf_checkpoint", str(tmp_path / "no_such_checkpoint"), "--envs", "maze"]
  cases = [
      (["--experience", str(tmp_path / "missing")], "no such directory"),
      (["--experience", str(empty_store)], "no workspace 'default' (no pool there at all)"),
      (["--experience", str(tmp_path / "no_memories"), "--workspace_id", "other"], "its workspaces: default"),
      (["--experience", str(tmp_path / "no_memories")], "holds no memories"),
      (["--experience", str(tmp_path / "no_memories"), "--experience_top_k", "0"], "--experience_top_k must be >= 1"),
      (["--experience", str(tmp_path / "no_memories"), "--max_experience_tokens", "-1"], "must be >= 0"),
      (["--experience_top_k", "2"], "--experience_top_k: only with --experience DIR"),
      (["--summarizer", "policy"], "--summarizer: only with --summarize_into DIR"),
      (["--embedder", "minilm"], "only with --experience DIR or --summarize_into DIR"),
      (["--summarize_into", "gs://bucket/pool"], "needs a local directory"),
      (["--summarize_into", str(file)], "not a directory"),
      (["--summarize_into", str(tmp_path / "pool"), "--workspace_id", "../x"], "bad workspace_id"),
      (["--summarize_into", str(tmp_path / "pool"), "--summarizer_max_new_tokens", "0"], "must be >= 1"),
  ]
  for flags, message in cases:
    with pytest.raises(SystemExit, match=message.replace("(", r"\(").replace(")", r"\)")):
      eval_cli.main([*model, *flags])
  assert not (tmp_path / "missing").exists() and not (tmp_path / "pool").exists()
  assert os.listdir(empty_store) == []


# -- --policy openai: an endpoint that plays the scripted expert and answers the summarizer ----------------------


def expert_turn(messages: list[dict]) -> str:
  """The scripted expert's next turn in a maze train episode (its opening's experience left out)."""
  maze = envs.make("maze")
  observation = manager_lib.strip_experience(messages[2]["content"])[0]
  index = next(i for i in range(2) if maze.reset(i, "train") == observation)
  maze.reset(index, "train")
  for turn in messages[3::2]:
    maze.step(turn["content"])
  return maze.expert_action()


def summarizer_reply(prompt: str) -> str:
  """ReMe's JSON answers: an insight whose condition is the task's text, or a validation."""
  if "validating the quality" in prompt:
    return '```json\n{"is_valid": true, "score": 0.9}\n```'
  query = prompt.split("# Original Query\n", 1)[1].split("\n\n#", 1)[0].strip()
  insight = {"when_to_use": query, "experience": f"Walk the open cells toward the goal; here: {query[-60:]}"}
  return f"```json\n{json.dumps([insight])}\n```"


class _Endpoint(JSONHandler):
  requests: list = []

  def do_POST(self):  # noqa: N802 (http.server's name)
    messages = self.read_json()["messages"]
    type(self).requests.append(messages)
    text = summarizer_reply(messages[0]["content"]) if len(messages) == 1 else expert_turn(messages)
    self.send_json(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": "stop"}]})


def test_an_endpoint_policy_summarizes_and_retrieves(tmp_path):
  _Endpoint.requests = []
  pool = str(tmp_path / "pool")
  with serving(_Endpoint) as url:
    endpoint = ["--policy", "openai", "--base_url", url + "/v1", "--model", "fake-expert", "--api_key_env",
                "NO_SUCH_KEY_VARIABLE", "--envs", "maze", "--split", "train", "--num_tasks", "2"]
    built = eval_cli.main([*endpoint, "--out", str(tmp_path / "plain.json"), "--summarize_into", pool,
                           "--summarizer", "policy"])
    asked = sum(len(m) == 1 for m in _Endpoint.requests)
    summary = read(str(tmp_path / "plain.json"))["experience_summary"]
    assert built["overall"]["success"] == 1.0 and summary["successes"] == 2
    assert summary["replies"] == asked and summary["unparseable"] == 0 and summary["committed"] >= 1
    with ExperienceStore(pool).open("default", create=False) as workspace:
      assert {m.author for m in workspace.all()} == {f"base_url={url}/v1, model=fake-expert"}
    _Endpoint.requests = []
    results = eval_cli.main([*endpoint, "--out", str(tmp_path / "with_pool.json"), "--experience", pool,
                             "--baseline", str(tmp_path / "plain.json")])
  assert results["experience"]["episodes_with"] == 2 and results["overall"]["success"] == 1.0
  openings = [m[2]["content"] for m in _Endpoint.requests if len(m) == 3]
  assert len(openings) == 2 and all(TEMPLATE_HEAD in text for text in openings)
