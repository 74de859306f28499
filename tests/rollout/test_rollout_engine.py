"""The rollout engine with a real tiny policy on real envs: the cache kept across turns equals re-prefilling the
whole history, both schedules (continuous batching and turn by turn) give the same episodes, the token bookkeeping
matches the rendered conversation, and episodes leave the batch as they end.

  python -m pytest tests/rollout -q
"""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from evolver import envs
from evolver.data.chat import end_of_turn_ids, render_chat
from evolver.rollout import RolloutConfig, RolloutEngine, Task
from tests.rollout.tiny_policy import tiny_model, tiny_sampler

# Each env ends its episodes after its own number of rounds, so episodes leave the batch at different turns.
ROUNDS = {"maze": 2, "textcraft": 3, "wordle": 4, "sql": 4}
TASKS = [Task(name, index, "eval") for name in ROUNDS for index in (0, 1)]
CONFIG = RolloutConfig(max_new_tokens=24, temperature=0.0, max_rounds=4)


def short_env(name: str):
  env = envs.make(name)
  env.max_rounds = ROUNDS[name]  # a real env with a smaller round limit (TextEnv reads it per instance)
  return env


@pytest.fixture(scope="module")
def engine(model, tok):
  with RolloutEngine(tiny_sampler(model), tok, env_factory=short_env) as e:
    yield e


@pytest.fixture(scope="module")
def cached(engine):
  return engine.run(TASKS, CONFIG)


@pytest.fixture(scope="module")
def turn_by_turn(engine):
  return engine.run(TASKS, dataclasses.replace(CONFIG, schedule="turns"))


@pytest.fixture(scope="module")
def reprefilled(engine):
  return engine.run(TASKS, dataclasses.replace(CONFIG, reuse_cache=False))


def test_cache_across_turns_equals_reprefilling_history(cached, reprefilled):
  assert len(cached.trajectories) == len(reprefilled.trajectories) == len(TASKS)
  for a, b in zip(cached.trajectories, reprefilled.trajectories):
    assert not a.failed, a.error
    assert a.turns >= 2
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    assert [m.content for m in a.messages] == [m.content for m in b.messages]
    assert (a.reward, a.success, a.turns, a.finish_reason) == (b.reward, b.success, b.turns, b.finish_reason)
  # Both turn endings occur (stop token and cut at max_new_tokens), so both continuation paths are covered.
  cut = sum(t.cut_turns for t in cached.trajectories)
  assert 0 < cut < sum(t.turns for t in cached.trajectories)
  # The cached path feeds only the new tokens; the re-prefill feeds the whole history every turn.
  assert cached.stats.prefill_tokens < 0.5 * reprefilled.stats.prefill_tokens


