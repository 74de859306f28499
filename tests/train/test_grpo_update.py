"""What a real-model GRPO step needs: float32 master weights under bf16 compute, bf16 copies for sampling and the
frozen reference (sharded like the policy), minibatches padded to split over the data-parallel devices, groups
without a baseline left out, and the chunked LM-head path equal to full logits.

  python -m pytest tests/train/test_grpo_update.py -q
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evolver import runtime
from evolver.data import batching
from evolver.models import ModelConfig, make_model, sharding
from evolver.models.tokenizer import load_tokenizer
from evolver.rollout import RolloutConfig, RolloutEngine, Task
from evolver.train import advantages, rl
from evolver.train import optimizer as optimizer_lib
from evolver.train import step as step_lib
from evolver.train.trainer import Trainer, TrainerConfig
from tests.rollout.tiny_policy import tiny_model, tiny_sampler

SMALL = ModelConfig(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)


def bf16(config):
  return dataclasses.replace(config, param_dtype="bfloat16", dtype="bfloat16")


def sft_batch(seed=0, rows=8, length=32):
  rng = np.random.default_rng(seed)
  mask = np.ones([rows, length], np.float32)
  mask[:, 0] = 0
  return {"input_ids": rng.integers(0, SMALL.vocab_size, size=(rows, length)).astype(np.int32), "loss_mask": mask}


def one_step_delta(config, lr, tmp_path):
  # make_model draws float32 values and casts them to param_dtype: bf16 starts from the float32 values rounded.
  trainer = Trainer(str(tmp_path), make_model(config, seed=0),
                    optimizer_lib.make_optimizer(10, learning_rate=lr, warmup_steps=0, decay="constant"),
                    step_lib.sft_loss_fn, config=TrainerConfig(async_checkpoint=False), devices=jax.devices()[:1])
  before = jax.tree.map(np.asarray, trainer.state.params)
  trainer.train_step(sft_batch())
  after = jax.tree.map(np.asarray, trainer.state.params)
  trainer.close()
  return jax.tree.map(lambda a, b: (a - b).astype(np.float64), after, before), after


def test_bf16_compute_at_lr_1e_6_moves_the_weights_like_float32(tmp_path):
  # Master weights stay float32: a 1e-6 update on a weight of ~0.02 is below bf16's resolution there (~1e-4), so
  # bf16 master weights would not move at all.
  delta_32, _ = one_step_delta(SMALL, 1e-6, tmp_path / "f32")
  delta_16, after_16 = one_step_delta(bf16(SMALL), 1e-6, tmp_path / "bf16")
  assert all(leaf.dtype == np.float32 for leaf in jax.tree.leaves(after_16))
  d32 = np.concatenate([x.ravel() for x in jax.tree.leaves(delta_32)])
  d16 = np.concatenate([x.ravel() for x in jax.tree.leaves(delta_16)])
  assert np.abs(d32).max() == pytest.approx(1e-6, rel=0.05)  # Adam's first step: lr per weight
  assert np.mean(d16 != 0) > 0.99  # (bf16 master weights: 0.0 of them moved)
  # bf16 compute changes the gradients a little; Adam's first step is ~lr * sign(gradient) per weight.
  assert np.linalg.norm(d16 - d32) / np.linalg.norm(d32) < 0.1


def test_sampling_and_reference_copies_are_param_dtype_and_placed_like_the_policy(tmp_path):
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 fake devices")
  trainer = Trainer(str(tmp_path), make_model(bf16(SMALL), seed=0), optimizer_lib.make_optimizer(10),
                    step_lib.sft_loss_fn, config=TrainerConfig(async_checkpoint=False))
  copy = trainer.policy_params()
  for master, frozen in zip(jax.tree.leaves(trainer.state.params), jax.tree.leaves(copy)):
    assert master.dtype == jnp.float32 and frozen.dtype == jnp.bfloat16
    assert frozen.sharding == master.sharding and len(frozen.sharding.device_set) == 8
  trainer.train_step(sft_batch())  # donates the state: the copy stays valid
  assert all(np.isfinite(np.asarray(x, np.float32)).all() for x in jax.tree.leaves(copy))
  trainer.close()


# ----------------------------------------------------------------------------------------------------------
# One GRPO update on real rollouts.
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def step_rollouts():
  """Five scored rollouts (an odd number) in two groups (3 + 2) of a tiny random policy, with spread rewards."""
  tokenizer = load_tokenizer()
  model = tiny_model(tokenizer)
  with RolloutEngine(tiny_sampler(model), tokenizer) as engine:
    rolled = engine.run([Task("maze", 3), Task("sql", 4)],
                        RolloutConfig(max_new_tokens=12, max_rounds=2, temperature=1.0, num_samples=3, seed=7))
  rollouts = [dataclasses.replace(r, reward=reward)
              for r, reward in zip(rolled.trajectories[:5], (1.0, 0.0, 0.5, 0.2, 0.9))]
  return tokenizer, model, rollouts


def grpo_update(config, rollouts, tokenizer, tmp_path, *, devices, num_microbatches, lr=1e-3, max_rows=None,
                precompile=False):
  """One `rl.grpo_update` from a fresh model of `config` (bf16 starts from the float32 values rounded); returns
  (row, param deltas, step). Not the rollouts' tiny policy: its 30x-scaled head makes logits of ~100, where bf16's
  8-bit mantissa alone moves a log-probability by ~0.4. With `precompile`, the update's programs are compiled
  first for `max_rows` rows (the state must not change), and the update itself must then compile none."""
  model = make_model(config, seed=0)
  trainer = Trainer(str(tmp_path), model, optimizer_lib.make_optimizer(10, learning_rate=lr, warmup_steps=0,
                                                                       decay="constant"),
                    functools.partial(rl.het_ppo_loss_fn, kl_coef=0.01),
                    config=TrainerConfig(async_checkpoint=False, num_microbatches=num_microbatches),
                    devices=devices)
  before = jax.tree.map(lambda x: np.asarray(x, np.float64), trainer.state.params)
  ref_params = trainer.policy_params()
  log = runtime.compile_log()
  if precompile:
    rows = rl.update_rows(max_rows, 2, rl.minibatch_multiple(trainer))
    assert rl.precompile_updates(trainer, (trainer.state.params, ref_params), (512, 1024), rows=rows) == 2 * 2 + 2
    assert int(trainer.state.step) == 0
    for a, b in zip(jax.tree.leaves(trainer.state.params), jax.tree.leaves(before)):
      np.testing.assert_array_equal(np.asarray(a, np.float64), b)
  mark = log.mark()
  row = rl.grpo_update(trainer, ref_params, rollouts, tokenizer,
                       advantage_fn=advantages.grpo_turn_advantages, buckets=(512, 1024), ppo_epochs=1,
                       num_minibatches=2, rng=np.random.default_rng(0), max_rows=max_rows)
  if precompile:
    compiled = [e.fun_name for e in log.since(mark) if "traced" in e.fun_name or "_logprobs" in e.fun_name]
    assert not compiled, f"the update compiled {compiled} after its programs were precompiled"
  after = jax.tree.map(lambda x: np.asarray(x, np.float64), trainer.state.params)
  step = trainer.step
  trainer.close()
  return row, jax.tree.map(lambda a, b: a - b, after, before), step


@pytest.mark.slow
def test_a_grpo_step_on_8_devices_in_bf16_with_microbatches_equals_1_device_float32(step_rollouts, tmp_path):
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 fake devices")
  tokenizer, model, rollouts = step_rollouts
  config = dataclasses.replace(model.config, tie_embeddings=True)
  # 5 rollouts in 2 minibatches of 3 and 2 rows, each padded to 8 rows for 8-way data parallelism and 2
  # microbatches (padded only to a multiple of the minibatches, 3-row minibatches were a ValueError on 8 devices).
  assert len(rollouts) % 2 == 1
  one_row, one_delta, one_step = grpo_update(config, rollouts, tokenizer, tmp_path / "one",
                                             devices=jax.devices()[:1], num_microbatches=1)
  eight_row, eight_delta, eight_step = grpo_update(bf16(config), rollouts, tokenizer, tmp_path / "eight",
                                                   devices=jax.devices(), num_microbatches=2)
  assert one_step == eight_step == 2
  assert one_row["rollout/lone_groups"] == eight_row["rollout/lone_groups"] == 0
  for key in ("loss", "pg_loss", "kl_ref"):
    np.testing.assert_allclose(eight_row[key], one_row[key], rtol=0.05, atol=2e-3, err_msg=key)
  d1 = np.concatenate([x.ravel() for x in jax.tree.leaves(one_delta)])
  d8 = np.concatenate([x.ravel() for x in jax.tree.leaves(eight_delta)])
  assert np.linalg.norm(d8 - d1) / np.linalg.norm(d1) < 0.15


@pytest.mark.slow
def test_precompiled_updates_compile_nothing_and_pad_rows_without_changing_the_update(step_rollouts, tmp_path):
  # 5 rollouts in 2 minibatches of 3 and 2 rows: padded to 4 and 2 rows by default, to 4 and 4 with max_rows = 8
  # (`update_rows`: the rows of the largest minibatch a step of 8 rows could have), zero-mask rows that change
  # nothing but float summation order.
  tokenizer, model, rollouts = step_rollouts
  assert rl.update_rows(8, 2) == 4 and rl.update_rows(32, 4, 8) == 8 and rl.update_rows(9, 2, 1) == 8
  plain, plain_delta, _ = grpo_update(model.config, rollouts, tokenizer, tmp_path / "plain",
                                      devices=jax.devices()[:1], num_microbatches=1)
  fixed, fixed_delta, step = grpo_update(model.config, rollouts, tokenizer, tmp_path / "fixed",
                                         devices=jax.devices()[:1], num_microbatches=1, max_rows=8, precompile=True)
  assert step == 2
  for key in ("loss", "pg_loss", "kl_ref", "num_tokens"):
    np.testing.assert_allclose(fixed[key], plain[key], rtol=1e-5, atol=1e-7, err_msg=key)
  # Adam's updates (~1e-3 here) divide by the gradients' running RMS, which magnifies summation-order noise where
  # a gradient is small: seen 2e-7 on one element of 155,648 (XLA:CPU at the tests' optimisation level 0).
  for a, b in zip(jax.tree.leaves(fixed_delta), jax.tree.leaves(plain_delta)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_the_sampler_s_logprobs_stand_in_for_the_recomputed_ones_unless_a_token_is_off_policy(step_rollouts,
                                                                                             tmp_path):
  tokenizer, model, rollouts = step_rollouts

  def update(name, old_logp, rolled):
    """One update of the rollouts' own policy (a copy): the sampler's log-probabilities are this policy's."""
    trainer = Trainer(str(tmp_path / name), nnx.clone(model),
                      optimizer_lib.make_optimizer(10, learning_rate=1e-3, warmup_steps=0, decay="constant"),
                      functools.partial(rl.het_ppo_loss_fn, kl_coef=0.01),
                      config=TrainerConfig(async_checkpoint=False), devices=jax.devices()[:1])
    before = jax.tree.map(lambda x: np.asarray(x, np.float64), trainer.state.params)
    row = rl.grpo_update(trainer, trainer.policy_params(), rolled, tokenizer,
                         advantage_fn=advantages.grpo_turn_advantages, buckets=(512, 1024), ppo_epochs=1,
                         num_minibatches=2, rng=np.random.default_rng(0), old_logp=old_logp)
    delta = jax.tree.map(lambda x, b: np.asarray(x, np.float64) - b, trainer.state.params, before)
    trainer.close()
    return row, delta

  recomputed, recomputed_delta = update("recompute", "recompute", rollouts)
  reused, reused_delta = update("sampler", "sampler", rollouts)
  assert abs(recomputed["behaviour_logp_gap"]) < 1e-4  # what makes them interchangeable
  assert (recomputed["old_logp/from_sampler"], reused["old_logp/from_sampler"]) == (0.0, 1.0)
  assert "time/old_logp_s" in recomputed and "time/old_logp_s" not in reused and "behaviour_logp_gap" not in reused
  for key in ("loss", "pg_loss", "kl_ref", "approx_kl", "clipfrac", "num_tokens"):
    np.testing.assert_allclose(reused[key], recomputed[key], rtol=1e-4, atol=1e-6, err_msg=key)
  # The same update up to float noise, which Adam magnifies where a gradient is near zero (a few elements of ~1e-4
  # differ by ~5e-5: this policy's 30x head puts its logits near 100, where float32 rounding alone is ~1e-5).
  d_reused = np.concatenate([x.ravel() for x in jax.tree.leaves(reused_delta)])
  d_recomputed = np.concatenate([x.ravel() for x in jax.tree.leaves(recomputed_delta)])
  assert np.linalg.norm(d_reused - d_recomputed) / np.linalg.norm(d_recomputed) < 1e-3
  # Rolled out with experience that was stripped (exp_mask 1): HET-PPO's old log-probability is the policy's without
  # the experience, which the sampler never computed. And a bf16 sampling copy's numbers are not the float32 master
  # weights'. Either way the step recomputes.
  on_policy, one_off = np.zeros([2, 8], np.float32), np.zeros([2, 8], np.float32)
  one_off[1, 5] = 1.0
  assert rl.old_logp_from_sampler("sampler", on_policy, "float32")
  assert not rl.old_logp_from_sampler("sampler", one_off, "float32")
  assert not rl.old_logp_from_sampler("sampler", on_policy, "bfloat16")
  assert not rl.old_logp_from_sampler("recompute", on_policy, "float32")


