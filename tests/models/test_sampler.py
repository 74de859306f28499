"""The KV-cache sampler against full recomputation without a cache."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evolver.models import ModelConfig, make_model, sharding
from evolver.models.sampler import Sampler, SamplingParams, filter_logits, fold_in_rows, row_key_data

CONFIG = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64,
                     max_position_embeddings=256)
STOP = 5


@pytest.fixture(scope="module")
def model():
  m = make_model(CONFIG, seed=0)
  # A scaled (tied) embedding separates logits widely, so float noise cannot flip a greedy tie.
  m.embed.set_value(m.embed.get_value() * 30.0)
  return m


@pytest.fixture(scope="module")
def sampler(model):
  return Sampler(model, attention_block=16, chunk_bucket=4, max_length=128)


@pytest.fixture(scope="module")
def flat_model():
  """Unscaled weights: a spread-out next-token distribution, so sampled rows vary (the scaled model's barely do)."""
  return make_model(CONFIG, seed=1)


@pytest.fixture(scope="module")
def flat_sampler(flat_model):
  return Sampler(flat_model, attention_block=16, chunk_bucket=4, max_length=128)


REF_LEN = 128


@jax.jit
def _padded_logprobs(graphdef_and_params, ids):
  model = nnx.merge(*graphdef_and_params)
  return jax.nn.log_softmax(model(ids)[0], axis=-1)


def full_logprobs(model, seq: list[int]) -> np.ndarray:
  """log-softmax `[T, V]` from a cache-free forward over the whole sequence (right-padded to one length so
  one program serves every call; causal attention makes the padding invisible)."""
  assert len(seq) <= REF_LEN
  ids = np.zeros((1, REF_LEN), np.int32)
  ids[0, :len(seq)] = seq
  return np.asarray(_padded_logprobs(nnx.split(model), ids))[:len(seq)]


def greedy_reference(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
  seq, logprobs = list(prompt), []
  for _ in range(n):
    lp = full_logprobs(model, seq)[-1]
    token = int(np.argmax(lp))
    seq.append(token)
    logprobs.append(float(lp[token]))
  return seq[len(prompt):], logprobs


def assert_logprobs_match(model, history: list[int], tokens: list[int], logprobs: np.ndarray):
  lp = full_logprobs(model, history + tokens)
  expected = [lp[len(history) - 1 + i, t] for i, t in enumerate(tokens)]
  np.testing.assert_allclose(logprobs, expected, atol=1e-4)


PROMPTS = [[1, 2, 3, 4, 9], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16, 17]]


def test_greedy_equals_full_recomputation(model, sampler):
  out = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=20, temperature=0.0))
  for prompt, tokens, logprobs in zip(PROMPTS, out.tokens, out.logprobs):
    ref_tokens, ref_logprobs = greedy_reference(model, prompt, 20)
    assert tokens == ref_tokens
    np.testing.assert_allclose(logprobs, ref_logprobs, atol=1e-4)


def test_ragged_batch_rows_equal_rows_alone(sampler):
  params = SamplingParams(max_new_tokens=12, temperature=0.0)
  together = sampler.generate(PROMPTS, params)
  for i, prompt in enumerate(PROMPTS):
    alone = sampler.generate([prompt], params)
    assert alone.tokens[0] == together.tokens[i]
    np.testing.assert_allclose(alone.logprobs[0], together.logprobs[i], atol=1e-5)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 8, 1.0), (1.3, 0, 0.9)])
def test_sampled_logprobs_are_raw_distribution(model, sampler, temperature, top_k, top_p):
  params = SamplingParams(max_new_tokens=16, temperature=temperature, top_k=top_k, top_p=top_p)
  out = sampler.generate(PROMPTS, params, seed=3)
  for prompt, tokens, logprobs in zip(PROMPTS, out.tokens, out.logprobs):
    assert len(tokens) == 16
    assert_logprobs_match(model, prompt, tokens, logprobs)


def test_fixed_seed_reproduces_and_seeds_differ(sampler):
  params = SamplingParams(max_new_tokens=16, temperature=1.5)
  a = sampler.generate(PROMPTS, params, seed=11)
  b = sampler.generate(PROMPTS, params, seed=11)
  c = sampler.generate(PROMPTS, params, seed=12)
  assert a.tokens == b.tokens
  assert a.tokens != c.tokens


