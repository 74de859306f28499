"""The rollout engine's extension points for RL loops: per-episode randomness, spec tasks, the opening transform
and `strip_added`, and the per-turn records (state keys, expert actions), with the tiny policy on real envs (and
small fake envs where a real one cannot show the behaviour).

  python -m pytest tests/rollout/test_rollout_extensions.py -q
"""

import dataclasses
import warnings

import numpy as np
import pytest

from evolver import envs
from evolver.data.tokenize import tokenize_trajectory
from evolver.data.trajectory import Message
from evolver.envs.base import TaskSpec, TextEnv
from evolver.data.chat import render_chat
from evolver.rollout import (OpeningChange, Rollout, RolloutConfig, RolloutEngine, Task, episode_keys, strip_added,
                             task_hash)
from evolver.rollout.turns import prompt_tokens
from tests.rollout.tiny_policy import tiny_sampler

SAMPLED = RolloutConfig(max_new_tokens=16, temperature=1.0, max_rounds=2, num_samples=2, seed=5)
TASKS = [Task("maze", 0, "eval"), Task("sql", 1, "eval"), Task("wordle", 1, "eval"), Task("textcraft", 0, "eval")]


@pytest.fixture(scope="module")
def engine(model, tok):
  with RolloutEngine(tiny_sampler(model), tok) as e:
    yield e


def _same(a: Rollout, b: Rollout) -> None:
  assert (a.item_id, a.sample) == (b.item_id, b.sample)
  np.testing.assert_array_equal(a.token_ids, b.token_ids)
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
  assert [m.content for m in a.messages] == [m.content for m in b.messages]


# -- per-episode randomness -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_episode_is_the_same_however_the_work_is_split(engine):
  mixed = engine.run(TASKS, SAMPLED).trajectories
  assert all(not t.failed for t in mixed)
  # Samples of one task differ: their keys do.
  for group in range(len(TASKS)):
    first, second = [t for t in mixed if t.group == group]
    assert first.token_ids.tolist() != second.token_ids.tolist()
  alone = engine.run(TASKS[2:3], SAMPLED).trajectories  # the wordle task alone
  for a, b in zip(alone, [t for t in mixed if t.group == 2]):
    _same(a, b)
  chunked = engine.run(TASKS, dataclasses.replace(SAMPLED, batch_size=3)).trajectories
  # Two "hosts", each with half of the tasks.
  hosts = engine.run(TASKS[:2], SAMPLED).trajectories + engine.run(TASKS[2:], SAMPLED).trajectories
  for a, b, c in zip(mixed, chunked, hosts):
    _same(a, b)
    _same(a, c)
  # The config's seed changes every episode.
  reseeded = engine.run(TASKS[2:3], dataclasses.replace(SAMPLED, seed=6)).trajectories
  assert all(a.token_ids.tolist() != b.token_ids.tolist() for a, b in zip(alone, reseeded))


def test_copies_of_a_task_in_one_call_are_different_episodes(engine):
  task = TASKS[2]
  twice = engine.run([task, task], SAMPLED).trajectories
  once = engine.run([task], SAMPLED).trajectories
  for a, b in zip(once, twice[:2]):
    _same(a, b)  # the first copy is the task's episodes
  assert [t.token_ids.tolist() for t in twice[:2]] != [t.token_ids.tolist() for t in twice[2:]]


def test_episode_keys_are_a_function_of_seed_task_occurrence_and_sample():
  tasks = [Task("maze", 0, "eval"), Task("maze", 0, "train"), Task("maze", 1, "eval")]
  keys = episode_keys(3, tasks, [0, 0, 0], [0, 0, 0])
  assert len({k.tobytes() for k in keys}) == 3
  np.testing.assert_array_equal(episode_keys(3, tasks[::-1], [0] * 3, [0] * 3), keys[::-1])
  assert episode_keys(3, tasks[:1], [1], [0])[0].tobytes() != keys[0].tobytes()
  assert episode_keys(3, tasks[:1], [0], [1])[0].tobytes() != keys[0].tobytes()
  assert episode_keys(4, tasks[:1], [0], [0])[0].tobytes() != keys[0].tobytes()
  assert task_hash(Task("maze", 0, "eval")) == 3534260761  # crc32("maze/eval/0"): the same in every process


