"""The shared loop: cadences of val, metrics and checkpoints, best-policy selection, state owners kept with each
checkpoint, resume without repeated rows, and the held-out report of the selected policy (in process, tiny)."""

import copy
import json
import os
import re

import pytest
from flax import nnx

from evolver.data.chat import end_of_turn_ids
from evolver.models import ModelConfig, make_model
from evolver.train import checkpoints as ckpt_lib
from evolver.train import evaluation
from evolver.train import metrics as metrics_lib
from evolver.train import optimizer as optimizer_lib
from evolver.train import step as step_lib
from evolver.train.loop import Loop, LoopConfig, scalar_metrics
from evolver.train.trainer import Trainer, TrainerConfig

CONFIG = ModelConfig(vocab_size=2432, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                     intermediate_size=64)


class Counter:
  """A state owner: the steps it has seen, kept as a file with every checkpoint."""

  name = "counter"

  def __init__(self):
    self.seen: list[int] = []
    self.loaded: dict | None = None

  def state_files(self):
    return {"seen.json": json.dumps(self.seen).encode()}

  def load_state_files(self, files):
    self.loaded = dict(files)
    self.seen = json.loads(files["seen.json"]) if files else []


def make_loop(model_dir, tokenizer, owner, *, val=(), eval_every=0, eval_tasks=0, checkpoint_every=2,
              max_context_tokens=None, envs=("maze",), **loop_config):
  trainer = Trainer(str(model_dir), make_model(CONFIG, seed=0), optimizer_lib.make_optimizer(10, learning_rate=1e-2),
                    step_lib.sft_loss_fn, config=TrainerConfig(checkpoint_every=checkpoint_every, async_checkpoint=False))
  config = LoopConfig(eval_every=eval_every, eval_tasks=eval_tasks, eval_max_new_tokens=8, eval_max_rounds=1,
                      max_context_tokens=max_context_tokens, **loop_config)
  return Loop("test", str(model_dir), trainer, tokenizer, envs=list(envs), val_indices=list(val), config=config,
              state_owners=[owner])


def run_steps(loop, batch, owner, until, **kwargs):
  def one_step():
    owner.seen.append(loop.step)
    return scalar_metrics(loop.trainer.train_step(batch))
  loop.run(one_step, until=until, extras=lambda: {"position": loop.step}, **kwargs)


def test_cadences_state_files_and_resume(tmp_path, tokenizer, batch):
  owner = Counter()
  loop = make_loop(tmp_path, tokenizer, owner)
  assert loop.resume() == {} and owner.loaded == {}
  seen_at_end = []
  run_steps(loop, batch, owner, 5, first_row={"marker": 1.0}, at_end=lambda results: seen_at_end.append(results))
  assert seen_at_end == [None]  # no val
  loop.close()
  rows = metrics_lib.read_metrics(str(tmp_path))
  assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and rows[0]["marker"] == 1.0 and "marker" not in rows[1]
  assert ckpt_lib.Checkpointer(str(tmp_path), async_save=False).all_steps() == [2, 4, 5]  # keep 3, last forced
  assert (tmp_path / "config.gin").exists() and (tmp_path / "operative_config.gin").exists()
  checkpointer = ckpt_lib.Checkpointer(str(tmp_path), async_save=False)
  assert json.loads(checkpointer.restore_state_files(4)["counter"]["seen.json"]) == [0, 1, 2, 3]
  assert checkpointer.restore_extra(4)["position"] == 4
  # As if the run had died after step 5 was logged but before its checkpoint: resume from step 4.
  import shutil
  shutil.rmtree(os.path.join(checkpointer.directory, "5"))
  owner = Counter()
  loop = make_loop(tmp_path, tokenizer, owner)
  assert loop.resume() == {"position": 4}
  assert owner.seen == [0, 1, 2, 3] and loop.step == 4
  run_steps(loop, batch, owner, 6)
  loop.close()
  assert owner.seen == [0, 1, 2, 3, 4, 5]
  assert [r["step"] for r in metrics_lib.read_metrics(str(tmp_path))] == [1, 2, 3, 4, 5, 6]


