"""The train step: loss falls; 8 fake devices equal 1 device; microbatch accumulation equals the full batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from evolver.models import ModelConfig, make_model, sharding
from evolver.train import optimizer as optimizer_lib
from evolver.train import state as state_lib
from evolver.train import step as step_lib

CONFIG = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
LR = 1e-2


def make_batch(seed=0, batch=8, length=16):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, CONFIG.vocab_size, size=(batch, length)).astype(np.int32)
  mask = (rng.random((batch, length)) < 0.7).astype(np.float32)
  mask[:, 0] = 0
  weights = rng.random(batch).astype(np.float32)
  return {"input_ids": ids, "loss_mask": mask, "weights": weights}


def fresh_state(seed=1):
  graphdef, params = nnx.split(make_model(CONFIG, seed=seed))
  opt = optimizer_lib.make_optimizer(100, learning_rate=LR, warmup_steps=0, decay="constant")
  return graphdef, opt, state_lib.create_train_state(params, opt, seed=0)


def run_steps(mesh, n=3, num_microbatches=1):
  graphdef, opt, state = fresh_state()
  shardings = step_lib.state_shardings(state, mesh)
  state = jax.device_put(state, shardings)
  step = step_lib.TrainStepPrograms(graphdef, step_lib.sft_loss_fn, opt, mesh, shardings,
                                    num_microbatches=num_microbatches)
  history = []
  for i in range(n):
    state, metrics = step(state, make_batch(i))
    history.append(jax.device_get(metrics))
  return state, history


def test_a_step_compiled_ahead_of_time_runs_as_the_one_compiled_on_first_call():
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  graphdef, opt, state = fresh_state()
  shardings = step_lib.state_shardings(state, mesh)
  lazy, ahead = (step_lib.TrainStepPrograms(graphdef, step_lib.sft_loss_fn, opt, mesh, shardings) for _ in "ab")
  batch = make_batch(0)
  spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
  state_a = jax.device_put(state, shardings)
  before = jax.tree.map(np.asarray, state_a.params)
  assert ahead.precompile(state_a, spec) and not ahead.precompile(state_a, spec)  # the second: compiled already
  assert ahead.num_programs == 1 and not any(x.is_deleted() for x in jax.tree.leaves(state_a))  # nothing ran
  for a, b in zip(jax.tree.leaves(state_a.params), jax.tree.leaves(before)):
    np.testing.assert_array_equal(np.asarray(a), b)
  state_a, metrics_a = ahead(state_a, batch)
  state_b, metrics_b = lazy(jax.device_put(fresh_state()[2], shardings), batch)  # (a's donation took `state`)
  assert float(metrics_a["loss"]) == float(metrics_b["loss"])
  for a, b in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(TypeError):  # an executable serves its own shapes only; other shapes get their own program
    ahead._programs[ahead._key(spec)](state_a, make_batch(1, length=8))
  state_a, _ = ahead(state_a, make_batch(1, length=8))
  assert ahead.num_programs == 2 and int(state_a.step) == 2


def test_loss_falls_on_a_repeated_batch():
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  graphdef, opt, state = fresh_state()
  shardings = step_lib.state_shardings(state, mesh)
  step = step_lib.TrainStepPrograms(graphdef, step_lib.sft_loss_fn, opt, mesh, shardings)
  state = jax.device_put(state, shardings)
  losses = []
  for _ in range(15):
    state, metrics = step(state, make_batch(0))
    losses.append(float(metrics["loss"]))
  assert losses[-1] < 0.7 * losses[0]
  assert int(state.step) == 15


def test_eight_devices_equal_one_device():
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 fake devices")
  one_state, one_hist = run_steps(sharding.make_mesh(devices=jax.devices()[:1]))
  eight_state, eight_hist = run_steps(sharding.make_mesh(data=2, fsdp=2, tensor=2))
  qkv = eight_state.params["layers"][0]["attn"]["qkv"].get_value()
  assert qkv.sharding.spec == P("fsdp", "tensor", None, None)
  moments = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(eight_state.opt_state)
             if "qkv" in jax.tree_util.keystr(path) and "[0]" in jax.tree_util.keystr(path)]
  assert len(moments) >= 2 and all(m.sharding.spec == P("fsdp", "tensor", None, None) for m in moments)
  for a, b in zip(one_hist, eight_hist):
    np.testing.assert_allclose(b["loss"], a["loss"], atol=1e-5)
    np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], atol=1e-5, rtol=1e-5)
  # Parameters after the updates: within a tolerance scaled by the learning rate (Adam divides by sqrt(v), so
  # reduction-order noise in tiny gradients can move a parameter by up to ~lr per step).
  for p1, p8 in zip(jax.tree.leaves(one_state.params), jax.tree.leaves(eight_state.params)):
    np.testing.assert_allclose(np.asarray(p8), np.asarray(p1), atol=3 * LR * 1e-2, rtol=0)


def test_gradients_equal_across_meshes():
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 fake devices")
  graphdef, opt, state = fresh_state()
  batch = make_batch(3)

  def grads_on(mesh):
    params = jax.device_put(state.params, sharding.state_shardings(state.params, mesh))

    @jax.jit
    def g(p, b):
      with sharding.activate(mesh):
        return jax.grad(lambda q: step_lib.sft_loss_fn(nnx.merge(graphdef, q), b, step_lib.batch_normalizers(b))[0])(p)
    return g(params, batch)

  g1 = grads_on(sharding.make_mesh(devices=jax.devices()[:1]))
  g8 = grads_on(sharding.make_mesh(data=2, fsdp=2, tensor=2))
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g8)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=0)


def test_microbatches_equal_full_batch():
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  full_state, full_hist = run_steps(mesh, n=2, num_microbatches=1)
  micro_state, micro_hist = run_steps(mesh, n=2, num_microbatches=4)
  for a, b in zip(full_hist, micro_hist):
    np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5)
    np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-4)
    np.testing.assert_allclose(b["nll"], a["nll"], rtol=1e-5)
    assert b["num_tokens"] == a["num_tokens"]
  for p1, p2 in zip(jax.tree.leaves(full_state.params), jax.tree.leaves(micro_state.params)):
    np.testing.assert_allclose(np.asarray(p2), np.asarray(p1), atol=1e-4)


def test_step_learns_to_copy_through_attention():
  """The whole spine (causal attention, RoPE, backward, AdamW) learns an induction copy: random tokens, a
  separator, the same tokens again with the loss on the copy. Chance is ln(V) nats per token; a step that
  cannot route information through attention stays near the unigram loss, which is the same."""
  config = ModelConfig(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                       intermediate_size=128)
  graphdef, params = nnx.split(make_model(config, seed=0))
  opt = optimizer_lib.make_optimizer(300, learning_rate=3e-3, warmup_steps=20)
  state = state_lib.create_train_state(params, opt, seed=0)
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  shardings = step_lib.state_shardings(state, mesh)
  step = step_lib.TrainStepPrograms(graphdef, step_lib.sft_loss_fn, opt, mesh, shardings)
  state = jax.device_put(state, shardings)
  rng = np.random.default_rng(0)
  n, sep = 8, 1

  def copy_batch():
    a = rng.integers(2, config.vocab_size, (32, n))
    ids = np.concatenate([a, np.full((32, 1), sep), a], axis=1).astype(np.int32)
    mask = np.zeros(ids.shape, np.float32)
    mask[:, n + 1:] = 1.0
    return {"input_ids": ids, "loss_mask": mask}

  losses = []
  for _ in range(300):
    state, metrics = step(state, copy_batch())
    losses.append(float(metrics["loss"]))
  assert losses[0] > 0.8 * np.log(config.vocab_size)
  assert np.mean(losses[-10:]) < 0.1, losses[::20]


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                      "seq-mean-token-sum-norm"])
def test_het_ppo_microbatches_equal_the_whole_batch_in_every_aggregation_mode(agg_mode):
  # Every mode divides by a count of the whole batch (tokens, or sequences with a loss token), so microbatch losses
  # and gradients add up to the whole batch's: the KL term keeps its weight, and pg_loss is logged once, not M times.
  import functools
  from evolver.train import rl
  graphdef, params = nnx.split(make_model(CONFIG, seed=1))
  rng = np.random.default_rng(4)
  batch = make_batch(4)
  del batch["weights"]
  batch["loss_mask"][5] = 0.0  # a row with no loss token: not a sequence of the mean
  logp = np.asarray(rl._logprobs(graphdef, params, batch["input_ids"]))
  batch.update(exp_mask=(rng.random(logp.shape) < 0.3).astype(np.float32),
               advantages=np.repeat(rng.normal(size=(8, 1)), 16, axis=1).astype(np.float32) * batch["loss_mask"],
               old_logp=(logp + rng.normal(0, 0.3, logp.shape)).astype(np.float32),
               ref_logp=(logp + rng.normal(0, 0.3, logp.shape)).astype(np.float32))
  loss_fn = functools.partial(rl.het_ppo_loss_fn, agg_mode=agg_mode, norm_len=16.0, kl_coef=0.1)
  opt = optimizer_lib.make_optimizer(10, learning_rate=1e-3, warmup_steps=0, decay="constant")
  out = {}
  for micro in (1, 4):
    step = jax.jit(functools.partial(step_lib.train_step, graphdef=graphdef, loss_fn=loss_fn, optimizer=opt,
                                     num_microbatches=micro))
    state, metrics = step(state_lib.create_train_state(params, opt, seed=0), batch)
    out[micro] = (jax.device_get(metrics), state.params)
  whole, micro = out[1][0], out[4][0]
  for key in ("loss", "pg_loss", "kl_ref", "grad_norm"):
    np.testing.assert_allclose(micro[key], whole[key], rtol=1e-5, err_msg=key)
  for a, b in zip(jax.tree.leaves(out[1][1]), jax.tree.leaves(out[4][1])):  # Adam: float noise in tiny gradients
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-4)  # moves a parameter by < 10% of lr