# -- spec tasks -----------------------------------------------------------------------------------------------


class CounterEnv:
  """A minimal env without `state_key` or `reset_spec`: its state is the number of steps taken."""

  name, version, max_rounds = "counter", "counter-v0", 3

  def __init__(self):
    self.steps = 0
    self.spec = None

  def instruction(self):
    return "Count the steps."

  def num_tasks(self, split):
    return 10

  def reset(self, index, split="train"):
    self.steps = 0
    return f"Task {index} of {split}. You have taken 0 steps."

  def step(self, text):
    self.steps += 1
    return f"You have taken {self.steps} steps.", self.steps / 10, self.steps >= self.max_rounds, {}

  def expert_action(self):
    if self.steps == 1:
      raise RuntimeError("no expert at step 1")
    return f"Action: step {self.steps}"


class KeyedCounterEnv(CounterEnv):
  """CounterEnv with `state_key` and `reset_spec`."""

  def state_key(self):
    return f"s{self.steps}"

  def reset_spec(self, spec):
    self.steps = 0
    self.spec = spec
    return f"Reach {spec.target['steps']} steps in world {spec.world}."


class MeasuredCounterEnv(KeyedCounterEnv):
  """KeyedCounterEnv with `measures()`: 3 steps to go from the start; raises at step 2."""

  def measures(self):
    if self.steps == 2:
      raise RuntimeError("no measures at step 2")
    return {"cost_to_go": self.max_rounds - self.steps, "progress": self.steps / self.max_rounds}


def _counter_engine(model, tok, cls):
  made = []

  def factory(name):
    made.append(cls())
    return made[-1]

  return RolloutEngine(tiny_sampler(model), tok, env_factory=factory), made


def test_spec_tasks_reset_through_reset_spec_and_record_the_spec(model, tok):
  spec = TaskSpec(env="counter", world=2, split="train", target={"steps": 3})
  task = Task.from_spec(spec)
  assert (task.env, task.index, task.split, task.spec) == ("counter", 2, "train", spec)
  with pytest.raises(ValueError, match="use Task.from_spec"):
    Task("counter", 3, "train", spec)
  other = Task.from_spec(dataclasses.replace(spec, target={"steps": 2}))
  engine, made = _counter_engine(model, tok, KeyedCounterEnv)
  with engine:
    out = engine.run([task, Task("counter", 2, "train"), other], SAMPLED).trajectories
  by_spec, indexed, by_other = out[0], out[2], out[4]
  assert any(env.spec == spec for env in made)
  assert by_spec.item_id == spec.item_id and by_spec.task_spec == spec.to_json()
  assert (by_spec.env, by_spec.task_index, by_spec.split) == ("counter", 2, "train")
  assert by_spec.messages[2].content == "Reach 3 steps in world 2."
  assert indexed.item_id == "counter_2" and indexed.task_spec is None
  assert indexed.messages[2].content.startswith("Task 2 of train")
  # A spec task is its own task: its randomness differs from the indexed task's and from another spec's.
  assert len({t.messages[3].content for t in (by_spec, indexed, by_other)}) == 3


def test_spec_task_on_an_env_without_reset_spec_raises(model, tok):
  engine, _ = _counter_engine(model, tok, CounterEnv)
  spec = TaskSpec(env="counter", world=0, split="train", target={"steps": 1})
  with engine, pytest.raises(TypeError, match=r"env 'counter' \(CounterEnv\) has no reset_spec"):
    engine.run([Task("counter", 1), Task.from_spec(spec)], SAMPLED)