def test_val_selects_and_the_report_is_of_the_selected_policy(tmp_path, tokenizer, batch):
  owner = Counter()
  loop = make_loop(tmp_path, tokenizer, owner, val=[0, 1], eval_every=2, eval_tasks=2, checkpoint_every=100)
  loop.resume()
  scores = []
  original = loop.validate

  def validate():
    results = original()
    scores.append(results["overall"]["success"])
    return results

  loop.validate = validate
  run_steps(loop, batch, owner, 3)
  assert len(scores) == 2  # step 2 (eval_every) and step 3 (the end)
  rows = metrics_lib.read_metrics(str(tmp_path))
  assert [r["step"] for r in rows if "val/overall/success" in r] == [2, 3]
  assert all(r["val/best_success"] == max(scores[:i + 1]) for i, r in enumerate(r for r in rows if "val/overall/success" in r))
  best = loop.trainer.best_step()
  assert best == 2  # equal scores keep the first: maze takes 4+ moves, 1 round solves nothing
  results = loop.finish()
  assert results["policy_step"] == 2 and results["selected_on"] == "val" and results["split"] == "eval"
  assert results["envs"]["maze"]["num_tasks"] == 2
  assert json.loads((tmp_path / "eval_results.json").read_text())["policy_step"] == 2
  assert "eval/overall/success" in metrics_lib.read_metrics(str(tmp_path))[-1]


def test_the_start_is_a_val_candidate_and_sampled_val_repeats_its_tasks_and_seeds(tmp_path, tokenizer, batch):
  owner = Counter()
  loop = make_loop(tmp_path, tokenizer, owner, val=[0, 1], eval_every=1, eval_tasks=2, checkpoint_every=100,
                   val_start=True, val_samples=2, eval_samples=2)
  loop.resume()
  run_steps(loop, batch, owner, 2)
  rows = metrics_lib.read_metrics(str(tmp_path))
  assert [r["step"] for r in rows if "val/overall/success" in r] == [0, 1, 2]
  assert rows[0]["step"] == 0 and rows[0]["val/overall/num_episodes"] == 4  # 2 tasks x 2 samples
  # One round solves no maze: every val ties, and a tie keeps the earlier candidate, the start.
  assert loop.trainer.best_step() == 0
  records = [json.loads((tmp_path / "val" / f"step_{s}.json").read_text()) for s in (0, 1, 2)]
  keys = [sorted((e["env"], e["index"], e["sample"]) for e in r["episodes"]) for r in records]
  assert keys[0] == keys[1] == keys[2] == [("maze", i, s) for i in (0, 1) for s in (0, 1)]
  assert all(r["num_samples"] == 2 and r["temperature"] == 1.0 and r["seed"] == 0 for r in records)
  results = loop.finish()
  assert results["policy_step"] == 0 and results["selected_on"] == "val" and results["num_samples"] == 1
  samples = json.loads((tmp_path / "eval_samples.json").read_text())
  assert samples["num_samples"] == 2 and samples["policy_step"] == 0 and len(samples["episodes"]) == 4
  last = metrics_lib.read_metrics(str(tmp_path))[-1]
  assert "eval/overall/success" in last and "eval_sampled/overall/success" in last