def _row_keys(seed: int, rows: int) -> np.ndarray:
  """[rows, 2] uint32 raw keys, one per row, unrelated to `generate(seed=...)`'s own derivation."""
  return np.asarray(jax.random.key_data(jax.random.split(jax.random.PRNGKey(seed), rows)), np.uint32)


def test_per_row_keys_make_a_row_independent_of_the_batch(flat_sampler):
  sampler = flat_sampler
  params = SamplingParams(max_new_tokens=16, temperature=1.0)
  keys = _row_keys(5, len(PROMPTS))
  together = sampler.generate(PROMPTS, params, seed=keys)
  # Each row alone, and the rows in reverse order: the same tokens per (prompt, key).
  for i, prompt in enumerate(PROMPTS):
    alone = sampler.generate([prompt], params, seed=keys[i:i + 1])
    assert alone.tokens[0] == together.tokens[i]
    np.testing.assert_allclose(alone.logprobs[0], together.logprobs[i], atol=1e-5)
  backwards = sampler.generate(PROMPTS[::-1], params, seed=keys[::-1])
  assert backwards.tokens[::-1] == together.tokens
  # Typed keys are the same keys.
  typed = sampler.generate(PROMPTS, params, seed=jax.random.wrap_key_data(jnp.asarray(keys)))
  assert typed.tokens == together.tokens
  # The same prompt under two keys samples differently.
  twice = sampler.generate([PROMPTS[0], PROMPTS[0]], params, seed=keys[:2])
  assert twice.tokens[0] != twice.tokens[1]


def test_int_seed_and_single_key_fold_in_the_row(flat_sampler):
  sampler = flat_sampler
  params = SamplingParams(max_new_tokens=12, temperature=1.0)
  key = jax.random.PRNGKey(11)
  derived = np.asarray(jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(len(PROMPTS))))
  np.testing.assert_array_equal(row_key_data(11, len(PROMPTS)), derived)
  np.testing.assert_array_equal(fold_in_rows(np.stack([key] * 2), [0, 2]), derived[[0, 2]])
  by_int = sampler.generate(PROMPTS, params, seed=11)
  assert sampler.generate(PROMPTS, params, seed=derived).tokens == by_int.tokens
  assert sampler.generate(PROMPTS, params, seed=key).tokens == by_int.tokens
  assert sampler.generate(PROMPTS, params, seed=jax.random.key(11)).tokens == by_int.tokens


def test_position_t_draws_with_fold_in_of_the_row_key(flat_model, flat_sampler):
  model, sampler = flat_model, flat_sampler
  # The token at position t of a row is categorical(fold_in(row_key, t), logits_t), from the row's context only.
  params = SamplingParams(max_new_tokens=10, temperature=1.0)
  keys = _row_keys(2, len(PROMPTS))
  out = sampler.generate(PROMPTS, params, seed=keys)
  for prompt, row_key, tokens in zip(PROMPTS, keys, out.tokens):
    seq = list(prompt)
    for t in range(len(tokens)):
      logits = jnp.asarray(full_logprobs(model, seq)[-1])
      seq.append(int(jax.random.categorical(jax.random.fold_in(row_key, t), logits)))
    assert seq[len(prompt):] == tokens


def test_bad_seeds_raise_clear_errors(sampler):
  params = SamplingParams(max_new_tokens=2, temperature=1.0)
  with pytest.raises(ValueError, match=r"one key per row \(\(3, 2\) uint32"):
    sampler.generate(PROMPTS, params, seed=_row_keys(0, 2))
  with pytest.raises(TypeError, match="must be uint32"):
    sampler.generate(PROMPTS, params, seed=np.zeros((3, 2), np.int32))
  with pytest.raises(TypeError, match="got a bool"):
    sampler.generate(PROMPTS, params, seed=True)
  with pytest.raises(ValueError, match=r"fold_in data must be in \[0, 2\*\*32\)"):
    fold_in_rows(_row_keys(0, 1), [-1])


def test_top_k_restricts_support():
  logits = jnp.asarray([[0.0, 3.0, 1.0, 2.0, -1.0]])
  filtered = np.asarray(filter_logits(logits, 1.0, 2, None))
  assert np.isfinite(filtered).tolist() == [[False, True, False, True, False]]
  # top_p: probabilities ~[.03, .64, .09, .24, .01]; 0.7 keeps the top two (mass above the second is 0.64 < 0.7).
  filtered = np.asarray(filter_logits(logits, 1.0, 0, 0.7))
  assert np.isfinite(filtered).tolist() == [[False, True, False, True, False]]
  filtered = np.asarray(filter_logits(logits, 1.0, 0, 0.5))
  assert np.isfinite(filtered).tolist() == [[False, True, False, False, False]]