@pytest.mark.skipif(not hasattr(TextEnv, "reset_spec"), reason="TextEnv.reset_spec has not landed yet")
def test_spec_tasks_on_a_real_env(engine):
  from evolver.envs import maze
  world = maze._TASKS.get(0, "train")  # pylint: disable=protected-access
  spec = TaskSpec(env="maze", world=0, split="train", target={"cell": list(world.goal)})
  out = engine.run([Task.from_spec(spec)], SAMPLED).trajectories
  for t in out:
    assert not t.failed, t.error
    assert t.item_id == spec.item_id and t.task_spec == spec.to_json() and t.turns >= 1


# -- the opening transform and strip_added ----------------------------------------------------------------------

EXPERIENCE = "Experience: read the map first; walls block moves, so pick an open direction."


def per_episode(transform):
  """A batched `transform_openings` from a function of one episode's (task, sample, opening)."""
  return lambda openings: [transform(o.task, o.sample, o.messages) for o in openings]


def _inject(task, sample, opening):
  """Experience in the instruction of samples 0 and 2 of each task; samples 1 and 3 keep the opening."""
  if sample % 2:
    return None
  first = opening[0]
  return OpeningChange([Message("user", f"{first.content}\n\n{EXPERIENCE}")] + opening[1:],
                       {"experience": [EXPERIENCE]})