def test_the_last_policy_is_held_out_beside_the_selected_one(tmp_path, tokenizer, batch):
  # val keeps the start (every val ties at one round), so the last policy is evaluated on its own; the sampled
  # evaluation plays the selected one's episodes (same tasks and seeds), and its parameters are the trained ones.
  owner = Counter()
  loop = make_loop(tmp_path, tokenizer, owner, val=[0], eval_every=2, eval_tasks=2, checkpoint_every=100,
                   val_start=True, eval_samples=2, eval_last=True)
  loop.resume()
  run_steps(loop, batch, owner, 2)
  evaluated = []
  original = loop.evaluate
  loop.evaluate = lambda params, **kw: evaluated.append((params, kw)) or original(params, **kw)
  selected = loop.finish()
  assert selected["policy_step"] == 0
  last = json.loads((tmp_path / "eval_results_last.json").read_text())
  last_samples = json.loads((tmp_path / "eval_samples_last.json").read_text())
  samples = json.loads((tmp_path / "eval_samples.json").read_text())
  assert last["policy_step"] == last_samples["policy_step"] == 2 and last["selected_on"] == "last step (eval_last)"
  assert sorted((e["env"], e["index"], e["sample"]) for e in last_samples["episodes"]) == \
      sorted((e["env"], e["index"], e["sample"]) for e in samples["episodes"])
  assert len(evaluated) == 4  # the selected policy greedy and sampled, then the last one alike
  assert evaluated[2][0] is loop.trainer.state.params and evaluated[3][0] is loop.trainer.state.params
  assert evaluated[0][0] is not loop.trainer.state.params
  row = metrics_lib.read_metrics(str(tmp_path))[-1]
  assert "eval/overall/success" in row and "eval_last/overall/success" in row
  assert "eval_last_sampled/overall/success" in row


def test_when_val_selects_the_last_policy_its_results_are_not_evaluated_twice(tmp_path, tokenizer, batch):
  owner = Counter()
  loop = make_loop(tmp_path, tokenizer, owner, eval_tasks=1, checkpoint_every=100, eval_last=True)
  loop.resume()
  run_steps(loop, batch, owner, 1)
  calls = []
  original = loop.evaluate
  loop.evaluate = lambda params, **kw: calls.append(kw) or original(params, **kw)
  selected = loop.finish()
  assert selected["selected_on"] == "last step" and len(calls) == 1
  last = json.loads((tmp_path / "eval_results_last.json").read_text())
  assert last["envs"] == selected["envs"] and last["policy_step"] == 1
  assert not (tmp_path / "eval_samples_last.json").exists()


def test_eval_envs_hold_out_some_of_the_run_envs_while_val_covers_all(tmp_path, tokenizer, batch):
  owner = Counter()
  loop = make_loop(tmp_path, tokenizer, owner, val=[0], eval_every=1, eval_tasks=1, checkpoint_every=100,
                   envs=("maze", "sql"), eval_envs=["sql"])
  loop.resume()
  run_steps(loop, batch, owner, 1)
  val_row = next(r for r in metrics_lib.read_metrics(str(tmp_path)) if "val/overall/success" in r)
  assert "val/maze/success" in val_row and "val/sql/success" in val_row
  results = loop.finish()
  assert list(results["envs"]) == ["sql"] and results["envs"]["sql"]["num_tasks"] == 1
  with pytest.raises(ValueError, match=r"eval_envs names \['babyai'\], not envs of this run"):
    make_loop(tmp_path / "other", tokenizer, Counter(), envs=("maze",), eval_envs=("babyai",))
  with pytest.raises(ValueError, match="eval_envs is empty"):
    LoopConfig(eval_envs=())


def test_loop_config_refuses_unpaired_or_degenerate_sampling():
  with pytest.raises(ValueError, match="val_samples"):
    LoopConfig(val_samples=0)
  with pytest.raises(ValueError, match="eval_samples"):
    LoopConfig(eval_samples=1)
  with pytest.raises(ValueError, match="val_temperature > 0"):
    LoopConfig(val_samples=4, val_temperature=0.0)


def test_a_checkpoint_with_state_of_an_unknown_owner_is_refused(tmp_path, tokenizer, batch):
  owner = Counter()
  loop = make_loop(tmp_path, tokenizer, owner)
  loop.resume()
  run_steps(loop, batch, owner, 2)
  loop.close()
  other = Counter()
  other.name = "pool"
  loop = make_loop(tmp_path, tokenizer, other)
  with pytest.raises(ValueError, match=r"keeps state of \['counter'\], which this run does not have"):
    loop.resume()
  loop.close()


