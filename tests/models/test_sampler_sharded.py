"""The sampler on a mesh of 8 fake CPU devices against the sampler on one device: the same tokens (greedy and sampled
with fixed keys, through `generate` and continuous batching), log-probabilities within float rounding, weights and
KV cache really sharded, and no weight or cache gathered inside the decode loop.

Max abs log-prob differences observed against one device: float32 7e-7 on every mesh (checked at 1e-5); bfloat16
weights and compute 6e-6 on the scaled-embedding model (checked at 1e-2).

  python -m pytest tests/models/test_sampler_sharded.py -q
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from evolver.models import ModelConfig, make_model, sharding
from evolver.models.sampler import Sampler, SamplingParams, _split_params, row_key_data
from tests.models.test_sampler import STOP, _continuous_two_turns

CONFIG = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                     max_position_embeddings=256)
PROMPTS = [[3, 4, 5], [6, 7], [8, 9, 10, 11], [12], [13, 14, 15, 16, 17, 18], [1, 2], [30],
           list(range(20, 41))]
SECOND = [[20, 21], [22], [23, 24, 25], [26, 27], [28], [29, 30, 31], [32], [33, 34]]
MESHES = {"data4_tensor2": dict(data=4, fsdp=1, tensor=2), "fsdp8": dict(data=1, fsdp=8, tensor=1),
          "data2_fsdp2_tensor2": dict(data=2, fsdp=2, tensor=2)}
SAMPLERS = dict(attention_block=16, chunk_bucket=4, max_length=128)


@pytest.fixture(scope="module", autouse=True)
def eight_devices():
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 (fake) devices: XLA_FLAGS=--xla_force_host_platform_device_count=8")


@pytest.fixture(scope="module")
def model():
  """Unscaled weights: a spread-out next-token distribution, so sampled rows vary."""
  return make_model(CONFIG, seed=1)


@pytest.fixture(scope="module")
def one(model):
  return Sampler(model, **SAMPLERS)


@pytest.fixture(scope="module")
def samplers_on_mesh(model):
  """A mesh's name -> its sampler, made once (its compiled programs serve every test on that mesh)."""
  made = {}

  def on_mesh(name):
    if name not in made:
      made[name] = Sampler(model, mesh=sharding.make_mesh(**MESHES[name]), **SAMPLERS)
    return made[name]

  return on_mesh


def assert_same_generation(a, b, atol=1e-5):
  assert a.tokens == b.tokens
  for x, y in zip(a.logprobs, b.logprobs):
    np.testing.assert_allclose(y, x, atol=atol, rtol=0)
  np.testing.assert_array_equal(a.stopped, b.stopped)
  np.testing.assert_array_equal(a.session.lengths, b.session.lengths)


# Sampled on every mesh; greedy (the same programs, argmax in place of the draw) on one.
@pytest.mark.parametrize("mesh, temperature", [("data4_tensor2", 0.0), *[(name, 1.0) for name in MESHES]],
                         ids=["data4_tensor2-greedy", *[f"{name}-sampled" for name in MESHES]])
def test_generate_on_a_mesh_equals_one_device(one, samplers_on_mesh, mesh, temperature):
  """Three turns (the cache kept between them) of 12 ragged rows in a batch of 16, stopping at different steps
  (sampled: the live rows move to a batch of 8 midway), the third on 4 rows selected from the session."""
  on_mesh = samplers_on_mesh(mesh)
  prompts, second = PROMPTS + [[40 + i, 41] for i in range(4)], SECOND + [[50 + i] for i in range(4)]
  params = SamplingParams(max_new_tokens=20, temperature=temperature, stop_ids=(STOP, 9, 17))
  first = one.generate(prompts, params, seed=3)
  calls = on_mesh.stats.decode_calls
  first_8 = on_mesh.generate(prompts, params, seed=3)
  assert_same_generation(first, first_8)
  assert len({len(t) for t in first.tokens}) > 1  # rows stop at different steps
  if temperature:
    assert on_mesh.stats.decode_calls - calls == 2  # decoded on in a compacted batch
  then = one.generate(second, params, seed=4, session=first.session)
  then_8 = on_mesh.generate(second, params, seed=4, session=first_8.session)
  assert_same_generation(then, then_8)
  kept = [0, 2, 5, 11]
  last = one.generate([[60]] * 4, params, seed=5, session=one.select(then.session, kept))
  last_8 = on_mesh.generate([[60]] * 4, params, seed=5, session=on_mesh.select(then_8.session, kept))
  assert_same_generation(last, last_8)


