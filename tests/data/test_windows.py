"""Turn windows (the context-length curriculum) and the all-token loss mask."""

import numpy as np
import pytest

from evolver.data import batching, expert
from evolver.data.tokenize import tokenize_trajectory
from evolver.data.trajectory import Message, Trajectory, turn_windows
from tests.data.conftest import TINY_COUNT, TINY_ENVS


def _actions(messages):
  return [m.content for m in messages if m.role == "assistant"]


@pytest.mark.parametrize("turns", [1, 2, 3])
def test_windows_train_every_action_once_and_keep_the_task_statement(turns, tokenizer):
  trajectory = expert.expert_trajectory("maze", 0)
  task_statement = trajectory.messages[2]  # after the instruction and "Ok."
  actions = _actions(trajectory.messages)[1:]  # without "Ok."
  windows = turn_windows(trajectory, turns)
  assert len(windows) == -(-(len(actions) - 1) // turns)
  trained = []
  for k, window in enumerate(windows):
    assert window.messages[0] == task_statement
    assert window.item_id == f"{trajectory.item_id}/w{k}"
    assert (window.env, window.task_index, window.success) == (trajectory.env, trajectory.task_index, True)
    assert len(_actions(window.messages)) <= turns + 1
    example = tokenize_trajectory(window, tokenizer)
    trained.append(tokenizer.decode(example.input_ids[example.loss_mask > 0]))
  expected = "".join(a + "<|im_end|>" for a in actions)
  assert "".join(trained) == expected


def test_short_and_malformed_trajectories():
  one_turn = Trajectory("t", [Message("user", "do it"), Message("assistant", "Ok."), Message("user", "obs"),
                              Message("assistant", "Action: x")])
  (window,) = turn_windows(one_turn, 2)
  assert [m.content for m in window.messages] == ["obs", "Action: x"]
  broken = Trajectory("b", [Message("user", "obs"), Message("user", "obs again"), Message("assistant", "a")])
  with pytest.raises(ValueError, match="b: .*alternate"):
    turn_windows(broken, 2)
  with pytest.raises(ValueError, match="positive"):
    turn_windows(one_turn, 0)


def test_window_iterator_is_short_and_covers_every_action(tokenizer, expert_data_dir):
  it = batching.window_batch_iterator(list(TINY_ENVS), 0, TINY_COUNT, 8, turns=2, tokenizer=tokenizer,
                                      data_dir=expert_data_dir, buckets=(256, 512))
  actions = [len(_actions(expert.expert_trajectory(n, i).messages)) - 1 for n in TINY_ENVS for i in range(TINY_COUNT)]
  batches = [next(it) for _ in range(it.batches_per_epoch)]
  assert sum(float(b["num_tokens"]) for b in batches) > 0
  assert {b["input_ids"].shape[1] for b in batches} <= {256, 512}
  assert it.num_examples + it.num_dropped == sum(max(1, -(-(n - 1) // 2)) for n in actions)
  assert it.num_dropped == 0


def test_all_tokens_mask():
  mask = batching.all_tokens_mask(np.array([3, 0, 5]), 6)
  np.testing.assert_array_equal(mask, [[0, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 1, 0]])
  assert mask.dtype == np.float32