def test_update_batches_split_over_devices_and_microbatches(tmp_path):
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 fake devices")
  trainer = Trainer(str(tmp_path), make_model(SMALL, seed=0), optimizer_lib.make_optimizer(10),
                    step_lib.sft_loss_fn, config=TrainerConfig(async_checkpoint=False, num_microbatches=2))
  assert rl.minibatch_multiple(trainer) == 8
  trainer.close()
  trainer = Trainer(str(tmp_path / "b"), make_model(SMALL, seed=0), optimizer_lib.make_optimizer(10),
                    step_lib.sft_loss_fn, config=TrainerConfig(async_checkpoint=False, num_microbatches=3,
                                                               mesh_data=2, mesh_fsdp=2, mesh_tensor=2))
  assert rl.minibatch_multiple(trainer) == 12  # lcm(4 data-parallel devices, 3 microbatches)
  trainer.close()
  batch = {"input_ids": np.ones([3, 4], np.int32), "loss_mask": np.ones([3, 4], np.float32),
           "lengths": np.full([3], 4, np.int32), "num_tokens": np.float32(12)}
  padded = batching.pad_rows(batch, 8)
  assert padded["input_ids"].shape == (8, 4) and padded["loss_mask"][3:].sum() == 0 and padded["num_tokens"] == 12
  with pytest.raises(ValueError, match="cannot pad a batch of 3 rows to 2"):
    batching.pad_rows(batch, 2)