def test_stop_tokens_end_rows_and_are_kept(model, sampler):
  # Find the greedy continuation of one prompt, then make its 4th token a stop token.
  free = sampler.generate([PROMPTS[0]], SamplingParams(max_new_tokens=10, temperature=0.0))
  stop = free.tokens[0][3]
  cut = free.tokens[0].index(stop) + 1
  out = sampler.generate(PROMPTS, SamplingParams(max_new_tokens=10, temperature=0.0, stop_ids=(stop,)))
  assert out.tokens[0] == free.tokens[0][:cut]
  assert out.stopped[0]
  for tokens, stopped in zip(out.tokens[1:], out.stopped[1:]):
    assert stopped == (stop in tokens)
    if stop in tokens:
      assert tokens.index(stop) == len(tokens) - 1


def test_cache_continuation_equals_fresh_prefill(model, sampler):
  params = SamplingParams(max_new_tokens=9, temperature=0.0, stop_ids=(STOP,))
  first = sampler.generate(PROMPTS, params)
  turn2 = [[20, 21, 22], [23], [24, 25, 26, 27, 28, 29, 30]]
  second = sampler.generate(turn2, params, session=first.session)
  for i, prompt in enumerate(PROMPTS):
    history = prompt + first.tokens[i] + turn2[i]
    fresh = sampler.generate([history], params)
    assert second.tokens[i] == fresh.tokens[0]
    np.testing.assert_allclose(second.logprobs[i], fresh.logprobs[0], atol=1e-4)
    assert_logprobs_match(model, history, second.tokens[i], second.logprobs[i])
  # A third turn after dropping the middle row (a finished episode leaves the batch).
  kept = sampler.select(second.session, [0, 2])
  turn3 = [[31, 32], [33]]
  third = sampler.generate(turn3, params, session=kept)
  for j, i in enumerate([0, 2]):
    history = PROMPTS[i] + first.tokens[i] + turn2[i] + second.tokens[i] + turn3[j]
    ref_tokens, _ = greedy_reference(model, history, len(third.tokens[j]))
    assert third.tokens[j] == ref_tokens
    assert_logprobs_match(model, history, third.tokens[j], third.logprobs[j])


def test_rows_hold_only_their_own_tokens_and_select_keeps_the_rest(model, sampler):
  # Rows of very different lengths: each holds exactly its prompt and sampled tokens (the last one pending),
  # padding is never stored; dropping the longest row keeps the other's history (the capacity stays max_length).
  prompts = [list(range(1, 60)), [7, 8, 9]]
  params = SamplingParams(max_new_tokens=4, temperature=0.0)
  out = sampler.generate(prompts, params)
  expected = [len(p) + len(t) - 1 for p, t in zip(prompts, out.tokens)]
  np.testing.assert_array_equal(out.session.lengths, expected)
  assert out.session.cache.capacity == 128  # max_length slots from the start
  short = sampler.select(out.session, [1])
  assert short.cache.capacity == 128 and short.cache.batch_size == 1 and list(short.lengths) == [expected[1]]
  turn2 = [40, 41]
  again = sampler.generate([turn2], params, session=short)
  history = prompts[1] + out.tokens[1] + turn2
  ref_tokens, ref_logprobs = greedy_reference(model, history, 4)
  assert again.tokens[0] == ref_tokens
  np.testing.assert_allclose(again.logprobs[0], ref_logprobs, atol=1e-4)


def test_long_prompts_prefill_in_pieces(model):
  pieces = Sampler(model, attention_block=16, chunk_bucket=4, max_length=128, prefill_piece=8)
  # Leading pieces run on the rows that have tokens there: 2, 4 and 5 of the 7 (the last padded to 6 rows).
  prompts = [list(range(1, 30)), [7, 8, 9], list(range(3, 23)), list(range(40, 51)), list(range(9, 26)), [4, 6],
             list(range(30, 55))]
  params = SamplingParams(max_new_tokens=6, temperature=0.0)
  out = pieces.generate(prompts, params)
  for prompt, tokens, logprobs in zip(prompts, out.tokens, out.logprobs):
    ref_tokens, ref_logprobs = greedy_reference(model, prompt, 6)
    assert tokens == ref_tokens
    np.testing.assert_allclose(logprobs, ref_logprobs, atol=1e-4)
  second = pieces.generate([list(range(30, 50))] + [[3]] * 6, params, session=out.session)
  history = prompts[0] + out.tokens[0] + list(range(30, 50))
  assert second.tokens[0] == greedy_reference(model, history, 6)[0]


