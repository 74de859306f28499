"""What decides whether an RL step has signal and how it is spent: the task curriculum (pass rates, weights, exact
resume), DAPO's groups with signal and refill seeds, the step's diagnostics (advantage-weighted shares, relative
parameter change) and the negative-advantage weight. Pure functions on hand-made inputs."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from evolver.rl import losses
from evolver.rollout import Rollout
from evolver.train import curriculum, rl
from evolver.train.slices import draw_tasks


def rollout(env="maze", index=80, group=0, sample=0, reward=0.0, failed=False, split="train"):
  return Rollout(item_id=f"{env}_{index}", messages=[], reward=reward, success=reward >= 1.0, env=env,
                 task_index=index, split=split, group=group, sample=sample, failed=failed)


def test_uniform_source_draws_what_draw_tasks_drew_and_refills_differ():
  source = curriculum.UniformTasks()
  source.bind(["maze", "babyai"], start=80, count=24, seed=3)
  assert source.draw(5, 0, 4) == draw_tasks(["maze", "babyai"], 80, 24, 4, 3, 5)  # the old behaviour, exactly
  assert source.draw(5, 1, 4) == source.draw(5, 1, 4) != source.draw(5, 0, 4)
  assert source.state_files() == {} and source.observe([rollout()]) == {}


def test_shuffled_source_covers_the_slice_once_an_epoch():
  source = curriculum.ShuffledTasks()
  source.bind(["maze", "babyai"], start=80, count=6, seed=0)
  epoch = [t for step in range(3) for t in source.draw(step, 0, 4)]  # 12 draws: the 12 tasks, once each
  assert sorted((t.env, t.index) for t in epoch) == sorted((e, 80 + i) for e in ("maze", "babyai") for i in range(6))
  assert [t for step in range(3, 6) for t in source.draw(step, 0, 4)] != epoch  # the next epoch, reshuffled
  assert source.draw(2, 1, 4) == curriculum.UniformTasks.draw(source, 2, 1, 4)


def test_curriculum_weights_settled_tasks_by_the_floor_and_favours_mixed_ones():
  source = curriculum.PassRateCurriculum(window=4, floor=0.1)
  source.bind(["maze"], start=80, count=3, seed=0)
  counts = source.observe([rollout(index=80, reward=0.0), rollout(index=80, sample=1, reward=0.0),
                           rollout(index=81, reward=1.0), rollout(index=81, sample=1, reward=0.0),
                           rollout(index=82, reward=1.0, failed=True),      # errored: not an outcome
                           rollout(index=10, reward=1.0),                   # outside the slice
                           rollout(index=82, reward=1.0, split="eval")])    # another split
  assert counts == {"mixed": 1, "settled": 1, "unseen": 1}
  assert source.pass_rate("maze", 80) == 0.0 and source.pass_rate("maze", 81) == 0.5
  assert source.pass_rate("maze", 82) is None
  np.testing.assert_allclose(source.weights("maze"), [0.1, 1.0, 1.0])
  drawn = [t.index for step in range(200) for t in source.draw(step, 0, 4)]
  shares = np.bincount(drawn, minlength=83)[80:] / len(drawn)
  np.testing.assert_allclose(shares, [0.1 / 2.1, 1 / 2.1, 1 / 2.1], atol=0.03)
  # The window keeps the recent outcomes only: four successes settle task 81 at 1.
  source.observe([rollout(index=81, sample=s, reward=1.0) for s in range(4)])
  assert source.pass_rate("maze", 81) == 1.0 and source.weights("maze")[1] == 0.1


def test_curriculum_state_round_trips_and_resumes_the_same_draws():
  source = curriculum.PassRateCurriculum(window=2)
  source.bind(["maze", "babyai"], start=80, count=5, seed=1)
  source.observe([rollout(index=80, reward=1.0), rollout(env="babyai", index=84, reward=0.5)])
  files = source.state_files()
  assert json.loads(files[curriculum.STATE_FILE]) == {"babyai/84": [0.0], "maze/80": [1.0]}
  resumed = curriculum.PassRateCurriculum(window=2)
  resumed.bind(["maze", "babyai"], start=80, count=5, seed=1)
  resumed.load_state_files(files)
  assert [resumed.draw(s, r, 4) for s in range(5) for r in range(2)] == [
      source.draw(s, r, 4) for s in range(5) for r in range(2)]
  fresh = curriculum.PassRateCurriculum()
  fresh.load_state_files({})
  assert fresh.outcomes == {}
  with pytest.raises(ValueError, match="pass_rates.json is not JSON"):
    fresh.load_state_files({curriculum.STATE_FILE: b"{not json"})
  with pytest.raises(ValueError, match="window >= 1 and 0 < floor <= 1"):
    curriculum.PassRateCurriculum(floor=0.0)


def test_groups_with_signal_and_the_refill_seeds():
  rollouts = [rollout(group=0, reward=1.0), rollout(group=0, sample=1, reward=0.0),
              rollout(group=1, reward=0.0), rollout(group=1, sample=1, reward=0.0),
              rollout(group=2, reward=0.3), rollout(group=2, sample=1, reward=0.3)]
  assert rl.groups_with_signal(rollouts) == {0}
  assert rl.with_signal(rollouts) == rollouts[:2]
  assert rl.signal_metrics(rollouts) == {"rollout/groups": 3, "rollout/signal_fraction": 1 / 3}
  assert rl.signal_metrics([]) == {"rollout/groups": 0, "rollout/signal_fraction": 0.0}
  assert rl.round_seed(2, 7, 0) == 2 * 100003 + 7  # the step's own draw keeps its old seed
  seeds = {rl.round_seed(seed, step, r) for seed in range(3) for step in range(50) for r in range(4)}
  assert len(seeds) == 3 * 50 * 4


def test_advantage_shares_split_the_weight_between_successes_and_failures():
  batch = {"advantages": np.array([[0, 2, 2, 0], [0, -1, -1, -1], [0, 0, 0, 0]], np.float32),
           "loss_mask": np.array([[0, 1, 1, 0], [0, 1, 1, 1], [0, 0, 0, 0]], np.float32)}
  shares = rl.advantage_shares(batch, np.array([1, 0], np.float32))  # the third row is padding
  assert shares == pytest.approx({"adv/success_share": 4 / 7, "adv/failure_share": 3 / 7,
                                  "adv/negative_token_share": 3 / 5, "adv/negative_share": 3 / 7})


def test_relative_change_of_a_parameter_tree():
  old = {"a": jnp.array([3.0, 0.0]), "b": {"c": jnp.array([4.0])}}
  new = {"a": jnp.array([3.0, 1.0]), "b": {"c": jnp.array([4.0])}}
  assert float(rl.relative_change(new, old)) == pytest.approx(1 / 5)
  assert float(rl.relative_change(old, old)) == 0.0


def test_negative_weight_scales_only_negative_advantages():
  advantages = jnp.array([[1.5, -2.0, 0.0, -0.5]])
  np.testing.assert_allclose(losses.weight_negative(advantages, 0.25), [[1.5, -0.5, 0.0, -0.125]])
  assert losses.weight_negative(advantages, 1.0) is advantages
