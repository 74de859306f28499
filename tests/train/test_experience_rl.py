"""The experience pool in the GRPO loop (evolver/train/experience.py): openings per sample, samples kept or
stripped per task with exp_mask exactly on the stripped ones, the HET-PPO metrics of both kinds of tokens, freq and
utility alike in process and through the service, the experience budget. The whole run, killed and resumed:
tests/train/test_agentevolver_run.py.

  python -m pytest tests/train/test_experience_rl.py -q
"""

import collections
import dataclasses
import json

import numpy as np
import pytest

from evolver.data import batching
from evolver.data.trajectory import Message
from evolver.experience import manager as manager_lib
from evolver.experience.embedders import HashingEmbedder
from evolver.experience.records import TaskMemory
from evolver.experience.service import ExperienceService, ServiceThread
from evolver.experience.store import ExperienceStore
from evolver.models.tokenizer import load_tokenizer
from evolver.rollout import EpisodeOpening, Rollout, RolloutConfig, RolloutEngine, Task
from evolver.rollout import OpeningChange
from evolver.train import advantages, rl
from evolver.train import extensions as extensions_lib
from evolver.train.extensions import RLExtension, chain_openings
from evolver.train.synthetic_tasks import SyntheticTasks
from evolver.train import optimizer as optimizer_lib
from evolver.train.experience import ExperienceManager, task_groups
from evolver.train.trainer import Trainer, TrainerConfig
from tests.rollout.tiny_policy import tiny_model, tiny_sampler



def manager(tmp_path, **kwargs):
  ext = ExperienceManager(store_dir=str(tmp_path / "store"), seed=3, **kwargs)
  ext.start(model_dir=str(tmp_path / "run"), envs=["maze"], seed=3)
  return ext


def remember(ext, *texts):
  ext.pool.commit([TaskMemory(workspace_id="default", when_to_use=t, content=f"Advice for {t}") for t in texts])


def openings(tasks, samples):
  return [EpisodeOpening(Task("maze", i), s, [Message("user", "rules"), Message("assistant", "Ok."),
                                               Message("user", f"Map {i}: reach the goal at ({i}, 3).")])
          for i in tasks for s in range(samples)]


def test_mixed_rollouts_get_experience_on_round_n_ratio_samples_of_each_task(tmp_path):
  ext = manager(tmp_path, train_rollout_mode="mixed", rollout_ratio=0.5, retrieve_top_k=2)
  batch = openings([1, 2, 3], 4)
  assert task_groups(batch) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
  assert ext.transform_openings(0, batch) == [None] * 12  # an empty pool: nothing to add
  remember(ext, "Map 1: reach the goal at (1, 3).", "Map 2: reach the goal at (2, 3).", "Sort the numbers.")
  changes = ext.transform_openings(0, batch)
  for group in task_groups(batch):
    assert sum(changes[p] is not None for p in group) == 2  # round(4 * 0.5), per task
  for opening, change in zip(batch, changes):
    if change is None:
      continue
    text = change.messages[-1].content
    assert text.startswith(opening.messages[-1].content) and text.endswith("</EXP>\n\n")  # appended, the template
    assert manager_lib.strip_experience(text)[0] == opening.messages[-1].content
    assert len(change.added["experience"]) == 2 and change.messages[:2] == opening.messages[:2]
  placements = {tuple(c is not None for c in ext.transform_openings(step, batch)) for step in range(6)}
  assert len(placements) > 1  # random placement, drawn per step
  assert ext.transform_openings(0, batch, validating=True) == [None] * 12  # val: woexp
  ext.close()


def episode(opening, change, *, success, group, sample=0):
  """A scored one-turn rollout of `opening` as `change` (an OpeningChange or None) left it."""
  messages = list(change.messages if change else opening.messages)
  return Rollout(item_id=f"maze_{opening.task.index}", messages=messages + [
      Message("assistant", "Action: move up"), Message("user", "You moved up.")], env="maze",
      task_index=opening.task.index, split="train", reward=float(success), success=success, turns=1, group=group,
      sample=sample, opening_len=len(messages), base_opening=list(opening.messages) if change else None,
      added=dict(change.added) if change else {})