def test_groups_without_a_baseline_train_nothing_and_are_counted(step_rollouts, tmp_path):
  tokenizer, model, rollouts = step_rollouts
  lone = rollouts[:3] + rollouts[3:4]  # the second task's other episode errored and left: a group of one
  trained, count = rl.with_peers(lone)
  assert trained == rollouts[:3] and count == 1
  row, delta, step = grpo_update(model.config, rollouts[3:4], tokenizer, tmp_path, devices=jax.devices()[:1],
                                 num_microbatches=1)
  assert row == {"rollout/lone_groups": 1} and step == 2
  assert all(not np.any(d) for d in jax.tree.leaves(delta))


def test_chunked_head_loss_equals_full_logits():
  graphdef, params = nnx.split(make_model(SMALL, seed=2))
  rng = np.random.default_rng(0)
  ids = rng.integers(0, SMALL.vocab_size, size=(4, 24)).astype(np.int32)
  mask = (rng.random(ids.shape) < 0.7).astype(np.float32)
  logp = np.asarray(rl._logprobs(graphdef, params, ids))
  batch = {"input_ids": ids, "loss_mask": mask, "exp_mask": np.zeros_like(mask),
           "advantages": rng.normal(size=ids.shape).astype(np.float32) * mask,
           "old_logp": (logp + rng.normal(0, 0.2, logp.shape)).astype(np.float32),
           "ref_logp": (logp + rng.normal(0, 0.2, logp.shape)).astype(np.float32)}

  def loss_and_grads(head_chunk_rows):
    fn = lambda p: rl.het_ppo_loss_fn(nnx.merge(graphdef, p), batch, step_lib.batch_normalizers(batch),  # noqa: E731
                                      kl_coef=0.01, head_chunk_rows=head_chunk_rows)
    return jax.jit(jax.value_and_grad(fn, has_aux=True))(params)

  (loss_full, _), grads_full = loss_and_grads(None)
  (loss_chunked, _), grads_chunked = loss_and_grads(16)
  np.testing.assert_allclose(float(loss_chunked), float(loss_full), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grads_full), jax.tree.leaves(grads_chunked)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5)
  np.testing.assert_allclose(np.asarray(rl._logprobs(graphdef, params, ids, 16)), logp, atol=1e-5)
  with pytest.raises(ValueError, match="entropy bonus needs the full logits"):
    rl.het_ppo_loss_fn(nnx.merge(graphdef, params), batch, step_lib.batch_normalizers(batch), entropy_coeff=0.1,
                       head_chunk_rows=16)