def test_decode_reads_across_several_attention_blocks(model, sampler):
  out = sampler.generate([PROMPTS[1]], SamplingParams(max_new_tokens=50, temperature=0.0))
  ref_tokens, ref_logprobs = greedy_reference(model, PROMPTS[1], 50)
  assert out.tokens[0] == ref_tokens  # the history crosses three 16-slot block boundaries while decoding
  np.testing.assert_allclose(out.logprobs[0], ref_logprobs, atol=1e-4)
  assert len(PROMPTS[1]) + 50 > 3 * 16


def test_a_row_holds_at_most_max_length_tokens(model):
  """max_length 40 with 16-slot blocks: a 48-slot cache, but rows end (not stopped) at 40 tokens held."""
  short = Sampler(model, attention_block=16, chunk_bucket=4, max_length=40)
  assert short.capacity == 48
  out = short.generate([list(range(1, 31))], SamplingParams(max_new_tokens=20, temperature=0.0))
  assert int(out.session.lengths[0]) == 40 and len(out.tokens[0]) == 11 and not out.stopped[0]
  assert out.tokens[0] == greedy_reference(model, list(range(1, 31)), 11)[0]


def test_bad_inputs_raise_clear_errors(sampler):
  with pytest.raises(ValueError, match="prompt does not fit the cache"):
    sampler.generate([list(range(1, 60)) * 3], SamplingParams(max_new_tokens=4))
  with pytest.raises(ValueError, match=r"token ids out of the vocabulary \[0, 64\): \[64\]"):
    sampler.generate([[1, 64]], SamplingParams(max_new_tokens=4))
  with pytest.raises(ValueError, match="empty prompt"):
    sampler.generate([[]], SamplingParams(max_new_tokens=4))
  with pytest.raises(ValueError, match="top_p"):
    SamplingParams(top_p=0.0)
  first = sampler.generate([[1, 2]], SamplingParams(max_new_tokens=2, temperature=0.0))
  with pytest.raises(ValueError, match="rows of new tokens for a session of 1 rows"):
    sampler.generate([[1], [2]], SamplingParams(max_new_tokens=2), session=first.session)


def test_stats_count_decode_work_idle_rows_and_compilation_apart(model):
  fresh = Sampler(model, attention_block=16, chunk_bucket=4, max_length=128)  # its own programs: compiled here
  params = SamplingParams(max_new_tokens=8, temperature=0.0)
  prompts = [[3, 4, 5], [6, 7], [8, 9, 10, 11]]  # 3 rows run as a batch of 4: one padding row
  fresh.generate(prompts, params)
  first = dataclasses.replace(fresh.stats)
  assert first.generate_calls == 1 and first.compiles > 0 and first.compile_s > 0
  fresh.generate(prompts, params)  # the same shapes: nothing compiles
  work = fresh.stats.minus(first)
  assert work.compiles == 0 and work.compile_s == 0
  assert work.decode_steps == 7  # the first token comes with the prefill
  assert work.decode_row_steps == 7 * 4 and work.decode_live_row_steps == 7 * 3
  assert work.idle_row_fraction == pytest.approx(0.25)
  assert work.prefill_s > 0 and work.decode_s > 0 and work.decode_step_s == pytest.approx(work.decode_s / 7)


def test_programs_depend_on_batch_and_chunk_width_not_on_length(model):
  """Once a batch size and chunk width have run, longer conversations (across attention blocks, up to the whole
  cache) compile nothing more; batches pad to powers of two."""
  fresh = Sampler(model, attention_block=16, chunk_bucket=4, max_length=200)
  params = SamplingParams(max_new_tokens=12, temperature=0.0)
  out = fresh.generate([[1, 2]] * 5, params)
  assert out.session.cache.batch_size == 8 and out.session.cache.capacity == 208
  out = fresh.generate([[3, 4]] * 5, params, session=out.session)  # a continuation: pending + 2 tokens, width 4
  before = dataclasses.replace(fresh.stats)
  for _ in range(10):  # 14 more tokens a call: the rows go from ~28 to ~170 slots
    out = fresh.generate([[5, 6]] * 5, params, session=out.session)
  assert int(out.session.lengths.max()) > 160
  assert fresh.stats.minus(before).compiles == 0