def test_the_manager_works_the_same_through_the_experience_service(tmp_path):
  service = ExperienceService(ExperienceStore(str(tmp_path / "served")), HashingEmbedder())
  with ServiceThread(service) as server:
    ext = ExperienceManager(service_url=server.url, train_rollout_mode="all", retrieve_top_k=1, updated_freq=1,
                            min_score=-1.0, seed=3)
    ext.start(model_dir=str(tmp_path / "run"), envs=["maze"], seed=3)
    batch = openings([1, 2], 2)
    assert ext.transform_openings(0, batch) == [None] * 4  # the served pool is empty
    rollouts = [episode(batch[0], None, success=True, group=0)]
    ext.before_update(0, rollouts)  # the summary starts here, during the update
    row = ext.after_step(0, rollouts)  # and is in the pool when the step ends
    assert row["summary/committed"] >= 1 and row["pool_size"] == row["summary/committed"]
    changes = ext.transform_openings(1, batch)
    assert all(c is not None and "<EXP>" in c.messages[-1].content for c in changes)  # found through the service
    ext.close()


def test_task_groups_never_merge_when_a_reset_fails():
  batch = openings([1, 2, 2], 3)
  # Sample 0 of task 2 failed to reset: its samples 1 and 2 are a group of their own, and so are the three
  # samples of the second draw of task 2 right after them (its sample 0 does not grow the index).
  failed = [o for k, o in enumerate(batch) if k != 3]
  assert task_groups(failed) == [[0, 1, 2], [3, 4], [5, 6, 7]]
  assert task_groups([o for k, o in enumerate(batch) if k not in (0, 3)]) == [[0, 1], [2, 3], [4, 5, 6]]