def test_scoring_on_the_trainer_mesh_splits_its_rows_and_equals_one_device():
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 fake devices")
  graphdef, params = nnx.split(make_model(SMALL, seed=2))
  ids = np.random.default_rng(1).integers(0, SMALL.vocab_size, size=(8, 24)).astype(np.int32)
  alone = np.asarray(rl._logprobs(graphdef, params, ids))
  mesh = sharding.make_mesh(data=2, fsdp=4)
  placed = jax.device_put(params, sharding.state_shardings(params, mesh))
  split = rl._logprobs(graphdef, placed, ids, None, mesh)
  assert split.sharding.spec[0] == ("data", "fsdp")  # each device scored its share of the rows
  np.testing.assert_allclose(np.asarray(split), alone, atol=1e-5)
  batch = {"input_ids": ids, "loss_mask": np.ones(ids.shape, np.float32), "lengths": np.full(8, 24)}
  np.testing.assert_allclose(rl.behaviour_logprobs(graphdef, placed, batch, (24,), 2, mesh=mesh), alone, atol=1e-5)


class _RecordingTrainer:
  """What `ppo_updates` uses of a Trainer (its mesh, microbatches and train_step), recording each update's batch."""

  def __init__(self):
    self.mesh = type("Mesh", (), {"shape": {"data": 1, "fsdp": 1}})()
    self.config = TrainerConfig(async_checkpoint=False)
    self.batches = []

  def train_step(self, batch):
    self.batches.append(batch)
    return {"loss": jnp.float32(0.0)}