def test_token_ids_decode_to_the_rendered_conversation(cached, tok):
  for t in cached.trajectories:
    last_assistant = max(i for i, m in enumerate(t.messages) if m.role == "assistant")
    rendered = render_chat(tok, t.chat()[:last_assistant + 1])
    decoded = tok.decode(t.token_ids.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    # token_ids end with the last sampled token; the template then closes the turn ("<|im_end|>\n" when it
    # was cut, "\n" after a sampled <|im_end|>).
    assert rendered.startswith(decoded)
    assert rendered[len(decoded):] in ("\n", "<|im_end|>\n")
    assert t.messages[-1].role == "user"  # the last observation is kept in the messages


def test_loss_mask_is_exactly_the_sampled_turns(cached, tok):
  stops = end_of_turn_ids(tok)
  for t in cached.trajectories:
    mask = t.loss_mask.astype(bool)
    assert len(t.token_ids) == len(mask) == len(t.logprobs)
    assert np.all(t.logprobs[~mask] == 0.0) and np.all(t.logprobs[mask] <= 0.0)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
    runs = list(zip(edges[::2], edges[1::2]))
    sampled = [m.content for m in t.messages[3:] if m.role == "assistant"]  # after the given "Ok."
    assert len(runs) == len(sampled) == t.turns
    assert [tuple(r) for r in runs] == t.turn_spans
    assert len(t.step_rewards) == t.turns and (not t.step_rewards or t.step_rewards[-1] == t.reward)
    assert len(t.state_keys) == t.turns and t.expert_actions is None  # expert actions are not asked for
    for (start, stop), content in zip(runs, sampled):
      ids = t.token_ids[start:stop].tolist()
      stopped = ids[-1] in stops
      assert tok.decode(ids[:-1] if stopped else ids, skip_special_tokens=False,
                        clean_up_tokenization_spaces=False) == content
      # Each turn follows the generation prompt.
      assert tok.decode(t.token_ids[:start].tolist(), skip_special_tokens=False).endswith("<|im_start|>assistant\n")
    assert t.cut_turns == sum(t.token_ids[stop - 1] not in stops for _, stop in runs)


@jax.jit
def _full_logprobs(graphdef_and_params, ids):
  model = nnx.merge(*graphdef_and_params)
  return jax.nn.log_softmax(model(ids), axis=-1)


def test_logprobs_are_the_policys_on_the_whole_sequence(cached, model):
  # What training recomputes: one cache-free forward over the recorded token_ids.
  length = 1024
  batch = np.zeros((len(cached.trajectories), length), np.int32)
  for i, t in enumerate(cached.trajectories):
    batch[i, :len(t.token_ids)] = t.token_ids
  logprobs = np.asarray(_full_logprobs(nnx.split(model), batch))
  for i, t in enumerate(cached.trajectories):
    positions = np.flatnonzero(t.loss_mask)
    expected = logprobs[i, positions - 1, t.token_ids[positions]]
    np.testing.assert_allclose(t.logprobs[positions], expected, atol=1e-4)


@pytest.mark.slow
def test_both_schedules_give_the_same_episodes(engine, cached, turn_by_turn):
  """Continuous batching (rows at different turns: maze ends after 2 turns, wordle after 4) and turn by turn give
  the same episodes, greedy and sampled; the continuous schedule never decodes more steps."""
  sampled = RolloutConfig(max_new_tokens=24, temperature=1.0, max_rounds=4, num_samples=2, seed=5)
  pairs = [(cached, turn_by_turn),
           (engine.run(TASKS, sampled), engine.run(TASKS, dataclasses.replace(sampled, schedule="turns")))]
  for continuous, turns in pairs:
    for a, b in zip(continuous.trajectories, turns.trajectories):
      np.testing.assert_array_equal(a.token_ids, b.token_ids)
      np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
      np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
      assert [m.content for m in a.messages] == [m.content for m in b.messages]
      assert (a.reward, a.turns, a.finish_reason, a.turn_spans) == (b.reward, b.turns, b.finish_reason, b.turn_spans)
    assert continuous.stats.decode_live_row_steps == turns.stats.decode_live_row_steps
    assert continuous.stats.decode_steps <= turns.stats.decode_steps
    assert continuous.stats.rows_generated == turns.stats.rows_generated == sum(t.turns for t in turns.trajectories)
  with pytest.raises(ValueError, match="schedule must be one of"):
    RolloutConfig(schedule="async")


def test_finished_episodes_leave_the_batch(turn_by_turn):
  cached = turn_by_turn
  by_env = {}
  for t in cached.trajectories:
    by_env.setdefault(t.env, set()).add(t.turns)
    assert t.finish_reason == "done"  # the env ended it at its round limit
    assert t.env_version == envs.make(t.env).version
    assert t.item_id == f"{t.env}_{t.task_index}" and t.split == "eval"
  assert {env: turns for env, turns in by_env.items()} == {env: {n} for env, n in ROUNDS.items()}
  stats = cached.stats
  # Every generate call held exactly the live episodes: rows summed over calls = turns summed over episodes.
  assert stats.rows_generated == sum(t.turns for t in cached.trajectories)
  assert stats.generate_calls == max(ROUNDS.values())
  assert stats.select_calls == 2  # maze leaves after turn 2, textcraft after turn 3
  assert stats.rows_dropped == 4
  assert stats.failed == 0 and stats.episodes == len(TASKS)


def test_groups_samples_and_seeds(engine):
  tasks = [Task("wordle", 2, "eval"), Task("maze", 3, "eval")]
  config = RolloutConfig(max_new_tokens=24, temperature=1.0, max_rounds=2, num_samples=3, seed=7)
  a = engine.run(tasks, config)
  assert [(t.group, t.sample, t.env) for t in a.trajectories] == [
      (0, 0, "wordle"), (0, 1, "wordle"), (0, 2, "wordle"), (1, 0, "maze"), (1, 1, "maze"), (1, 2, "maze")]
  contents = [t.messages[3].content for t in a.trajectories]
  assert len(set(contents)) == len(contents)  # samples of one task differ
  b = engine.run(tasks, config)
  assert [t.token_ids.tolist() for t in a.trajectories] == [t.token_ids.tolist() for t in b.trajectories]
  # The cap on episodes in flight runs them in chunks; greedy results do not depend on the chunking.
  greedy = RolloutConfig(max_new_tokens=24, temperature=0.0, max_rounds=2, num_samples=1)
  whole = engine.run(TASKS[:4], greedy)
  ended, ended_turns = [], []  # `progress`: how many more episodes ended, reported as they end
  chunked = engine.run(TASKS[:4], dataclasses.replace(greedy, batch_size=3), progress=ended.append)
  chunked_turns = engine.run(TASKS[:4], dataclasses.replace(greedy, batch_size=3, schedule="turns"),
                             progress=ended_turns.append)
  assert chunked_turns.stats.generate_calls == 4  # two chunks of two turns
  for calls in (ended, ended_turns):
    assert sum(calls) == 4 and min(calls) > 0 and len(calls) >= 2  # at least one report per chunk
  for x, y, z in zip(whole.trajectories, chunked.trajectories, chunked_turns.trajectories):
    np.testing.assert_array_equal(x.token_ids, y.token_ids)
    np.testing.assert_array_equal(x.token_ids, z.token_ids)


def test_context_limit_and_cut_turns_end_episodes(engine, tok, cached):
  # One token short of the longest episode: that one cannot take its last turn.
  limit = max(len(t.token_ids) for t in cached.trajectories) - 1
  out = engine.run(TASKS, dataclasses.replace(CONFIG, max_context_tokens=limit))
  reasons = {t.finish_reason for t in out.trajectories}
  assert "context" in reasons
  for t in out.trajectories:
    assert len(t.token_ids) + CONFIG.max_new_tokens <= limit
    assert t.truncated == (t.finish_reason == "context")
  # An opening with no room for a first turn: not an episode of the policy, so unscored (failed) and counted.
  shortest = min(t.prompt_len for t in cached.trajectories)
  cramped = engine.run(TASKS, dataclasses.replace(CONFIG, max_context_tokens=shortest + CONFIG.max_new_tokens))
  unstarted = [t for t in cramped.trajectories if t.finish_reason == "opening"]
  assert unstarted and cramped.stats.opening_too_long == len(unstarted) < len(cramped.trajectories)
  assert all(t.failed and t.turns == 0 and not t.success and "no room" in t.error for t in unstarted)
  assert all(t.prompt_len > shortest for t in unstarted)
  ended = engine.run(TASKS, dataclasses.replace(CONFIG, cut_turn="end"))
  stops = end_of_turn_ids(tok)
  for t in ended.trajectories:
    assert t.cut_turns <= 1
    assert len(t.step_rewards) == len(t.state_keys) == len(t.turn_spans) == t.turns  # the cut turn included
    if t.cut_turns:
      assert t.finish_reason == "cut_turn" and t.truncated
      assert t.messages[-1].role == "assistant"  # the env never saw the cut turn
      assert t.token_ids[-1] not in stops
  assert any(t.finish_reason == "cut_turn" for t in ended.trajectories)


def test_cache_holds_exactly_max_length_tokens(model, tok, engine, cached):
  # The cache stores real tokens only: a sampler whose max_length just holds the longest episode and a full
  # last turn (not a multiple of the cache bucket) runs every episode to the end, as a roomy cache does.
  longest = max(len(t.token_ids) for t in cached.trajectories)
  small = tiny_sampler(model)
  small.max_length = longest + CONFIG.max_new_tokens
  with RolloutEngine(small, tok, env_factory=short_env) as tight:
    assert tight.context_limit == small.max_length
    squeezed = tight.run(TASKS, CONFIG)
  for a, b in zip(squeezed.trajectories, cached.trajectories):
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
    assert a.finish_reason == b.finish_reason
  with pytest.raises(ValueError, match="exceeds what the sampler's cache holds"):
    engine.run(TASKS, dataclasses.replace(CONFIG, max_context_tokens=4096))


class FlakyEnv:
  """A real maze env whose step raises on its second call (or whose reset raises), to test error isolation."""

  closed = []

  def __init__(self, fail_on: str):
    self._env = envs.make("maze")
    self._fail_on = fail_on
    self._steps = 0
    self.name, self.version, self.max_rounds = "maze", self._env.version, 4

  def instruction(self):
    return self._env.instruction()

  def num_tasks(self, split):
    return self._env.num_tasks(split)

  def reset(self, index, split="train"):
    if self._fail_on == "reset":
      raise ConnectionError("env server unreachable")
    self._steps = 0
    return self._env.reset(index, split)

  def step(self, text):
    self._steps += 1
    if self._fail_on == "step" and self._steps == 2:
      raise RuntimeError("env crashed mid-episode")
    return self._env.step(text)

  def expert_action(self):
    return self._env.expert_action()

  def state_key(self):
    return self._env.state_key()

  def close(self):
    FlakyEnv.closed.append(self._fail_on)


def test_an_env_error_fails_only_its_trajectory(model, tok):

  def factory(name):
    if name in ("flaky", "broken"):
      return FlakyEnv("step" if name == "flaky" else "reset")
    return short_env(name)

  tasks = [Task("wordle", 0, "eval"), Task("flaky", 1, "eval"), Task("broken", 2, "eval"), Task("sql", 0, "eval")]
  with RolloutEngine(tiny_sampler(model), tok, env_factory=factory) as engine:
    out = engine.run(tasks, CONFIG)
    assert sorted(FlakyEnv.closed) == ["reset", "step"]  # failed envs are closed, not reused
  wordle, flaky, broken, sql = out.trajectories
  assert flaky.failed and "RuntimeError: env crashed mid-episode" in flaky.error and flaky.turns == 2
  assert broken.failed and "ConnectionError" in broken.error and broken.turns == 0
  for t in (wordle, sql):
    assert not t.failed and t.finish_reason == "done" and t.turns == ROUNDS[t.env]
  assert out.stats.failed == 2
  assert [t.task_index for t in out.completed()] == [0, 0]


def test_a_checkpoints_other_stop_ids_end_turns_and_keep_the_history_the_rendered_one(tmp_path):
  # A Qwen2.5-Instruct-style checkpoint: its generation_config.json lists <|im_end|> and <|endoftext|> as EOS, its
  # tokenizer only the first. A policy that ends turns on <|endoftext|> must stop there, and the history the cache
  # holds (and the rollout's tokens) must be the template's, which ends every assistant turn with <|im_end|>.
  import json
  import shutil
  from evolver.models.tokenizer import TINY_TOKENIZER_DIR, load_tokenizer
  checkpoint = tmp_path / "qwen_style"
  shutil.copytree(TINY_TOKENIZER_DIR, checkpoint)
  tok = load_tokenizer(str(checkpoint))
  im_end, endoftext = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
  (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": [im_end, endoftext]}))
  assert set(end_of_turn_ids(tok)) == {im_end, endoftext}
  model = tiny_model(tok)
  head = model.lm_head.get_value()
  # The two columns swapped: the policy samples <|endoftext|> where it would have ended its turn with <|im_end|>.
  model.lm_head.set_value(head.at[:, endoftext].set(head[:, im_end]).at[:, im_end].set(head[:, endoftext]))
  config = RolloutConfig(max_new_tokens=24, max_rounds=3, temperature=1.0, num_samples=2, seed=3)
  tasks = [Task("maze", 1, "eval"), Task("wordle", 2, "eval")]
  with RolloutEngine(tiny_sampler(model), tok, env_factory=short_env) as engine:
    cached = engine.run(tasks, config)
    reprefilled = engine.run(tasks, dataclasses.replace(config, reuse_cache=False))
  ended_on_eos = 0
  for t, r in zip(cached.trajectories, reprefilled.trajectories):
    np.testing.assert_array_equal(t.token_ids, r.token_ids)  # the cache held what a re-prefill feeds
    np.testing.assert_array_equal(t.loss_mask, r.loss_mask)
    last_assistant = max(i for i, m in enumerate(t.messages) if m.role == "assistant")
    rendered = render_chat(tok, t.chat()[:last_assistant + 1])
    decoded = tok.decode(t.token_ids.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    assert rendered.startswith(decoded) and "<|endoftext|>" not in decoded
    for start, stop in t.turn_spans:
      if t.token_ids[stop - 1] == im_end and t.loss_mask[stop - 1] == 0:
        ended_on_eos += 1  # the template's token stands where <|endoftext|> was sampled, given, not trained
        assert t.loss_mask[start:stop - 1].all() and t.logprobs[stop - 1] == 0.0
  assert ended_on_eos >= 4 and sum(t.cut_turns for t in cached.trajectories) < ended_on_eos


def test_a_batch_that_keeps_its_shape_gives_the_same_episodes(engine, cached):
  """compact_rows=False: ended episodes stay in the batch as rows that take no part; every episode (tokens,
  log-probs, messages), greedy and sampled, is the one the compacting batch gives, and no row is ever dropped."""
  fixed = engine.run(TASKS, dataclasses.replace(CONFIG, compact_rows=False))
  for a, b in zip(cached.trajectories, fixed.trajectories):
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_array_equal(a.loss_mask, b.loss_mask)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert [m.content for m in a.messages] == [m.content for m in b.messages]
    assert (a.reward, a.turns, a.finish_reason) == (b.reward, b.turns, b.finish_reason)
  assert fixed.stats.select_calls == 0 and fixed.stats.rows_generated == cached.stats.rows_generated
  assert fixed.stats.decode_live_row_steps == cached.stats.decode_live_row_steps
  sampled = RolloutConfig(max_new_tokens=24, temperature=1.0, max_rounds=4, num_samples=2, seed=3)
  compacting = engine.run(TASKS, sampled)
  keeping = engine.run(TASKS, dataclasses.replace(sampled, compact_rows=False))
  for a, b in zip(compacting.trajectories, keeping.trajectories):
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