@pytest.mark.parametrize("mesh", list(MESHES))
def test_continuous_batching_on_a_mesh_equals_one_device(one, samplers_on_mesh, mesh):
  """Rows begin their second turn while others decode their first, and the slots are repacked midway."""
  on_mesh = samplers_on_mesh(mesh)
  params = SamplingParams(max_new_tokens=16, temperature=1.0, stop_ids=(STOP, 9, 17))
  keys1, keys2 = row_key_data(7, 8), row_key_data(8, 8)
  turns = _continuous_two_turns(one, PROMPTS, SECOND, params, keys1, keys2, repack_at=3)
  turns_8 = _continuous_two_turns(on_mesh, PROMPTS, SECOND, params, keys1, keys2, repack_at=3)
  for row in range(len(PROMPTS)):
    for (tokens, logprobs, stopped), (tokens_8, logprobs_8, stopped_8) in zip(turns[row], turns_8[row]):
      assert tokens_8 == tokens and stopped_8 == stopped
      np.testing.assert_allclose(logprobs_8, logprobs, atol=1e-5, rtol=0)


def _all_gathers(hlo: str) -> list[int]:
  """The element count of the largest array each all-gather of a compiled HLO module's text returns (one array, or
  a tuple of them when XLA combined several)."""
  sizes = []
  for line in hlo.splitlines():
    op = re.search(r" all-gather(-start)?\(", line)
    if op is None or " = " not in line[:op.start()]:
      continue
    result = line[line.index(" = ") + 3:op.start()]
    shapes = re.findall(r"\w+\[([\d,]*)\]", result)
    assert shapes, line
    sizes.append(max(int(np.prod([int(d) for d in dims.split(",") if d])) for dims in shapes))
  return sizes


def test_weights_and_cache_are_sharded_and_decode_gathers_neither(model):
  """data=4 x tensor=2: weights split over tensor only (KV heads, query heads, MLP, vocabulary; nothing over the
  data axes), the cache by rows over data and by KV heads over tensor, every slot state's row axis over data. The
  compiled decode program gathers only per-token values (new keys and values, sampled tokens), nothing as large
  as the smallest weight shard or a cache block."""
  mesh = sharding.make_mesh(data=4, fsdp=1, tensor=2)
  sampler = Sampler(model, mesh=mesh, **SAMPLERS)
  attn, mlp = sampler.params["layers"][0]["attn"], sampler.params["layers"][0]["mlp"]
  assert attn["qkv"].get_value().sharding.spec == P(None, "tensor", None, None)
  assert attn["o"].get_value().sharding.spec == P("tensor", None, None)
  assert mlp["gate_up"].get_value().sharding.spec == P(None, None, "tensor")
  assert mlp["down"].get_value().sharding.spec == P("tensor", None)
  assert sampler.params["embed"].get_value().sharding.spec == P("tensor", None)
  assert attn["qkv"].get_value().addressable_shards[0].data.shape == (32, 1, 4, 8)

  params = SamplingParams(max_new_tokens=8, temperature=1.0)
  slots = sampler.open_slots(8, params)
  slots = sampler.begin_turns(slots, range(8), PROMPTS, row_key_data(1, 8), new_rows=range(8))
  state = slots.state
  for buffer in state.cache.keys + state.cache.values:
    assert buffer.sharding.is_equivalent_to(NamedSharding(mesh, P("data", "tensor", None, None)), 4)
    assert buffer.addressable_shards[0].data.shape == (2, 1, 128, 8)
  assert state.cache.lengths.sharding.is_equivalent_to(NamedSharding(mesh, P("data")), 1)
  for rows in (state.tokens, state.logprobs, state.row_keys):
    assert rows.sharding.is_equivalent_to(NamedSharding(mesh, P("data", None)), 2)

  static, knobs = _split_params(params)
  hlo = sampler._decode_slots.lower(sampler.params, state, slots.open, np.int32(1), knobs,
                                    static=static).compile().as_text()
  smallest_weight_shard = min(int(np.prod(x.addressable_shards[0].data.shape))
                              for x in jax.tree.leaves(sampler.params) if x.ndim > 1)
  cache_block = 2 * 1 * SAMPLERS["attention_block"] * 8  # rows x KV heads x slots x head_dim of one shard
  gathers = _all_gathers(hlo)
  assert gathers and max(gathers) < min(smallest_weight_shard, cache_block)
  slots, _ = sampler.decode_slots(slots, until=8)
  assert slots.state.cache.keys[0].sharding == state.cache.keys[0].sharding