def test_freq_and_utility_mean_the_same_in_process_and_through_the_service(tmp_path):
  """One definition on both paths: freq counts the scored training episodes a memory was given to, utility those
  of them that succeeded, stamped with the step; a pool initialised from a library on both paths (the service
  reads it from its own library directory)."""
  library = tmp_path / "served" / "libraries" / "advice.jsonl"
  library.parent.mkdir(parents=True)
  memories = [TaskMemory(workspace_id="default", memory_id=f"m{i}", when_to_use=f"Map {i}: reach the goal at ({i}, 3).",
                         content=f"Advice {i}") for i in range(3)]
  library.write_text("".join(json.dumps(m.to_json()) + "\n" for m in memories))
  common = dict(train_rollout_mode="mixed", rollout_ratio=0.5, retrieve_top_k=2, min_score=-1.0, seed=3)
  served = ExperienceStore(str(tmp_path / "served"))
  with ServiceThread(ExperienceService(served, HashingEmbedder())) as server:
    local = ExperienceManager(store_dir=str(tmp_path / "local"), init_from=str(library), **common)
    remote = ExperienceManager(service_url=server.url, init_from="advice.jsonl", **common)
    for ext in (local, remote):
      ext.start(model_dir=str(tmp_path / "run"), envs=["maze"], seed=3)
      assert ext.size == 3
    given, helped, given_at = collections.Counter(), collections.Counter(), []
    for step in range(3):
      batch = openings([1, 2], 4)
      changes = local.transform_openings(step, batch)
      assert remote.transform_openings(step, batch) == changes  # the same retrievals
      rollouts = [episode(o, c, success=(k + step) % 3 == 0, group=k // 4, sample=o.sample)
                  for k, (o, c) in enumerate(zip(batch, changes))]
      rollouts[-1] = dataclasses.replace(rollouts[-1], failed=True)  # an errored episode counts nothing
      given_at.append(collections.Counter(i for r in rollouts[:-1] for i in r.added.get("experience", [])))
      given.update(given_at[-1])
      helped.update(i for r in rollouts[:-1] if r.success for i in r.added.get("experience", []))
      for ext in (local, remote):
        ext.before_update(step, rollouts)
        ext.after_step(step, rollouts)
    stored = {"local": local.pool.workspace, "service": served.open("default")}
    for path, workspace in stored.items():
      counters = {m.memory_id: (m.metadata["freq"], m.metadata["utility"]) for m in workspace.all()}
      assert counters == {f"m{i}": (given[f"m{i}"], helped[f"m{i}"]) for i in range(3)}, path
      # Stamped with the step each change belongs to (the checkpoint after RL step 0 is step 1): a rewind to
      # step 1 keeps exactly step 0's.
      workspace.set_aside_after(1)
      assert {m.memory_id: m.metadata["freq"] for m in workspace.all()} == {
          f"m{i}": given_at[0][f"m{i}"] for i in range(3)}, path
    assert sum(given.values()) > sum(helped.values()) > 0
    for ext in (local, remote):
      ext.close()


def test_injected_experience_keeps_to_its_token_budget(tmp_path):
  ext = manager(tmp_path, train_rollout_mode="all", retrieve_top_k=3, min_score=-1.0, max_experience_tokens=60)
  long = " ".join(["Go north, then east, then check the walls before each move."] * 30)
  remember(ext, "Map 1: reach the goal at (1, 3).", "Map 2: reach the goal at (2, 3).")
  ext.pool.commit([TaskMemory(workspace_id="default", when_to_use="Map 1: reach the goal at (1, 3)!", content=long)])
  changes = ext.transform_openings(0, openings([1], 2))
  tokenizer = load_tokenizer()
  for change in changes:
    text = manager_lib.strip_experience(change.messages[-1].content)[1][0]
    assert len(tokenizer.encode(text, add_special_tokens=False)) <= 60
    assert text == change.added["experience_text"]
  row = ext.after_step(0, [])
  assert row["cut_memories"] >= 2 and row["cut_tokens"] > 300  # the long memory and what followed it
  assert ext.after_step(1, [])["cut_memories"] == 0  # counted per step
  unlimited = manager(tmp_path / "unlimited", train_rollout_mode="all", retrieve_top_k=3, min_score=-1.0,
                      max_experience_tokens=None)
  remember(unlimited, "Map 1: reach the goal at (1, 3).")
  assert unlimited.transform_openings(0, openings([1], 1))[0] is not None
  for e in (ext, unlimited):
    e.close()


@pytest.fixture(scope="module")
def step_rollouts(tmp_path_factory):
  """A step's rollouts: 4 tasks x 4 samples, half of each task's samples with experience (mixed 0.5)."""
  tmp = tmp_path_factory.mktemp("exp")
  tokenizer = load_tokenizer()
  ext = manager(tmp, train_rollout_mode="mixed", rollout_ratio=0.5, train_sample_mode="hybrid",
                train_sample_keepratio=0.5, retrieve_top_k=1, min_score=-1.0)
  remember(ext, *(f"Map: walls, a start S and a goal G number {i}" for i in range(5)))
  model = tiny_model(tokenizer)
  with RolloutEngine(tiny_sampler(model), tokenizer) as engine:
    rolled = engine.run([Task("maze", i) for i in (3, 4, 5, 6)],
                        RolloutConfig(max_new_tokens=12, max_rounds=2, temperature=1.0, num_samples=4, seed=1),
                        transform_openings=lambda o: ext.transform_openings(0, o))
  yield tokenizer, ext, rolled.trajectories
  ext.close()


def test_hybrid_sampling_sets_exp_mask_exactly_on_the_stripped_samples(step_rollouts):
  tokenizer, ext, rollouts = step_rollouts
  assert sum(bool(r.added) for r in rollouts) == 8
  trained = ext.training_rollouts(0, list(rollouts), tokenizer)
  stripped = [t is not r for t, r in zip(trained, rollouts)]
  kept_with_text = [bool(r.added) and t is r for t, r in zip(trained, rollouts)]
  by_task = {g: {stripped[i] for i, r in enumerate(rollouts) if r.group == g and r.added} for g in range(4)}
  assert sorted(tuple(v) for v in by_task.values()) == [(False,), (False,), (True,), (True,)]  # 2 of 4 tasks keep
  batch = batching.batch_trajectories(trained, tokenizer, buckets=(1024, 2048))
  for row, t in enumerate(trained):
    expected = batch["loss_mask"][row] if stripped[row] else np.zeros_like(batch["loss_mask"][row])
    np.testing.assert_array_equal(batch["exp_mask"][row], expected)
    decoded = tokenizer.decode(t.token_ids.tolist())
    assert ("<EXP>" in decoded) == kept_with_text[row]  # keep really keeps; discard really strips


HINT = "\n\nA hint another extension added."


class Hint(RLExtension):
  """A second extension that adds to the same opening (even samples) and strips its hint whatever the pool does."""

  name = "hint"
  added_keys = ("hint",)

  def transform_openings(self, step, openings, *, validating=False):
    return [OpeningChange(o.messages[:-1] + [Message("user", o.messages[-1].content + HINT)], {"hint": True})
            if o.sample % 2 == 0 else None for o in openings]

  def remove_added(self, messages, added):
    return [dataclasses.replace(m, content=m.content.replace(HINT, "")) if m.role == "user" else m for m in messages]


@pytest.fixture(scope="module")
def composed_rollouts(tmp_path_factory):
  """For each list order of [Hint, ExperienceManager]: the extensions and a step's rollouts made through both
  (4 tasks x 4 samples; experience on half of each task's samples, the hint on the even ones)."""
  tokenizer = load_tokenizer()
  model = tiny_model(tokenizer)
  made = {}
  for order in ("hint_first", "experience_first"):
    ext = manager(tmp_path_factory.mktemp(order), train_rollout_mode="mixed", rollout_ratio=0.5, retrieve_top_k=1,
                  min_score=-1.0, train_sample_keepratio=0.5)
    remember(ext, *(f"Map: walls, a start S and a goal G number {i}" for i in range(5)))
    extensions = [Hint(), ext] if order == "hint_first" else [ext, Hint()]
    with RolloutEngine(tiny_sampler(model), tokenizer) as engine:
      rolled = engine.run([Task("maze", i) for i in (3, 4, 5, 6)],
                          RolloutConfig(max_new_tokens=8, max_rounds=1, temperature=1.0, num_samples=4, seed=1),
                          transform_openings=chain_openings(extensions, 0))
    made[order] = (extensions, ext, rolled.trajectories)
  yield tokenizer, made
  for _, ext, _ in made.values():
    ext.close()


@pytest.mark.parametrize("order", ["hint_first", "experience_first"])
@pytest.mark.parametrize("mode", ["alldiscard", "allkeep", "hybrid"])
def test_two_extensions_each_strip_only_what_they_added(composed_rollouts, order, mode):
  tokenizer, made = composed_rollouts
  extensions, ext, rollouts = made[order]
  combos = {("hint" in r.added, "experience" in r.added) for r in rollouts}
  assert combos == {(True, True), (True, False), (False, True), (False, False)}  # every combination is here
  ext.train_sample_mode = mode
  mode_of = ext.sample_modes(0, rollouts)
  assert set(mode_of.values()) == {"alldiscard": {"discard"}, "allkeep": {"keep"},
                                   "hybrid": {"keep", "discard"}}[mode]
  trained = extensions_lib.training_rollouts(extensions, 0, list(rollouts), tokenizer)
  # The loop's order of the extensions does not change what trains, and synthetic tasks (which add nothing to
  # openings, as gin_configs/runs/agentevolver.gin composes them) change nothing either.
  for others in (list(reversed(extensions)), [SyntheticTasks(), *extensions], [*extensions, SyntheticTasks()]):
    again = extensions_lib.training_rollouts(others, 0, list(rollouts), tokenizer)
    assert [list(t.token_ids) for t in again] == [list(t.token_ids) for t in trained]
  batch = batching.batch_trajectories(trained, tokenizer, buckets=(1024, 2048))
  kept = 0
  for row, (r, t) in enumerate(zip(rollouts, trained)):
    keeps_experience = "experience" in r.added and mode_of[r.group] == "keep"
    stripped_any = "hint" in r.added or ("experience" in r.added and not keeps_experience)
    prompt = tokenizer.decode(list(t.token_ids[:t.prompt_len]))
    assert ("<EXP>" in prompt) == keeps_experience, (order, mode, row)  # experience: as the sample mode says
    assert HINT.strip() not in prompt  # the hint: always stripped, by its own extension
    assert set(t.added) == (set(ext.added_keys) if keeps_experience else set())
    assert (t.experience.get("exp_mask") == 1) == stripped_any
    expected = batch["loss_mask"][row] if stripped_any else np.zeros_like(batch["loss_mask"][row])
    np.testing.assert_array_equal(batch["exp_mask"][row], expected)  # off-policy exactly where text was removed
    np.testing.assert_array_equal(t.token_ids[t.prompt_len:], r.token_ids[r.prompt_len:])  # sampled: as sampled
    kept += keeps_experience
  assert ext.after_step(0, rollouts)["trained_with"] == kept
  assert kept == (0 if mode == "alldiscard" else sum("experience" in r.added for r in rollouts
                                                     if mode_of[r.group] == "keep"))


def test_the_grpo_update_logs_on_and_off_policy_losses(step_rollouts, tmp_path):
  tokenizer, ext, rollouts = step_rollouts
  rollouts = [dataclasses.replace(r, reward=float(r.sample % 2)) for r in rollouts]  # advantages within groups
  trained = ext.training_rollouts(0, rollouts, tokenizer)
  from evolver.models import ModelConfig, make_model
  model = make_model(ModelConfig(vocab_size=2432, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                 intermediate_size=64), seed=0)
  import jax
  trainer = Trainer(str(tmp_path), model, optimizer_lib.make_optimizer(10), rl.het_ppo_loss_fn,
                    config=TrainerConfig(async_checkpoint=False), devices=jax.devices()[:1])
  row = rl.grpo_update(trainer, trainer.policy_params(), trained, tokenizer, advantage_fn=advantages.grpo_turn_advantages,
                       buckets=(1024, 2048), ppo_epochs=1, num_minibatches=1, rng=np.random.default_rng(0))
  trainer.close()
  assert row["exp_tokens"] > 0 and 0 < row["off_policy_fraction"] < 1
  assert np.isfinite(row["pg_loss_on"]) and np.isfinite(row["pg_loss_off"]) and row["pg_loss_off"] != 0
