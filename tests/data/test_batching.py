"""Batches: shapes from the bucket set only, drops counted, exact resumption, every example once per epoch."""

import functools
import json

import numpy as np
import pytest

from evolver.data import batching, expert
from evolver.data.tokenize import TokenizedExample, tokenize_trajectory
from tests.data.conftest import TINY_COUNT, TINY_ENVS

# Expert lengths of the tiny set run from ~430 to ~1140 tokens: one example is longer than 1024.
BUCKETS = (512, 768, 1024)
BATCH = 4


@pytest.fixture(scope="module")
def trajectories():
  return [t for name in TINY_ENVS for t in expert.expert_trajectories(name, range(TINY_COUNT))]


@pytest.fixture(scope="module")
def lengths(trajectories, tokenizer):
  return [len(tokenize_trajectory(t, tokenizer)) for t in trajectories]


class CountingTokenize:
  """tokenize_trajectory, counting its calls."""

  def __init__(self, tokenizer):
    self.fn = functools.partial(tokenize_trajectory, tokenizer=tokenizer)
    self.calls = 0

  def __call__(self, trajectory):
    self.calls += 1
    return self.fn(trajectory)


def _iterator(trajectories, tokenizer, **kwargs):
  kwargs = {"batch_size": BATCH, "pad_id": batching.pad_id_of(tokenizer), "buckets": BUCKETS, **kwargs}
  return batching.BatchIterator(trajectories, CountingTokenize(tokenizer), **kwargs)


def _example(n, value=1.0):
  ids = np.arange(1, n + 1, dtype=np.int32)
  mask = (np.arange(n) % 2).astype(np.float32)
  return TokenizedExample(ids, mask, mask * 0, mask * value, -mask, weight=value)