@pytest.mark.parametrize("order", ["random", "length"])
def test_minibatches_cover_every_row_once_at_few_shapes(order):
  """Each pass covers every real row exactly once; "length" puts rows of similar length together (each minibatch a
  contiguous range of the sorted lengths) so short ones train at a short bucket; rows pad to a power of two."""
  lengths = np.array([30, 500, 120, 90, 1900, 60, 700, 1500, 40, 300, 1000, 80, 25, 2000, 100, 640], np.int32)
  rows = len(lengths)
  batch = {k: np.zeros([rows, 2048], np.float32) for k in rl.RL_KEYS}
  batch["input_ids"] = np.tile(np.arange(1, rows + 1, dtype=np.int32)[:, None], (1, 2048))  # row r holds id r + 1
  batch["lengths"] = lengths
  for r, n in enumerate(lengths):
    batch["loss_mask"][r, :n] = 1.0
  trainer = _RecordingTrainer()
  rl.ppo_updates(trainer, batch, (128, 512, 1024, 2048), epochs=2, num_minibatches=3,
                 rng=np.random.default_rng(0), minibatch_order=order)
  assert len(trainer.batches) == 6
  for epoch in (trainer.batches[:3], trainer.batches[3:]):
    seen = [int(i) - 1 for b in epoch for i in b["input_ids"][:, 0] if i > 0]
    assert sorted(seen) == list(range(rows))
    assert all(b["input_ids"].shape[0] in (4, 8) for b in epoch)  # 5 or 6 rows, padded to 8
  widths = sorted(b["input_ids"].shape[1] for b in trainer.batches[:3])
  if order == "length":
    ranges = sorted((lengths[[int(i) - 1 for i in b["input_ids"][:, 0] if i > 0]].min(),
                     lengths[[int(i) - 1 for i in b["input_ids"][:, 0] if i > 0]].max()) for b in trainer.batches[:3])
    assert all(hi < lo_next for (_, hi), (lo_next, _) in zip(ranges, ranges[1:]))  # disjoint length ranges
    assert widths == [128, 1024, 2048]
  with pytest.raises(ValueError, match="minibatch_order"):
    rl.ppo_updates(trainer, batch, (2048,), epochs=1, num_minibatches=2, rng=np.random.default_rng(0),
                   minibatch_order="sorted")
