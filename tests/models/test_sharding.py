"""The same forward and gradient on one device and on a data x fsdp x tensor mesh of 8 fake CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from evolver.models import ModelConfig, make_model
from evolver.models import sharding

CONFIG = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)


def next_token_loss(graphdef, state, ids):
  logits = nnx.merge(graphdef, state)(ids)
  logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))


def build_step(graphdef, mesh, state_shardings):
  """A jitted SGD step (loss, grads, updated state) with explicit shardings and the state donated."""

  def step(state, ids):
    with sharding.activate(mesh):
      loss, grads = jax.value_and_grad(lambda s: next_token_loss(graphdef, s, ids))(state)
    new_state = jax.tree.map(lambda p, g: p - 0.1 * g, state, grads)
    return loss, grads, new_state

  if mesh is None:
    return jax.jit(step, donate_argnums=0)
  replicated = NamedSharding(mesh, P())
  return jax.jit(step, in_shardings=(state_shardings, sharding.batch_sharding(mesh)),
                 out_shardings=(replicated, state_shardings, state_shardings), donate_argnums=0)


@pytest.fixture(scope="module")
def setup():
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 (fake) devices: XLA_FLAGS=--xla_force_host_platform_device_count=8")
  graphdef, state = nnx.split(make_model(CONFIG, seed=1))
  ids = np.random.default_rng(0).integers(0, CONFIG.vocab_size, size=(8, 12)).astype(np.int32)
  return graphdef, state, ids


def test_mesh_sizes_and_rest():
  mesh = sharding.make_mesh(data=2, fsdp=-1, tensor=2)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  with pytest.raises(ValueError, match="needs 12 devices"):
    sharding.make_mesh(data=3, fsdp=2, tensor=2)
  with pytest.raises(ValueError, match="at most one mesh axis may be -1"):
    sharding.make_mesh(data=-1, fsdp=-1)
  with pytest.raises(KeyError, match="has no sharding rule"):
    sharding.logical_to_spec(("nonsense",))


def test_sharded_forward_and_gradient_match_single_device(setup):
  graphdef, state, ids = setup
  one = jax.devices()[0]
  state_1 = jax.device_put(state, one)
  single_fwd = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))(state_1, ids)
  loss_1, grads_1, new_1 = build_step(graphdef, None, None)(jax.tree.map(jnp.copy, state_1), jax.device_put(ids, one))

  mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
  placed, shardings = sharding.place(state, mesh)
  # The parameters really are sharded.
  qkv = placed["layers"][0]["attn"]["qkv"].get_value()
  assert qkv.sharding.spec == P("fsdp", "tensor", None, None)
  assert qkv.addressable_shards[0].data.shape == (16, 1, 4, 8)
  assert placed["embed"].get_value().sharding.spec == P("tensor", "fsdp")
  assert placed["layers"][1]["mlp"]["down"].get_value().sharding.spec == P("tensor", "fsdp")

  fwd = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x), in_shardings=(shardings, sharding.batch_sharding(mesh)),
                out_shardings=sharding.named_sharding(mesh, ("batch", "length", "act_vocab")))
  with sharding.activate(mesh):
    sharded_fwd = fwd(placed, ids)
  np.testing.assert_allclose(np.asarray(sharded_fwd), np.asarray(single_fwd), atol=1e-5, rtol=0)

  loss_8, grads_8, new_8 = build_step(graphdef, mesh, shardings)(placed, ids)
  assert placed["embed"].get_value().is_deleted()  # donated
  np.testing.assert_allclose(float(loss_8), float(loss_1), atol=1e-5, rtol=0)
  flat_1 = jax.tree.leaves(grads_1)
  flat_8 = jax.tree.leaves(grads_8)
  assert len(flat_1) == len(flat_8) > 0
  for g1, g8 in zip(flat_1, flat_8):
    np.testing.assert_allclose(np.asarray(g8), np.asarray(g1), atol=1e-5, rtol=0)
  for p1, p8 in zip(jax.tree.leaves(new_1), jax.tree.leaves(new_8)):
    np.testing.assert_allclose(np.asarray(p8), np.asarray(p1), atol=1e-5, rtol=0)
  assert new_8["layers"][0]["attn"]["qkv"].get_value().sharding.spec == P("fsdp", "tensor", None, None)