def test_make_batch_pads_rows_and_columns():
  batch = batching.make_batch([_example(3, 2.0), _example(5)], length=8, pad_id=0, batch_size=3)
  assert batch["input_ids"].shape == (3, 8) and batch["input_ids"].dtype == np.int32
  for key in ("loss_mask", "exp_mask", "advantages", "logprobs"):
    assert batch[key].shape == (3, 8) and batch[key].dtype == np.float32
  np.testing.assert_array_equal(batch["input_ids"][0], [1, 2, 3, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(batch["advantages"][0], [0, 2, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(batch["weights"], [2.0, 1.0, 0.0])
  np.testing.assert_array_equal(batch["lengths"], [3, 5, 0])
  assert not batch["loss_mask"][2].any() and not batch["input_ids"][2].any()  # a padding row
  assert batch["num_tokens"] == 3.0 and batch["num_tokens"].dtype == np.float32
  with pytest.raises(batching.TooLongError, match="9 tokens"):
    batching.make_batch([_example(9)], length=8, pad_id=0)


def test_collate_picks_the_smallest_bucket():
  assert batching.collate([_example(300), _example(100)], 0, BUCKETS)["input_ids"].shape == (2, 512)
  assert batching.collate([_example(513)], 0, BUCKETS, batch_size=4)["input_ids"].shape == (4, 768)
  with pytest.raises(batching.TooLongError, match="largest bucket 1024"):
    batching.collate([_example(1025)], 0, BUCKETS)


def test_take_rows_cuts_to_the_rows_own_bucket():
  batch = batching.make_batch([_example(300), _example(100), _example(700)], length=1024, pad_id=0, batch_size=4)
  cut = batching.take_rows(batch, np.array([1, 0]), BUCKETS)
  assert cut["input_ids"].shape == (2, 512) and cut["loss_mask"].shape == (2, 512)
  np.testing.assert_array_equal(cut["input_ids"], batch["input_ids"][[1, 0], :512])
  np.testing.assert_array_equal(cut["weights"], batch["weights"][[1, 0]])
  assert "num_tokens" not in cut  # a scalar of the whole batch, not of these rows
  assert batching.take_rows(batch, np.array([2, 3]), BUCKETS)["input_ids"].shape == (2, 768)
  assert batching.take_rows(batch, np.array([3]), BUCKETS, keys=("input_ids",))["input_ids"].shape == (1, 512)
  assert set(batching.take_rows(batch, np.array([0]), BUCKETS, keys=("input_ids", "lengths"))) == {
      "input_ids", "lengths"}
  # Never wider than the batch itself, whatever the buckets.
  assert batching.take_rows(batch, np.array([2]), (4096,))["input_ids"].shape == (1, 1024)


def test_batch_trajectories(trajectories, tokenizer):
  chosen = [trajectories[i] for i in (0, 9, 17)]
  batch = batching.batch_trajectories(chosen, tokenizer, buckets=(2048,), batch_size=4, advantages=[1.0, -1.0, 0.5],
                                      weights=[1.0, 0.0, 0.5])
  assert batch["input_ids"].shape == (4, 2048)
  for row, trajectory in enumerate(chosen):
    example = tokenize_trajectory(trajectory, tokenizer)
    np.testing.assert_array_equal(batch["input_ids"][row, :len(example)], example.input_ids)
    np.testing.assert_array_equal(batch["loss_mask"][row, :len(example)], example.loss_mask)
  np.testing.assert_array_equal(batch["advantages"].max(axis=1), [1.0, 0.0, 0.5, 0.0])
  np.testing.assert_array_equal(batch["advantages"].min(axis=1), [0.0, -1.0, 0.0, 0.0])
  np.testing.assert_array_equal(batch["weights"], [1.0, 0.0, 0.5, 0.0])


def test_batch_trajectories_truncates_long_ones_to_the_largest_bucket(trajectories, tokenizer, lengths):
  long, short = int(np.argmax(lengths)), int(np.argmin(lengths))
  assert lengths[long] > 512 >= lengths[short]
  chosen = [trajectories[long], trajectories[short]]
  with pytest.raises(batching.TooLongError):
    batching.batch_trajectories(chosen, tokenizer, buckets=(256, 512), advantages=[-1.0, 1.0])
  batch = batching.batch_trajectories(chosen, tokenizer, buckets=(256, 512), advantages=[-1.0, 1.0], truncate=True)
  assert batch["input_ids"].shape == (2, 512)
  full = tokenize_trajectory(trajectories[long], tokenizer, advantage=-1.0)
  np.testing.assert_array_equal(batch["input_ids"][0], full.input_ids[:512])
  np.testing.assert_array_equal(batch["advantages"][0], full.advantages[:512])
  np.testing.assert_array_equal(batch["lengths"], [512, lengths[short]])
  assert batch["loss_mask"][0].sum() > 0 and full.truncated(10_000) is full


def test_shapes_come_from_the_buckets_and_long_examples_are_dropped(trajectories, tokenizer, lengths):
  iterator = _iterator(trajectories, tokenizer)
  too_long = sum(n > BUCKETS[-1] for n in lengths)
  assert too_long >= 1 and iterator.num_dropped == too_long
  assert iterator.num_examples == len(trajectories) - too_long
  shapes = {next(iterator)["input_ids"].shape for _ in range(3 * iterator.batches_per_epoch)}
  assert shapes <= {(BATCH, length) for length in BUCKETS} and len(shapes) > 1
  with pytest.raises(batching.TooLongError, match=r"longer than the largest bucket 1024, e\.g\. example \d+ \(maze_"):
    _iterator(trajectories, tokenizer, on_overflow="raise")


def test_an_epoch_covers_every_kept_example_once(trajectories, tokenizer, lengths):
  iterator = _iterator(trajectories, tokenizer, seed=3)
  seen = []
  for bucket, indices in iterator.plan(0):
    batch = next(iterator)
    assert batch["input_ids"].shape == (BATCH, BUCKETS[bucket])
    for row, index in enumerate(indices):
      n = lengths[index]
      assert batching.bucket_index(n, BUCKETS) == bucket  # the smallest bucket that fits
      np.testing.assert_array_equal(batch["input_ids"][row, :n], iterator.example(int(index)).input_ids)
      assert batch["lengths"][row] == n
    assert not batch["loss_mask"][len(indices):].any() and not batch["weights"][len(indices):].any()
    seen.extend(int(i) for i in indices)
  kept = [i for i, n in enumerate(lengths) if n <= BUCKETS[-1]]
  assert sorted(seen) == kept
  assert iterator.get_state()["epoch"] == 0 and iterator.get_state()["position"] == len(iterator.plan(0))


def _same(a, b):
  assert a.keys() == b.keys()
  for key in a:
    np.testing.assert_array_equal(a[key], b[key])


def test_state_round_trip_resumes_exactly(trajectories, tokenizer):
  first = _iterator(trajectories, tokenizer, seed=7)
  per_epoch = first.batches_per_epoch
  for _ in range(per_epoch - 2):  # stop just before the end of epoch 0, so the resumed run crosses into epoch 1
    next(first)
  state = json.loads(json.dumps(first.get_state()))
  assert state["seed"] == 7 and (state["epoch"], state["position"]) == (0, per_epoch - 2)
  expected = [next(first) for _ in range(5)]
  resumed = _iterator(trajectories, tokenizer, seed=0)  # the state's seed wins
  resumed.set_state(state)
  for want in expected:
    _same(next(resumed), want)
  assert resumed.get_state() == first.get_state()


def test_seeds_and_epochs_give_different_orders(trajectories, tokenizer):
  plan = lambda seed, epoch: [tuple(i) for _, i in _iterator(trajectories, tokenizer, seed=seed).plan(epoch)]
  assert plan(0, 0) == plan(0, 0)
  assert plan(0, 0) != plan(1, 0)
  assert plan(0, 0) != plan(0, 1)
  unshuffled = _iterator(trajectories, tokenizer, shuffle=False).plan(0)
  assert [int(i[0]) for _, i in unshuffled] == sorted(int(i[0]) for _, i in unshuffled)


def test_state_from_another_setup_is_refused(trajectories, tokenizer):
  state = _iterator(trajectories, tokenizer).get_state()
  with pytest.raises(ValueError, match="cannot resume exactly"):
    _iterator(trajectories, tokenizer, batch_size=2).set_state(state)
  with pytest.raises(ValueError, match="invalid iterator state"):
    _iterator(trajectories, tokenizer).set_state({**state, "position": 10_000})


def test_lengths_are_computed_once_and_examples_cached(trajectories, tokenizer, lengths):
  iterator = _iterator(trajectories, tokenizer, cache_size=len(trajectories))
  assert iterator.tokenize_fn.calls == len(trajectories)  # the length pass, which also fills the cache
  for _ in range(2 * iterator.batches_per_epoch):
    next(iterator)
  assert iterator.tokenize_fn.calls == len(trajectories)
  # Known lengths skip the pass; then examples are tokenized batch by batch, as they are needed.
  lazy = _iterator(trajectories, tokenizer, lengths=lengths, cache_size=2)
  assert lazy.tokenize_fn.calls == 0
  next(lazy)
  assert 0 < lazy.tokenize_fn.calls <= BATCH


def test_filter_epochs_and_processes(trajectories, tokenizer, lengths):
  iterator = _iterator(trajectories, tokenizer, keep_fn=lambda t: t.env != "maze", num_epochs=2)
  assert iterator.num_filtered == TINY_COUNT and iterator.num_dropped == 0
  assert len(list(iterator)) == 2 * iterator.batches_per_epoch
  whole = _iterator(trajectories, tokenizer, lengths=lengths)
  halves = [_iterator(trajectories, tokenizer, lengths=lengths, process_index=i, process_count=2) for i in range(2)]
  for _ in range(3):
    batch, parts = next(whole), [next(h) for h in halves]
    for key in ("input_ids", "loss_mask", "weights"):
      np.testing.assert_array_equal(batch[key], np.concatenate([p[key] for p in parts]))
  with pytest.raises(ValueError, match="divisible by process_count"):
    _iterator(trajectories, tokenizer, lengths=lengths, process_count=3)


def test_expert_batch_iterator_reads_the_tfds_dataset(expert_data_dir, tokenizer, trajectories):
  iterator = batching.expert_batch_iterator(TINY_ENVS, 0, TINY_COUNT, batch_size=BATCH, tokenizer=tokenizer,
                                            data_dir=expert_data_dir, buckets=(2048,), seed=1)
  assert iterator.num_examples == len(trajectories) and iterator.num_filtered == 0
  batch = next(iterator)
  assert batch["input_ids"].shape == (BATCH, 2048) and batch["num_tokens"] > 0
  assert [iterator.source[i].item_id for i in range(3)] == [t.item_id for t in trajectories[:3]]


def test_concat_source(trajectories):
  source = batching.ConcatSource(trajectories[:5], [], trajectories[5:8])
  assert len(source) == 8 and list(source) == trajectories[:8]
  with pytest.raises(IndexError):
    source[8]


def test_context_loss_weights_the_other_real_tokens():
  actions = np.array([[0, 0, 1, 1, 0, 0], [0, 1, 0, 0, 0, 0]], np.float32)
  batch = {"loss_mask": actions, "lengths": np.array([5, 3], np.int32)}
  out = batching.with_context_loss(batch, 0.25)
  # Actions keep 1; other real tokens but each row's first get 0.25; padding stays 0.
  np.testing.assert_array_equal(out["loss_mask"], [[0, 0.25, 1, 1, 0.25, 0], [0, 1, 0.25, 0, 0, 0]])
  np.testing.assert_array_equal(batch["loss_mask"], actions)  # the input batch is not modified
  assert batching.with_context_loss(batch, 0.0) is batch
  with pytest.raises(ValueError, match="context_loss_weight must be in"):
    batching.with_context_loss(batch, 1.5)