def test_compacting_the_decode_batch_changes_no_token_and_saves_row_steps(flat_model):
  """Rows stop at different steps (sampled, three stop ids): with compact_decode the live rows move to a batch of 8
  once half have stopped, and every row's tokens and log-probs, and the session it leaves, are those of the full
  batch."""
  params = SamplingParams(max_new_tokens=40, temperature=1.0, stop_ids=(STOP, 9, 17))
  prompts = [[3 + i % 11, 4 + i // 11, 5 + i % 3] for i in range(13)]  # a batch of 16: compacted to 8
  outs, stats = {}, {}
  for compact in (False, True):
    s = Sampler(flat_model, attention_block=16, chunk_bucket=4, max_length=128, compact_decode=compact)
    first = s.generate(prompts, params, seed=11)
    second = s.generate([[20, 21]] * 13, params, seed=12, session=first.session)
    outs[compact], stats[compact] = (first, second), s.stats
  for a, b in zip(outs[False], outs[True]):
    assert a.tokens == b.tokens
    for x, y in zip(a.logprobs, b.logprobs):
      np.testing.assert_allclose(x, y, atol=1e-5)
    np.testing.assert_array_equal(a.session.lengths, b.session.lengths)
    np.testing.assert_array_equal(np.asarray(a.session.pending), np.asarray(b.session.pending))
  lengths = sorted(len(t) for t in outs[False][0].tokens)
  assert lengths[0] < lengths[-1]  # rows stop at different steps
  assert stats[True].decode_live_row_steps == stats[False].decode_live_row_steps
  assert stats[True].decode_row_steps < stats[False].decode_row_steps


def _continuous_two_turns(sampler, prompts, second, params, keys1, keys2, repack_at=None):
  """Continuous batching: each row begins its second turn as soon as its first finishes, while the others are still
  decoding; optionally the slots are repacked to the rows still in play once `repack_at` turns have finished.
  Returns {row: [turn-1 tokens/logprobs, turn-2 tokens/logprobs]} keyed by the original row."""
  slots = sampler.open_slots(len(prompts), params)
  slots = sampler.begin_turns(slots, range(len(prompts)), prompts, keys1, new_rows=range(len(prompts)))
  where = list(range(len(prompts)))  # slot row -> original row
  turns: dict[int, list] = {i: [] for i in range(len(prompts))}
  finished_count = 0
  while slots.open.any():
    slots, finished = sampler.decode_slots(slots, until=1)
    assert finished
    again_rows, again_tokens, again_keys = [], [], []
    for turn in finished:
      original = where[turn.row]
      turns[original].append((turn.tokens, turn.logprobs, turn.stopped))
      finished_count += 1
      if len(turns[original]) == 1:
        again_rows.append(turn.row)
        again_tokens.append([turn.tokens[-1]] + second[original])
        again_keys.append(keys2[original])
    if again_rows:
      slots = sampler.begin_turns(slots, again_rows, again_tokens, np.stack(again_keys))
    if repack_at is not None and finished_count >= repack_at:
      keep = [r for r in range(len(where)) if r < len(where) and where[r] is not None and slots.open[r]]
      slots = sampler.repack_slots(slots, keep)
      where = [where[r] for r in keep]
      repack_at = None
  return turns


@pytest.mark.parametrize("repack", [False, True])
def test_continuous_batching_gives_each_row_the_tokens_of_turn_by_turn_generation(flat_sampler, repack):
  """Rows of `open_slots` at different turns and positions (a row starts its second turn while the others still
  decode their first, the batch repacked midway) sample exactly what `generate` samples turn by turn with the same
  per-row keys: a row's tokens depend on its key and its context only."""
  params = SamplingParams(max_new_tokens=16, temperature=1.0, stop_ids=(STOP, 9, 17))
  prompts = [[3, 4, 5], [6, 7], [8, 9, 10, 11], [12], [13, 14, 15, 16, 17, 18]]
  second = [[20, 21], [22], [23, 24, 25], [26, 27], [28]]
  keys1, keys2 = row_key_data(7, 5), row_key_data(8, 5)
  first = flat_sampler.generate(prompts, params, seed=keys1)
  then = flat_sampler.generate(second, params, seed=keys2, session=first.session)
  turns = _continuous_two_turns(flat_sampler, prompts, second, params, keys1, keys2, repack_at=2 if repack else None)
  assert len({len(t) for t in first.tokens}) > 1  # rows finish their first turn at different steps
  for i in range(5):
    (t1, l1, s1), (t2, l2, s2) = turns[i]
    assert t1 == first.tokens[i] and t2 == then.tokens[i] and (s1, s2) == (first.stopped[i], then.stopped[i])
    np.testing.assert_allclose(l1, first.logprobs[i], atol=1e-5)
    np.testing.assert_allclose(l2, then.logprobs[i], atol=1e-5)


def test_continuous_batching_refuses_bad_calls_and_reuses_a_row_for_a_new_conversation(model, sampler):
  params = SamplingParams(max_new_tokens=4, temperature=0.0)
  slots = sampler.open_slots(2, params)
  with pytest.raises(ValueError, match="one list of new tokens per row"):
    sampler.begin_turns(slots, [0, 1], [[1, 2]])
  with pytest.raises(ValueError, match="no new tokens"):
    sampler.begin_turns(slots, [0], [[]], new_rows=[0])
  slots = sampler.begin_turns(slots, [0], [PROMPTS[0]], new_rows=[0])
  with pytest.raises(ValueError, match="without an open turn"):
    sampler.begin_turns(slots, [0], [[1]])
  while slots.open.any():
    slots, _ = sampler.decode_slots(slots)
  # Row 0 now holds a conversation; as a new one it forgets it and samples what a fresh prompt samples.
  slots = sampler.begin_turns(slots, [0], [PROMPTS[1]], new_rows=[0])
  slots, finished = sampler.decode_slots(slots)
  assert finished[0].tokens == greedy_reference(model, PROMPTS[1], len(finished[0].tokens))[0]


@pytest.mark.slow
@pytest.mark.parametrize("on_mesh", [False, True])
def test_precompiling_the_slot_programs_leaves_nothing_to_compile(flat_model, on_mesh):
  """After `precompile_slots`, continuous batching of that many rows (turns begun on any number of rows at any
  chunk width, long chunks in pieces, rows emptied, repacked) compiles nothing, sampled or greedy as precompiled;
  also with weights placed on a mesh, as an RL loop's sampler has them (`Trainer.policy_params`)."""
  s = Sampler(flat_model, attention_block=16, chunk_bucket=8, prefill_piece=16, max_length=128)
  if on_mesh:
    s.update_params(sharding.place(s.params, sharding.make_mesh(devices=jax.devices()[:1]))[0])
  params = SamplingParams(max_new_tokens=10, temperature=1.0, stop_ids=(STOP, 9, 17))
  assert s.slot_batches(5, min_rows=2, repack_fraction=2) == [8, 4, 2]
  assert s.slot_batches(64) == [64, 16, 8] and s.slot_batches(16) == [16, 8] and s.slot_batches(3) == [4]
  compiled = s.precompile_slots(5, params, min_rows=2, repack_fraction=2)
  # The keys' fold-in for 1, 2, 4 and 8 rows; per batch: its empty state; per sub-batch that begins turns (at least
  # 4 rows, or the batch: {4, 8}, {4}, {2}) a begin at each of the 2 chunk widths, a leading piece, an emptying;
  # one decode; a repack into each smaller batch.
  assert compiled == 4 + (1 + 2 * 4 + 1 + 2) + (1 + 1 * 4 + 1 + 1) + (1 + 1 * 4 + 1)
  assert s.precompile_slots(5, params, min_rows=2, repack_fraction=2) == compiled  # the same programs again
  before = dataclasses.replace(s.stats)
  s.precompile_slots(5, params, min_rows=2, repack_fraction=2)
  prompts = [list(range(3, 3 + n)) for n in (2, 9, 20, 5, 33)]  # widths 8, 16 and pieces of 16
  turns = _continuous_two_turns(s, prompts, [[20, 21]] * 5, params, row_key_data(1, 5), row_key_data(2, 5))
  slots = s.repack_slots(s.open_slots(5, params), [0, 1], min_rows=2)
  slots = s.begin_turns(slots, [0, 1], [[4, 5], [6]], row_key_data(3, 2), new_rows=[0, 1])
  while slots.open.any():
    slots, _ = s.decode_slots(slots)
  assert all(len(t) == 2 for t in turns.values())
  assert s.stats.minus(before).compiles == 0