def test_opening_transform_then_strip_added(engine, tok):
  config = dataclasses.replace(SAMPLED, num_samples=4, max_rounds=3)
  out = engine.run([Task("maze", 1, "eval")], config, transform_openings=per_episode(_inject)).trajectories
  plain = [t for t in out if t.sample % 2]
  changed = [t for t in out if not t.sample % 2]
  base = plain[0].messages[:3]
  for t in plain:
    assert t.base_opening is None and t.added == {} and t.opening_len == 3
    assert t.prompt_len == len(prompt_tokens(tok, [[m.to_dict() for m in base]])[0])
    assert strip_added(t, tok) is t  # nothing was added: unchanged, and no exp_mask
    assert not tokenize_trajectory(t, tok).exp_mask.any()
  for t in changed:
    assert not t.failed and t.turns >= 2
    assert [m.content for m in t.base_opening] == [m.content for m in base]
    assert t.added == {"experience": [EXPERIENCE]} and t.opening_len == 3
    seen = prompt_tokens(tok, [[m.to_dict() for m in t.messages[:3]]])[0]
    assert EXPERIENCE in t.messages[0].content and t.token_ids[:t.prompt_len].tolist() == seen

    s = strip_added(t, tok)
    new_prompt = prompt_tokens(tok, [[m.to_dict() for m in base]])[0]
    shift = len(new_prompt) - t.prompt_len
    assert shift < 0 and s.prompt_len == len(new_prompt) and s.opening_len == 3
    # Exactly the base opening's prompt, then exactly the tokens after the old prompt.
    assert s.token_ids.tolist() == new_prompt + t.token_ids[t.prompt_len:].tolist()
    assert not s.loss_mask[:len(new_prompt)].any() and not s.logprobs[:len(new_prompt)].any()
    np.testing.assert_array_equal(s.loss_mask[len(new_prompt):], t.loss_mask[t.prompt_len:])
    sampled = t.loss_mask.astype(bool)
    np.testing.assert_array_equal(s.logprobs[s.loss_mask.astype(bool)], t.logprobs[sampled])
    assert s.turn_spans == [(a + shift, b + shift) for a, b in t.turn_spans]
    for (a, b), (c, d) in zip(s.turn_spans, t.turn_spans):
      assert s.token_ids[a:b].tolist() == t.token_ids[c:d].tolist()
    assert [m.content for m in s.messages] == [m.content for m in base + t.messages[3:]]
    assert s.base_opening is None and s.added == {}
    assert s.experience == {"stripped": {"experience": [EXPERIENCE]}, "exp_mask": 1}
    assert t.experience == {} and t.base_opening is not None  # the input is left as it was
    # The stripped tokens are the stripped conversation as the template renders it.
    decoded = tok.decode(s.token_ids.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    last_assistant = max(i for i, m in enumerate(s.messages) if m.role == "assistant")
    assert render_chat(tok, s.chat()[:last_assistant + 1]).startswith(decoded)
    example = tokenize_trajectory(s, tok)
    np.testing.assert_array_equal(example.exp_mask, s.loss_mask)
    assert example.exp_mask.any()


def test_bad_opening_changes_raise(engine):
  bad = {
      "no added": lambda task, sample, opening: OpeningChange(opening, {}),
      "ends with assistant": lambda task, sample, opening: OpeningChange(opening[:2], {"x": 1}),
      "not a change": lambda task, sample, opening: opening,
  }
  errors = {"no added": (ValueError, "say what was added"), "ends with assistant": (ValueError, "end with a user"),
            "not a change": (TypeError, "must give an OpeningChange or None")}
  for name, transform in bad.items():
    kind, match = errors[name]
    with pytest.raises(kind, match=match):
      engine.run([Task("maze", 0, "eval")], SAMPLED, transform_openings=per_episode(transform))
  with pytest.raises(ValueError, match="returned 0 changes for 2 openings"):
    engine.run([Task("maze", 0, "eval")], SAMPLED, transform_openings=lambda openings: [])


# -- per-turn records -----------------------------------------------------------------------------------------


def test_state_keys_and_expert_actions_are_taken_before_each_step(model, tok):
  engine, _ = _counter_engine(model, tok, KeyedCounterEnv)
  config = dataclasses.replace(SAMPLED, max_rounds=None, record_expert_actions=True, num_samples=1)
  with engine:
    out = engine.run([Task("counter", 0), Task("counter", 1)], config)
    ended = engine.run([Task("counter", 0)], dataclasses.replace(config, max_new_tokens=2, cut_turn="end"))
  for t in out.trajectories:
    assert t.turns == 3 and t.finish_reason == "done"
    assert t.state_keys == ["s0", "s1", "s2"]
    assert t.expert_actions == ["Action: step 0", None, "Action: step 2"]
    assert len(t.step_rewards) == len(t.turn_spans) == t.turns
  assert out.stats.expert_errors == 2
  # A cut turn that ends the episode is not stepped, but its state is still recorded.
  (cut,) = ended.trajectories
  assert cut.finish_reason == "cut_turn" and cut.turns == 1
  assert cut.state_keys == ["s0"] and cut.expert_actions == ["Action: step 0"] and cut.step_rewards == [0.0]
  # Not asked: not recorded.
  with _counter_engine(model, tok, KeyedCounterEnv)[0] as plain:
    (t,) = plain.run([Task("counter", 0)], dataclasses.replace(config, record_expert_actions=False)).trajectories
  assert t.expert_actions is None and len(t.state_keys) == t.turns


def test_measures_are_taken_before_and_after_each_step(model, tok):
  config = dataclasses.replace(SAMPLED, max_rounds=None, record_measures=True, num_samples=1)
  with _counter_engine(model, tok, MeasuredCounterEnv)[0] as engine:
    measured = engine.run([Task("counter", 0)], config)
    (t,) = measured.trajectories
    (cut,) = engine.run([Task("counter", 0)], dataclasses.replace(config, max_new_tokens=2, cut_turn="end")
                        ).trajectories
    out = engine.run([Task("counter", 0)], dataclasses.replace(config, record_measures=False))
  none = {"cost_to_go": None, "progress": None}
  assert t.turns == 3 and len(t.step_measures) == 3
  third = 1 / 3
  assert t.step_measures[0] == {"before": {"cost_to_go": 3, "progress": 0.0},
                                "after": {"cost_to_go": 2, "progress": third}}
  assert t.step_measures[1] == {"before": {"cost_to_go": 2, "progress": third}, "after": none}  # raised at 2 steps
  assert t.step_measures[2] == {"before": none, "after": {"cost_to_go": 0, "progress": 1.0}}  # after the last step
  assert measured.stats.measure_errors == 2 and measured.stats.measure_s > 0
  # A turn that ends the episode unstepped: its "after" is its "before".
  assert cut.step_measures == [{"before": {"cost_to_go": 3, "progress": 0.0},
                                "after": {"cost_to_go": 3, "progress": 0.0}}]
  assert out.trajectories[0].step_measures is None and out.stats.measure_s == 0
  # Envs without measures() record None for both.
  with _counter_engine(model, tok, KeyedCounterEnv)[0] as engine:
    (plain,) = engine.run([Task("counter", 0)], config).trajectories
  assert plain.step_measures == [{"before": none, "after": none}] * 3


def test_env_without_state_key_records_the_observation_and_warns_once(model, tok):
  engine, _ = _counter_engine(model, tok, CounterEnv)
  config = dataclasses.replace(SAMPLED, max_rounds=None, num_samples=2)
  with engine:
    with pytest.warns(UserWarning, match=r"env 'counter' \(CounterEnv\) has no state_key\(\)") as caught:
      out = engine.run([Task("counter", 4)], config)
    assert len([w for w in caught if "state_key" in str(w.message)]) == 1
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      engine.run([Task("counter", 4)], config)  # once per engine and env
  for t in out.trajectories:
    assert t.state_keys == [m.content for m in t.messages[2::2]][:t.turns]
    assert t.state_keys[0].startswith("Task 4 of train") and t.state_keys[1] == "You have taken 1 steps."


def _replay(rollout: Rollout) -> None:
  """Replays a maze rollout's actions on a fresh env: the recorded expert action (and state key, when the env
  has them) at every turn is the env's before that turn's step."""
  env = envs.make("maze")
  env.reset(rollout.task_index, rollout.split)
  actions = [m.content for m in rollout.messages[3:] if m.role == "assistant"]
  assert len(actions) == rollout.turns == len(rollout.expert_actions) == len(rollout.state_keys)
  for k, action in enumerate(actions):
    assert rollout.expert_actions[k] == env.expert_action()
    if hasattr(env, "state_key"):
      assert rollout.state_keys[k] == env.state_key()
    env.step(action)


def test_expert_actions_on_a_real_maze(engine):
  config = dataclasses.replace(SAMPLED, max_rounds=3, record_expert_actions=True)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # until TextEnv.state_key lands
    out = engine.run([Task("maze", 2, "eval"), Task("maze", 5, "train")], config)
  assert out.stats.expert_errors == 0
  for t in out.trajectories:
    assert not t.failed and all(a and a.startswith("Thought:") for a in t.expert_actions)
    _replay(t)


class ExpertDrivenMaze(envs.env_class("maze")):
  """A real maze that plays its expert's move whatever the policy wrote, so that every step moves."""

  def step(self, text):
    return super().step(self.expert_action())


@pytest.mark.skipif(not hasattr(TextEnv, "state_key"), reason="TextEnv.state_key has not landed yet")
def test_maze_state_keys_change_with_every_move(model, tok):
  config = dataclasses.replace(SAMPLED, max_rounds=4, num_samples=1, record_expert_actions=True)
  with RolloutEngine(tiny_sampler(model), tok, env_factory=lambda name: ExpertDrivenMaze()) as engine:
    out = engine.run([Task("maze", 0, "eval"), Task("maze", 3, "eval")], config)
  for t in out.trajectories:
    assert not t.failed and t.turns >= 2
    assert len(set(t.state_keys)) == len(t.state_keys)  # a shortest path never returns to a cell
    env = envs.make("maze")
    env.reset(t.task_index, t.split)
    for key, expert in zip(t.state_keys, t.expert_actions):
      assert (key, expert) == (env.state_key(), env.expert_action())
      env.step(expert)
  # The policy's own (random) actions: the records replay on a fresh env.
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # a real env has state_key: no warning
    with RolloutEngine(tiny_sampler(model), tok) as engine:
      for t in engine.run([Task("maze", 1, "eval")], config).trajectories:
        _replay(t)
