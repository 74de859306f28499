"""The task generator on the built-in envs: every kept task replays to success in a fresh env, none asks what a
held-out eval task asks, and the explorers and the LLM proposer run on real worlds."""

import json

import pytest

from evolver import envs
from evolver.envs import base, sql, wordle
from evolver.tasks import explore, filters, propose

API = ("reset_world", "hindsight_tasks", "target_key", "spec_target_key")
pytestmark = pytest.mark.skipif(not all(hasattr(base.TextEnv, name) for name in API),
                                reason="the built-in envs do not have the self-questioning API yet")

WORLDS = list(range(80, 84))  # of the exploration slice
ORIGINALS = range(80, 100)


def generate(name, episodes_per_world=2, max_steps=None):
  episodes = explore.explore_random(envs.make, [(name, w) for w in WORLDS], episodes_per_world=episodes_per_world,
                                    max_steps=max_steps, seed=0, progress=False)
  proposals = propose.propose_hindsight(episodes)
  result = filters.filter_tasks(envs.make, [p.candidate() for p in proposals],
                                originals={name: ORIGINALS})
  return proposals, result


@pytest.mark.parametrize("name", envs.names())
def test_every_kept_task_succeeds_in_a_fresh_env_and_is_not_held_out(name):
  proposals, result = generate(name)
  counts = result.counts[name]
  assert counts["kept"] > 0, counts
  assert counts["proposed"] == sum(counts[f] for f in filters.FILTERS) + counts["kept"]
  probe = envs.make(name)
  eval_keys = {probe.target_key(i, "eval") for i in range(probe.num_tasks("eval"))}
  original_keys = {probe.target_key(i, "train") for i in ORIGINALS}
  keys = []
  for kept in result.kept:
    spec = proposals[kept.index].spec
    fresh = envs.make(name)  # a fresh env per task
    fresh.reset_spec(spec)
    assert filters.replay(fresh, kept.actions) == len(kept.actions), (spec, kept.actions)
    fresh.close()
    keys.append(probe.spec_target_key(spec))
  assert not set(keys) & eval_keys and not set(keys) & original_keys
  assert len(set(keys)) == len(keys)  # no two kept tasks ask the same


def test_a_sql_proposal_that_asks_an_eval_question_on_a_shared_database_is_dropped():
  train, held_out = sql.tasks_of("train"), sql.tasks_of("eval")
  index, task = next((i, t) for i, t in enumerate(held_out) if any(u.db == t.db for u in train))
  world = next(i for i, u in enumerate(train) if u.db == task.db)
  leak = base.TaskSpec("sql", world, "train", {"query": task.gold_sql}, "a question in other words")
  env = sql.SqlEnv()
  assert env.spec_target_key(leak) == env.target_key(index, "eval")
  fine = base.TaskSpec("sql", world, "train", {"query": train[world].gold_sql}, train[world].question)
  candidates = [filters.Candidate(leak, (task.gold_sql,)), filters.Candidate(fine, (train[world].gold_sql,))]
  counts = filters.filter_tasks(envs.make, candidates).counts["sql"]
  assert (counts["heldout"], counts["kept"]) == (1, 1)


def test_a_wordle_proposal_of_an_eval_word_is_dropped():
  word = wordle.answers("eval")[0]
  leak = filters.Candidate(base.TaskSpec("wordle", 80, "train", {"word": word}), (" ".join(word),))
  counts = filters.filter_tasks(envs.make, [leak]).counts["wordle"]
  assert (counts["heldout"], counts["kept"]) == (1, 0)


def test_exploration_refuses_the_eval_split_of_a_built_in_env():
  with pytest.raises(ValueError, match="held out"):
    explore.explore_random(envs.make, [explore.World("maze", 0, "eval")], episodes_per_world=1, progress=False)


def test_explorations_may_run_longer_than_the_env_s_turn_limit():
  episodes = explore.explore_random(envs.make, [("maze", 80)], episodes_per_world=1, max_steps=40, progress=False)
  assert len(episodes[0].actions) == 40 > envs.make("maze").max_rounds


def test_the_llm_proposer_makes_checkable_maze_tasks():
  (episode,) = explore.explore_random(envs.make, [("maze", 81)], episodes_per_world=1, seed=3, progress=False)
  cell = episode.hindsight[-1].spec.target["cell"]
  moves = episode.hindsight[-1].actions

  def generate(prompts):
    return [json.dumps([{"query": f"Walk to row {cell[0]}, column {cell[1]}", "confidence": 1.0,
                         "action_sequence": moves},
                        {"query": "Bump into the wall", "confidence": 0.5, "action_sequence": ["jump"]}])]

  proposals, counts, _ = propose.propose_llm([episode], generate, envs.make)
  assert (counts["proposals"], counts["reaches_nothing"]) == (1, 1)
  (proposal,) = proposals
  assert proposal.spec.target == {"cell": cell} and proposal.spec.goal.startswith("Walk to row")
  result = filters.filter_tasks(envs.make, [proposal.candidate()])
  assert result.counts["maze"]["kept"] == 1


def test_policy_exploration_on_a_built_in_env():
  from evolver.models.tokenizer import load_tokenizer
  from tests.rollout.tiny_policy import tiny_model, tiny_sampler
  tok = load_tokenizer()
  episodes = explore.explore_policy(tiny_sampler(tiny_model(tok)), tok, envs.make, [("maze", 80), ("wordle", 80)],
                                    episodes_per_world=2, max_steps=2, max_new_tokens=8, progress=False)
  assert [(e.env, e.world, e.episode) for e in episodes] == [("maze", 80, 0), ("maze", 80, 1), ("wordle", 80, 0),
                                                              ("wordle", 80, 1)]
  assert all(not e.failed and len(e.actions) == 2 for e in episodes)
  assert "Map:" in episodes[0].first_observation and "goal" not in episodes[0].first_observation.lower()