def test_state_owner_names_are_plain_and_distinct(tmp_path, tokenizer):
  trainer = Trainer(str(tmp_path), make_model(CONFIG, seed=0), optimizer_lib.make_optimizer(10),
                    step_lib.sft_loss_fn)
  with pytest.raises(ValueError, match="distinct names"):
    Loop("x", str(tmp_path), trainer, tokenizer, envs=["maze"], state_owners=[Counter(), Counter()])
  bad = Counter()
  bad.name = "../escape"
  with pytest.raises(ValueError, match="state owner name"):
    Loop("x", str(tmp_path), trainer, tokenizer, envs=["maze"], state_owners=[bad])
  trainer.close()


def test_max_context_tokens_sizes_the_engine_and_ends_longer_episodes(tmp_path, tokenizer):
  default = make_loop(tmp_path / "default", tokenizer, Counter())
  assert default.engine.sampler.max_length == 4096  # the model has 32,768 positions; the sampler's default cap
  loop = make_loop(tmp_path / "short", tokenizer, Counter(), max_context_tokens=64)
  assert loop.engine.sampler.max_length == 64
  results = loop.evaluate(split="eval", num_tasks=2)  # maze's opening alone is longer than 64 tokens
  # An opening with no room for a first turn is reported as such and left out of the scores (not a failure).
  assert all(e["finish_reason"] == "opening" and e["turns"] == 0 and e["failed"] for e in results["episodes"]), \
      results["episodes"]


def test_the_run_keeps_its_tokenizer_and_refuses_to_resume_with_another(tmp_path, tokenizer):
  make_loop(tmp_path, tokenizer, Counter()).close()
  kept = ckpt_lib.load_run_tokenizer(tmp_path, CONFIG.vocab_size)
  assert kept.get_vocab() == tokenizer.get_vocab() and kept.chat_template == tokenizer.chat_template
  assert end_of_turn_ids(kept) == end_of_turn_ids(tokenizer)
  assert ckpt_lib.load_run_tokenizer(tmp_path / "checkpoints").get_vocab() == tokenizer.get_vocab()
  make_loop(tmp_path, tokenizer, Counter()).close()  # the same tokenizer resumes
  other = copy.deepcopy(tokenizer)
  other.chat_template = "{{- 'You are an agent.\\n' }}" + tokenizer.chat_template
  with pytest.raises(ValueError, match="was trained with the tokenizer in .*tokenizer.* differs"):
    make_loop(tmp_path, other, Counter())


def test_a_run_that_keeps_no_tokenizer_is_read_with_the_tiny_one_only_when_its_vocabulary_fits(tmp_path, tokenizer):
  assert ckpt_lib.load_run_tokenizer(tmp_path, 2432).get_vocab() == tokenizer.get_vocab()
  with pytest.raises(ValueError, match=r"keeps no tokenizer .* vocabulary of 49152 ids .* \(--tokenizer DIR\)"):
    ckpt_lib.load_run_tokenizer(tmp_path, 49152)


def test_a_run_starts_only_from_a_run_that_kept_the_same_tokenizer(tmp_path, tokenizer):
  from evolver.train.trainer import init_policy
  start = tmp_path / "start"
  loop = make_loop(start, tokenizer, Counter())
  loop.trainer.save({}, force=True)
  loop.close()
  assert init_policy(init_checkpoint=str(start), tokenizer=tokenizer).config.vocab_size == CONFIG.vocab_size
  other = copy.deepcopy(tokenizer)
  other.chat_template = "{{- 'You are an agent.\\n' }}" + tokenizer.chat_template
  with pytest.raises(ValueError, match="was trained with the tokenizer in"):
    init_policy(init_checkpoint=str(start), tokenizer=other)


def write_start_evaluations(directory, tokenizer):
  """The start's own held-out evaluations, as `launch.eval --with_greedy` writes them (its policy's digest)."""
  model = make_model(CONFIG, seed=0)
  digest = evaluation.params_digest(nnx.state(model, nnx.Param))
  kwargs = dict(num_tasks=2, max_new_tokens=8, max_rounds=1)
  for file, sampling in (("eval_results.json", {}), ("eval_samples.json", dict(num_samples=2, temperature=1.0))):
    results = evaluation.evaluate(model, tokenizer, ["maze"], **kwargs, **sampling)
    results["policy"] = {"hf_checkpoint": "start", "params_digest": digest}
    evaluation.write_eval_results(directory / file, results)