def test_weights_placed_for_training_are_placed_for_sampling(model, one):
  """A Trainer's weights (DEFAULT_RULES: embed over fsdp) bring their mesh; the sampler re-places them tensor-
  parallel only (the fsdp split gathered once, here) and samples what one device samples; `update_params` does the
  same for the next weights."""
  mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2)
  graphdef, state = nnx.split(model)
  trained, _ = sharding.place(state, mesh)
  assert trained["embed"].get_value().sharding.spec == P("tensor", "fsdp")
  sampler = Sampler(nnx.merge(graphdef, trained), **SAMPLERS)
  assert sampler.mesh is mesh
  assert sampler.params["embed"].get_value().sharding.spec == P("tensor", None)
  params = SamplingParams(max_new_tokens=12, temperature=0.0)
  assert_same_generation(one.generate(PROMPTS, params), sampler.generate(PROMPTS, params))
  sampler.update_params(sharding.place(state, mesh)[0])
  assert sampler.params["layers"][1]["mlp"]["down"].get_value().sharding.spec == P("tensor", None)
  assert_same_generation(one.generate(PROMPTS, params), sampler.generate(PROMPTS, params))


def test_bfloat16_weights_on_a_mesh_sample_what_one_device_samples():
  """bfloat16 weights and compute (what `Trainer.policy_params` gives the sampler on accelerators), greedy, on a
  widely separated distribution (the embedding scaled): the same tokens, log-probs within bfloat16 rounding."""
  config = dataclasses.replace(CONFIG, param_dtype="bfloat16", dtype="bfloat16")
  model = make_model(config, seed=0)
  model.embed.set_value(model.embed.get_value() * 30.0)
  params = SamplingParams(max_new_tokens=16, temperature=0.0)
  single = Sampler(model, **SAMPLERS).generate(PROMPTS, params)
  sampler = Sampler(model, mesh=sharding.make_mesh(data=4, fsdp=1, tensor=2), **SAMPLERS)
  assert sampler.params["embed"].get_value().dtype == jnp.bfloat16
  out = sampler.generate(PROMPTS, params)
  assert out.session.cache.keys[0].dtype == jnp.bfloat16
  assert_same_generation(single, out, atol=1e-2)


@pytest.mark.slow
def test_precompiled_slot_programs_on_a_mesh_leave_nothing_to_compile(model):
  """`precompile_slots` on a mesh of 8: afterwards continuous batching (turns begun on any number of rows, long
  chunks in pieces, rows repacked) compiles nothing."""
  s = Sampler(model, mesh=sharding.make_mesh(data=2, fsdp=2, tensor=2), attention_block=16, chunk_bucket=8,
              prefill_piece=16, max_length=128)
  params = SamplingParams(max_new_tokens=10, temperature=1.0, stop_ids=(STOP, 9, 17))
  s.precompile_slots(5, params, min_rows=2, repack_fraction=2)
  before = dataclasses.replace(s.stats)
  prompts = [list(range(3, 3 + n)) for n in (2, 9, 20, 5, 33)]
  turns = _continuous_two_turns(s, prompts, [[20, 21]] * 5, params, row_key_data(1, 5), row_key_data(2, 5))
  assert all(len(t) == 2 for t in turns.values())
  assert s.stats.minus(before).compiles == 0