def test_start_eval_stands_for_the_start_when_val_keeps_it(tmp_path, tokenizer, batch):
  start = tmp_path / "start"
  write_start_evaluations(start, tokenizer)
  owner = Counter()
  loop = make_loop(tmp_path / "run", tokenizer, owner, val=[0], eval_every=2, eval_tasks=2, checkpoint_every=100,
                   val_start=True, eval_samples=2, eval_last=True, start_eval=str(start))
  loop.resume()
  run_steps(loop, batch, owner, 2)
  # What the loop itself plays for its start is what the record holds (the two evaluation paths agree).
  own = loop.evaluate(loop.restore_params(loop.model_dir, 0), split="eval", num_tasks=2)
  record = json.loads((start / "eval_results.json").read_text())
  assert own["episodes"] == record["episodes"]
  assert own["rollout_stats"]["sampled_tokens"] == record["rollout_stats"]["sampled_tokens"] > 0
  calls = []
  original = loop.evaluate
  loop.evaluate = lambda params, **kw: calls.append(kw) or original(params, **kw)
  selected = loop.finish()
  assert selected["policy_step"] == 0 and selected["reused_from"].endswith("start/eval_results.json")
  samples = json.loads((tmp_path / "run" / "eval_samples.json").read_text())
  assert samples["reused_from"].endswith("start/eval_samples.json")
  assert samples["episodes"] == json.loads((start / "eval_samples.json").read_text())["episodes"]
  assert [kw.get("num_samples", 1) for kw in calls] == [1, 2]  # only the last policy, greedy and sampled


def test_start_eval_is_used_only_where_it_holds_this_start_held_out_alike(tmp_path, tokenizer, capsys):
  def loop_with(start, **kwargs):
    return make_loop(tmp_path / "run", tokenizer, Counter(), eval_tasks=2, eval_samples=2,
                     start_eval=str(start), **kwargs)
  write_start_evaluations(tmp_path / "same", tokenizer)
  (tmp_path / "broken").mkdir()
  (tmp_path / "broken" / "eval_results.json").write_text("{not json")
  with pytest.raises(ValueError, match="eval_results.json: not JSON"):
    loop_with(tmp_path / "broken")
  for name, change in (("other_weights", {"policy": {"params_digest": "0123456789abcdef"}}),
                       ("longer_turns", {"max_new_tokens": 16})):
    for file in ("eval_results.json", "eval_samples.json"):
      record = json.loads((tmp_path / "same" / file).read_text())
      (tmp_path / name).mkdir(exist_ok=True)
      (tmp_path / name / file).write_text(json.dumps({**record, **change}))
  for start, kwargs, problem in [
      ("missing", {}, r"missing/eval_results.json is not this run's start .* \(no such file\)"),
      ("other_weights", {}, r"params_digest is '0123456789abcdef', this policy's '[0-9a-f]{16}'"),
      ("longer_turns", {}, "max_new_tokens is 16, this evaluation's 8"),
      ("same", dict(envs=("maze", "sql")), r"envs are \['maze'\], this evaluation's \['maze', 'sql'\]")]:
    loop = loop_with(tmp_path / start, **kwargs)
    assert loop.start_evaluations is None and loop._reused_start(0, "greedy") is None
    assert re.search(problem, capsys.readouterr().out)
    loop.close()
  # Experience at eval changes the start's openings: its record does not stand for it.
  loop = loop_with(tmp_path / "same")
  assert loop._reused_start(0, "greedy") is not None and loop._reused_start(4, "greedy") is None
  loop.eval_openings = lambda step: (lambda tasks, openings: openings)
  assert loop._reused_start(0, "greedy") is None
  loop.close()
