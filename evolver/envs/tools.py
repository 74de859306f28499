"""tools (tool use): reach several sub-goals with weather, todo and movie APIs over offline synthetic data.

Each task draws a small world (a five-day forecast for a few cities, a todo list, a movie catalogue) and
combines two or three sub-goals: look something up and report it, add, complete or delete todos, possibly
conditional on what a lookup returns. Actions are tool calls, `Action: fn` then `Action Input: {json}`;
`finish` ends the episode. The reward is the fraction of sub-goals met so far (answers count once
`finish` has been called with them). The expert follows the task's scripted call plan.

A spec task (`reset_spec`) keeps a task's world and lists its own sub-goals, each one of the kinds above
with its parameters; see `ToolsEnv._reset_spec`. An exploration (`reset_world`) opens a world with no request
and yields one single-goal task per sub-goal the calls met; see `ToolsEnv._reset_world`. The state key is the
todo list and which sub-goals are met; the step judges' cost to go is the number of calls the expert's plan still
needs (`ToolsEnv._measures`).
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from typing import Any, Callable

from evolver.envs import base

_CITIES = ("Oslo", "Lima", "Cairo", "Kyoto", "Porto", "Dublin", "Quito", "Accra", "Perth", "Riga", "Hanoi",
           "Tunis", "Zurich", "Bogota", "Manila", "Seoul", "Lagos", "Nice", "Denver", "Austin")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday")
_CONDITIONS = ("sunny", "cloudy", "rain", "snow", "windy")
_TODOS = ("call the bank", "water the plants", "renew passport", "book dentist", "pay rent", "fix the bike",
          "clean the garage", "send invoices", "buy groceries", "walk the dog", "return library books",
          "plan the trip", "update resume", "back up laptop")
_GENRES = ("comedy", "drama", "horror", "sci-fi", "animation", "thriller")
_TITLE_A = ("Midnight", "Paper", "Silver", "Broken", "Hidden", "Electric", "Quiet", "Wild", "Last", "Golden",
            "Frozen", "Lucky")
_TITLE_B = ("Harbor", "Garden", "Signal", "Empire", "Orchard", "Planet", "Circus", "Letters", "Summer", "Tide",
            "Machine", "Parade")
_DIRECTORS = ("Ana Ruiz", "Ben Okoro", "Chen Wei", "Dana Holt", "Eli Moss", "Farah Khan", "Gus Lind",
              "Hana Sato", "Ivo Petrov", "June Park")
_RAIN_TODO, _DRY_TODO = "buy an umbrella", "pack sunglasses"

API = {
    "get_weather": '{"city": str, "day": str} -> the forecast: condition, high and low in Celsius',
    "list_todos": "{} -> the todo list: id, title, done",
    "add_todo": '{"title": str} -> adds a todo',
    "complete_todo": '{"id": int} -> marks a todo as done',
    "delete_todo": '{"id": int} -> removes a todo',
    "search_movies": '{"genre": str, "year": int, "director": str} (all optional) -> matching movies',
    "get_movie": '{"title": str} -> year, genre, director, rating',
    "finish": '{"answer": str} -> ends the task; put every requested answer in "answer"',
}


@dataclasses.dataclass
class World:
  weather: dict[tuple[str, str], dict[str, Any]]
  todos: list[dict[str, Any]]
  movies: list[dict[str, Any]]
  next_todo_id: int = 0  # ids are never reused, so a deleted todo stays deleted

  def __post_init__(self):
    self.next_todo_id = max((t["id"] for t in self.todos), default=0) + 1


@dataclasses.dataclass(frozen=True)
class Call:
  thought: str
  fn: str
  args: dict[str, Any]

  def signature(self) -> str:
    return self.fn + json.dumps(self.args, sort_keys=True)

  def key(self) -> str:
    """The call as the tools read it: `call_key(fn, args)`."""
    return call_key(self.fn, self.args)


def call_key(fn: str, args: dict[str, Any]) -> str:
  """A canonical text of a call, equal for calls the tools answer alike: string arguments stripped and lowercased
  (the tools match cities, days, titles and genres that way)."""
  canonical = {key: value.strip().lower() if isinstance(value, str) else value for key, value in args.items()}
  return fn + json.dumps(canonical, sort_keys=True)


@dataclasses.dataclass(frozen=True)
class Goal:
  text: str  # the request, as the user states it
  plan: tuple[Call, ...]
  answer: str | None  # what the final answer must contain, if this goal asks a question
  met: Callable[["World", str | None], bool]  # (world state, final answer or None before finish) -> met


@dataclasses.dataclass(frozen=True)
class ToolTask:
  seed: int
  goals: tuple[Goal, ...]
  request: str

  def world(self) -> World:
    return _make_world(random.Random(f"tools-world:{self.seed}"))


def _make_world(rng: random.Random) -> World:
  weather = {}
  for city in rng.sample(_CITIES, 4):
    for day in _DAYS:
      high = rng.randint(-5, 35)
      condition = rng.choice(_CONDITIONS[:4] if high > 2 else ("snow", "cloudy", "windy"))
      if condition == "snow" and high > 5:
        condition = "rain"
      weather[(city, day)] = {"city": city, "day": day, "condition": condition, "high": high,
                              "low": high - rng.randint(3, 10)}
  todos = [{"id": i + 1, "title": title, "done": rng.random() < 0.3} for i, title in enumerate(rng.sample(_TODOS, 4))]
  titles = rng.sample([f"{a} {b}" for a in _TITLE_A for b in _TITLE_B], 10)
  ratings = rng.sample(range(50, 96), 10)
  movies = [{"title": t, "year": rng.randint(1990, 2023), "genre": rng.choice(_GENRES),
             "director": rng.choice(_DIRECTORS), "rating": r / 10} for t, r in zip(titles, ratings)]
  return World(weather, todos, movies)


def _contains(answer: str | None, expected: str) -> bool:
  if answer is None:
    return False
  return re.search(rf"(?<![\w-]){re.escape(expected.lower())}(?![\w-])", answer.lower()) is not None


def _has_todo(world: World, title: str) -> bool:
  return any(t["title"].strip().lower() == title.lower() for t in world.todos)


# --- the sub-goals, each built from its parameters (`_goal_factories` draws them for indexed tasks) ---------


def _weather_call(city: str, day: str) -> Call:
  return Call(f"I need the forecast for {city} on {day}.", "get_weather", {"city": city, "day": day})


def _condition_goal(world: World, city: str, day: str) -> Goal:
  forecast = world.weather[(city, day)]
  return Goal(f"tell me the weather condition in {city} on {day}", (_weather_call(city, day),), forecast["condition"],
              lambda w, a: _contains(a, forecast["condition"]))


def _high_goal(world: World, city: str, day: str) -> Goal:
  value = str(world.weather[(city, day)]["high"])
  return Goal(f"tell me the high temperature in {city} on {day}", (_weather_call(city, day),), value,
              lambda w, a: _contains(a, value))


def _umbrella_goal(world: World, city: str, day: str) -> Goal:
  forecast = world.weather[(city, day)]
  wanted, unwanted = (_RAIN_TODO, _DRY_TODO) if forecast["condition"] == "rain" else (_DRY_TODO, _RAIN_TODO)
  why = "it will rain" if wanted == _RAIN_TODO else f"it will be {forecast['condition']}, not rain"
  return Goal(f"if it will rain in {city} on {day}, add the todo '{_RAIN_TODO}', otherwise add the todo "
              f"'{_DRY_TODO}'",
              (_weather_call(city, day),
               Call(f"In {city} on {day} {why}, so I add '{wanted}'.", "add_todo", {"title": wanted})),
              None, lambda w, a: _has_todo(w, wanted) and not _has_todo(w, unwanted))


def _complete_goal(target: dict[str, Any]) -> Goal:
  find = Call(f"I need the id of the todo '{target['title']}'.", "list_todos", {})
  done = Call(f"The todo '{target['title']}' has id {target['id']}.", "complete_todo", {"id": target["id"]})
  return Goal(f"mark the todo '{target['title']}' as done", (find, done), None,
              lambda w, a: any(t["id"] == target["id"] and t["done"] for t in w.todos))


def _delete_goal(todo: dict[str, Any]) -> Goal:
  find = Call(f"I need the id of the todo '{todo['title']}'.", "list_todos", {})
  drop = Call(f"The todo '{todo['title']}' has id {todo['id']}.", "delete_todo", {"id": todo["id"]})
  return Goal(f"delete the todo '{todo['title']}'", (find, drop), None,
              lambda w, a: all(t["id"] != todo["id"] for t in w.todos))


def _director_goal(movie: dict[str, Any]) -> Goal:
  return Goal(f"tell me who directed '{movie['title']}'",
              (Call(f"I look up '{movie['title']}'.", "get_movie", {"title": movie["title"]}),),
              movie["director"], lambda w, a: _contains(a, movie["director"]))


def _movies_of(world: World, genre: str, year: int) -> list[dict[str, Any]]:
  return [m for m in world.movies if m["genre"] == genre and m["year"] == year]


def _watch_goal(world: World, genre: str, year: int) -> Goal:
  """The goal for the one movie of `genre` from `year` (there must be exactly one)."""
  movie, = _movies_of(world, genre, year)
  title = f"watch {movie['title']}"
  search = Call(f"I search for {genre} movies from {year}.", "search_movies", {"genre": genre, "year": year})
  add = Call(f"The {genre} movie from {year} is '{movie['title']}'.", "add_todo", {"title": title})
  return Goal(f"find the {genre} movie from {year} and add the todo 'watch <its title>'", (search, add), None,
              lambda w, a: _has_todo(w, title))


def _best_goal(world: World, genre: str) -> Goal:
  top = max((m for m in world.movies if m["genre"] == genre), key=lambda m: m["rating"])
  return Goal(f"tell me which {genre} movie has the highest rating",
              (Call(f"I search for {genre} movies and compare ratings.", "search_movies", {"genre": genre}),),
              top["title"], lambda w, a: _contains(a, top["title"]))


def _goal_factories(world: World, rng: random.Random) -> dict[str, Callable[[], Goal | None]]:
  """The goal kinds, each with parameters drawn from `rng` (in a fixed order: tasks are reproducible)."""
  city, day = rng.choice(sorted(world.weather))
  open_todos = [t for t in world.todos if not t["done"]]
  todo = rng.choice(world.todos)
  movie = rng.choice(world.movies)

  def complete() -> Goal | None:
    return _complete_goal(rng.choice(open_todos)) if open_todos else None

  def watch() -> Goal | None:
    if len(_movies_of(world, movie["genre"], movie["year"])) != 1:
      return None
    return _watch_goal(world, movie["genre"], movie["year"])

  return {"condition": lambda: _condition_goal(world, city, day), "high": lambda: _high_goal(world, city, day),
          "umbrella": lambda: _umbrella_goal(world, city, day), "complete": complete,
          "delete": lambda: _delete_goal(todo), "director": lambda: _director_goal(movie), "watch": watch,
          "best": lambda: _best_goal(world, movie["genre"])}


def _request(goals: list[Goal] | tuple[Goal, ...]) -> str:
  steps = "; ".join(f"({i + 1}) {goal.text}" for i, goal in enumerate(goals))
  ending = "Then call finish with your answers." if any(g.answer for g in goals) else "Then call finish."
  return f"Please {steps}. {ending}"


# Pairs that would contradict each other (completing and deleting the same todo) are not drawn together.
_EXCLUSIVE = ({"complete", "delete"}, {"condition", "high"})


def generate_task(seed: int) -> ToolTask | None:
  rng = random.Random(f"tools:{seed}")
  world = _make_world(random.Random(f"tools-world:{seed}"))
  factories = _goal_factories(world, rng)
  kinds = rng.sample(sorted(factories), rng.choice((2, 2, 3)))
  if any(pair <= set(kinds) for pair in _EXCLUSIVE):
    return None
  goals = [factories[kind]() for kind in kinds]
  if any(goal is None for goal in goals):
    return None
  return ToolTask(seed, tuple(goals), _request(goals))


# A spec's goal kinds -> their parameters (see ToolsEnv._reset_spec).
GOAL_PARAMETERS = {"condition": ("city", "day"), "high": ("city", "day"), "umbrella": ("city", "day"),
                   "complete": ("todo",), "delete": ("todo",), "director": ("movie",), "watch": ("genre", "year"),
                   "best": ("genre",)}
_MAX_SPEC_GOALS = 4


def _choose(what: str, value: Any, choices: list, position: int) -> Any:
  """`value` if it is one of `choices`, else EnvError listing them."""
  if isinstance(value, bool) or value not in choices:
    raise base.EnvError(f"tools spec goal {position}: {what} {value!r:.60} is not in this world; it has "
                        f"{choices}")
  return value


def _spec_goal(world: World, entry: Any, position: int) -> tuple[str, Goal]:
  """One entry of a spec's "goals" as (canonical text of the entry, the Goal); EnvError says what is wrong."""
  if not isinstance(entry, dict) or entry.get("kind") not in GOAL_PARAMETERS:
    raise base.EnvError(f"tools spec goal {position} must be an object with a 'kind' among "
                        f"{sorted(GOAL_PARAMETERS)}, got {entry!r:.80}")
  kind = entry["kind"]
  wanted = set(GOAL_PARAMETERS[kind]) | {"kind"}
  if set(entry) != wanted:
    raise base.EnvError(f"tools spec goal {position} ({kind}) takes {sorted(wanted)}, got {sorted(entry)}")
  if kind in ("condition", "high", "umbrella"):
    city = _choose("city", entry["city"], sorted({c for c, _ in world.weather}), position)
    day = _choose("day", entry["day"], list(_DAYS), position)
    goal = {"condition": _condition_goal, "high": _high_goal, "umbrella": _umbrella_goal}[kind](world, city, day)
  elif kind in ("complete", "delete"):
    titles = [t["title"] for t in world.todos if kind == "delete" or not t["done"]]
    title = _choose("open todo" if kind == "complete" else "todo", entry["todo"], titles, position)
    todo = next(t for t in world.todos if t["title"] == title)
    goal = _complete_goal(todo) if kind == "complete" else _delete_goal(todo)
  elif kind == "director":
    title = _choose("movie", entry["movie"], [m["title"] for m in world.movies], position)
    goal = _director_goal(next(m for m in world.movies if m["title"] == title))
  elif kind == "watch":
    genre = _choose("genre", entry["genre"], sorted({m["genre"] for m in world.movies}), position)
    year = entry["year"]
    found = _movies_of(world, genre, year) if isinstance(year, int) and not isinstance(year, bool) else []
    if len(found) != 1:
      raise base.EnvError(f"tools spec goal {position} (watch): the world has {len(found)} {genre} movies from "
                          f"{year!r:.20}; 'watch' needs exactly one")
    goal = _watch_goal(world, genre, year)
  else:  # best
    genre = _choose("genre", entry["genre"], sorted({m["genre"] for m in world.movies}), position)
    goal = _best_goal(world, genre)
  return json.dumps(entry, sort_keys=True), goal


_TASKS = base.SplitIndex(generate_task, lambda task: task.request + "|" + repr(task.world()),
                         sizes={"train": 2000, "eval": 200}, eval_every=5)

_INSTRUCTION = """\
You are an assistant that completes requests by calling tools. Tools (arguments as JSON):
""" + "\n".join(f"- {name} {signature}" for name, signature in API.items()) + """

Each turn, reply with a short thought and one tool call:
Thought: <your reasoning>
Action: <tool name>
Action Input: <JSON arguments>

Use the tools' results; do not guess. Day names are Monday to Friday. Call finish once everything is done, \
with every requested answer in "answer".

Example:
Thought: I need the forecast for Oslo on Monday.
Action: get_weather
Action Input: {"city": "Oslo", "day": "Monday"}"""

_ARG_TYPES = {"city": str, "day": str, "title": str, "id": int, "genre": str, "year": int, "director": str,
              "answer": str}
_REQUIRED = {"get_weather": ("city", "day"), "list_todos": (), "add_todo": ("title",), "complete_todo": ("id",),
             "delete_todo": ("id",), "search_movies": (), "get_movie": ("title",), "finish": ()}
_OPTIONAL = {"search_movies": ("genre", "year", "director"), "finish": ("answer",)}


def _dumps(value: Any) -> str:
  return json.dumps(value, separators=(", ", ": "))


class ToolsEnv(base.TextEnv):
  name = "tools"
  version = "tools-v1"
  max_rounds = 12

  def __init__(self):
    super().__init__()
    self._task: ToolTask | None = None
    self._world: World | None = None
    self._answer: str | None = None
    self._done_calls: set[str] = set()
    self._done_keys: set[str] = set()  # `call_key` of every call that succeeded
    self._initial_cost = 1  # the cost to go at the start (see `_measures`)
    # Exploration: the world as it started, the forecasts looked up, and the state sub-goals not yet met
    # (spec entry, goal).
    self._start_world: World | None = None
    self._looked_up: list[tuple[str, str]] = []
    self._pending: list[tuple[dict[str, Any], Goal]] = []

  def instruction(self) -> str:
    return _INSTRUCTION

  def _num_tasks(self, split: str) -> int:
    return _TASKS.sizes[split]

  def _task_key(self, index: int, split: str) -> str:
    return _TASKS.key(index, split)

  def _reset_task(self, index: int, split: str) -> str:
    return self._start(_TASKS.get(index, split))

  def _reset_spec(self, spec: base.TaskSpec) -> str:
    """Target: `{"goals": [goal, ...]}`, 1 to 4 distinct sub-goals on the world (forecasts, todo list, movies) of
    task `spec.world`, each an object with a "kind" and that kind's parameters (`GOAL_PARAMETERS`), which must
    name things of that world:

      {"kind": "condition" | "high", "city": c, "day": d}   report the forecast's condition / high temperature
      {"kind": "umbrella", "city": c, "day": d}             add 'buy an umbrella' if it rains, else 'pack sunglasses'
      {"kind": "complete", "todo": title}                   mark an open todo as done
      {"kind": "delete", "todo": title}                     delete a todo
      {"kind": "director", "movie": title}                  report a movie's director
      {"kind": "watch", "genre": g, "year": y}              add 'watch <title>' for the one g movie from y
      {"kind": "best", "genre": g}                          report the best-rated g movie

    Each is checked from the env's own state as for an indexed task (answers from `finish`'s answer, the rest
    from the todo list), and the reward is the fraction met. Goals that cannot all hold together (completing
    and deleting one todo, adding both umbrella todos), or that need more calls than `max_rounds`, are refused:
    the expert's plan is run on a scratch copy first. The request reads "Please (1) ...; (2) .... Then call
    finish ...", or `spec.goal` when given.
    """
    base.check_target_keys(self.name, spec.target, ("goals",))
    entries = spec.target["goals"]
    if not isinstance(entries, list) or not 1 <= len(entries) <= _MAX_SPEC_GOALS:
      raise base.EnvError(f"tools spec target 'goals' must be a list of 1 to {_MAX_SPEC_GOALS} goals, got "
                          f"{entries!r:.80}")
    seed = _TASKS.get(spec.world, spec.split).seed
    world = _make_world(random.Random(f"tools-world:{seed}"))
    parsed = [_spec_goal(world, entry, i + 1) for i, entry in enumerate(entries)]
    texts = [text for text, _ in parsed]
    if len(set(texts)) != len(texts):
      raise base.EnvError("tools spec target lists the same goal twice")
    goals = tuple(goal for _, goal in parsed)
    task = ToolTask(seed, goals, spec.goal or _request(goals))
    self._check_feasible(task)
    return self._start(task)

  def _reset_world(self, index: int, split: str) -> str:
    """The world of task `index` (forecasts, todo list, movies) with no request: the first observation names the
    cities with forecasts and says what else there is, without the task's sub-goals. `finish` ends the
    exploration.

    Outcomes: the sub-goal kinds of `_reset_spec`, each as a one-goal task `{"goals": [entry]}`:
      condition, high: a get_weather of that city and day (the forecast's answer was seen);
      director: a get_movie of that movie; best: a search_movies with only that genre that showed its best movie;
      umbrella: after a get_weather of that city and day, the todo list holds the todo its forecast asks for
        and not the other;
      complete, delete: a todo of the world's start (open, for complete) done or gone;
      watch: the list holds 'watch <title>' for the one movie of its genre and year.
    Actions: the sub-goal's own call plan (the lookup and, for state goals, the change the exploration made),
    then `finish` with the answer for a question (as the expert plays such a spec); each as the text after
    "Action:": the tool's name, a newline, then 'Action Input: {...}' (as `sample_action` writes them).
    """
    task = _TASKS.get(index, split)
    self._start(ToolTask(task.seed, (), ""))
    self._looked_up = []
    world = self._start_world = task.world()
    self._pending = [({"kind": "complete", "todo": t["title"]}, _complete_goal(t))
                     for t in world.todos if not t["done"]]
    self._pending += [({"kind": "delete", "todo": t["title"]}, _delete_goal(t)) for t in world.todos]
    for movie in world.movies:
      if len(_movies_of(world, movie["genre"], movie["year"])) == 1:
        self._pending.append(({"kind": "watch", "genre": movie["genre"], "year": movie["year"]},
                              _watch_goal(world, movie["genre"], movie["year"])))
    cities = ", ".join(sorted({c for c, _ in world.weather}))
    return (f"There is no request this time: try the tools. There are forecasts for {cities} ({_DAYS[0]} to "
            f"{_DAYS[-1]}), a todo list and a movie catalogue.")

  def _target_key_now(self) -> str:
    world = base.stable_digest(repr(self._task.world()))
    goals = json.dumps(sorted(goal.text for goal in self._task.goals), ensure_ascii=False)
    return f"tools|world={world}|goals={base.stable_digest(goals)}"

  def _explored(self, fn: str, args: dict[str, Any]) -> None:
    """After a call of an exploration: records the sub-goals it met (see `_reset_world`)."""
    world = self._start_world
    met: list[tuple[dict[str, Any], Goal]] = []
    if fn == "get_weather":
      city = next(c for c, _ in world.weather if c.lower() == args["city"].strip().lower())
      day = next(d for d in _DAYS if d.lower() == args["day"].strip().lower())
      met += [({"kind": "condition", "city": city, "day": day}, _condition_goal(world, city, day)),
              ({"kind": "high", "city": city, "day": day}, _high_goal(world, city, day))]
      if (city, day) not in self._looked_up:
        self._looked_up.append((city, day))
        self._pending.append(({"kind": "umbrella", "city": city, "day": day}, _umbrella_goal(world, city, day)))
    elif fn == "get_movie":
      movie = next(m for m in world.movies if m["title"].lower() == args["title"].strip().lower())
      met.append(({"kind": "director", "movie": movie["title"]}, _director_goal(movie)))
    elif fn == "search_movies" and set(args) == {"genre"}:
      genre = args["genre"].strip().lower()
      found = [m for m in world.movies if m["genre"] == genre]
      if found and max(found, key=lambda m: m["rating"]) in found[:8]:  # the search shows at most 8
        met.append(({"kind": "best", "genre": genre}, _best_goal(world, genre)))
    still = []
    for entry, goal in self._pending:
      (met if goal.met(self._world, None) else still).append((entry, goal))
    self._pending = still
    for entry, goal in met:
      calls = [f"{call.fn}\nAction Input: {_dumps(call.args)}" for call in goal.plan]
      calls.append(f"finish\nAction Input: {_dumps({'answer': goal.answer or ''})}")
      self._add_hindsight({"goals": [entry]}, calls, goal.text)

  def _check_feasible(self, task: ToolTask) -> None:
    """Raises EnvError unless the expert's plan meets every goal of `task` within `max_rounds` calls."""
    scratch = ToolsEnv()
    scratch._start(task)
    for _ in range(self.max_rounds):
      outcome = scratch._act(scratch._expert_turn())
      if outcome.success:
        return
      if outcome.done or outcome.observation.startswith("Error:"):
        raise base.EnvError("tools spec goals cannot all be met together (e.g. completing and deleting one todo, "
                            f"or both umbrella todos): following their plans gives {outcome.observation[:160]!r}")
    raise base.EnvError(f"tools spec goals need more than an episode's {self.max_rounds} tool calls")

  def _start(self, task: ToolTask) -> str:
    self._task = task
    self._world = task.world()
    self._answer = None
    self._done_calls = set()
    self._done_keys = set()
    self._initial_cost = self._calls_left()
    return task.request

  def _state_key(self) -> str:
    """The mutable world (the todo list and the next todo id; forecasts and movies never change), which
    sub-goals are met (1/0 in the task's order) and whether `finish` was called. What the agent has looked up
    is not part of the world: it is in the agent's context, not in the env."""
    todos = json.dumps([[t["id"], t["title"], t["done"]] for t in self._world.todos], ensure_ascii=False)
    met = "".join("1" if goal.met(self._world, self._answer) else "0" for goal in self._task.goals)
    finished = "|finished" if self._answer is not None else ""
    return f"todos={base.stable_digest(f'{todos}|{self._world.next_todo_id}')}|met={met}{finished}"

  def _calls_left(self) -> int:
    """The calls still needed to meet every sub-goal and finish, counted on the expert's plans: each call of an
    unmet sub-goal's plan not yet made (calls compared by `call_key`, a call two sub-goals share counted once),
    plus `finish`. A question's sub-goal counts as unmet until the episode succeeds (a finish that did not
    succeed ends the episode, so its answer lowers nothing); a state sub-goal (the todo list) is met as soon as
    the list says so, and one whose calls were all made but whose change was undone needs its last call again."""
    needed: set[str] = set()
    for goal in self._task.goals:
      if goal.answer is None and goal.met(self._world, None):
        continue
      calls = [call.key() for call in goal.plan if call.key() not in self._done_keys]
      needed.update(calls if calls or goal.answer is not None else [goal.plan[-1].key()])
    return len(needed) + 1

  def _measures(self) -> tuple[int, float]:
    """cost_to_go: the tool calls the expert's plan still needs, `finish` included (`_calls_left`), so that the
    sub-goals' calls in any order count alike; progress: the fraction of the start's calls no longer needed,
    1 - cost_to_go / its value at the start."""
    left = self._calls_left()
    return left, 1.0 - left / self._initial_cost

  def _progress(self) -> tuple[float, bool]:
    if not self._task.goals:  # an exploration
      return 0.0, False
    met = sum(goal.met(self._world, self._answer) for goal in self._task.goals)
    return met / len(self._task.goals), met == len(self._task.goals)

  def _act(self, text: str) -> base.Outcome:
    fn, args, error = base.parse_tool_call(text)
    if error is None:
      result, error = self._call(fn, {} if args is None else args)
    score, all_met = self._progress()
    if error is not None:
      return base.Outcome(f"Error: {error}", score)
    self._done_calls.add(fn + json.dumps(args or {}, sort_keys=True))
    self._done_keys.add(call_key(fn, args or {}))
    if self._exploring:
      self._explored(fn, args or {})
      if fn == "finish":
        return base.Outcome("Finished. The exploration is over.", 0.0, True)
      return base.Outcome(result, 0.0)
    if fn == "finish":
      verdict = "All requests are done. Success!" if all_met else "Some requests were not completed."
      return base.Outcome(f"Finished. {verdict}", score, True, all_met)
    return base.Outcome(result, score)

  def _call(self, fn: str, args: Any) -> tuple[str, str | None]:
    """Runs one tool; returns (result text, None) or ("", what was wrong and how to call it)."""
    if fn not in API:
      return "", (f"unknown tool {fn[:40]!r}. Tools: {', '.join(API)}. Write \"Action: <tool>\" then "
                  "\"Action Input: {...}\".")
    if not isinstance(args, dict):
      return "", f"Action Input for {fn} must be a JSON object: {API[fn]}."
    allowed = _REQUIRED[fn] + _OPTIONAL.get(fn, ())
    for key in _REQUIRED[fn]:
      if key not in args:
        return "", f"{fn} needs {API[fn].split(' -> ')[0]}; {key!r} is missing."
    for key, value in args.items():
      if key not in allowed:
        return "", f"{fn} takes {API[fn].split(' -> ')[0]}; unexpected argument {str(key)[:30]!r}."
      if not isinstance(value, _ARG_TYPES[key]) or isinstance(value, bool):
        return "", f"argument {key!r} of {fn} must be a {_ARG_TYPES[key].__name__}."
    return getattr(self, f"_tool_{fn}")(**args)

  def _tool_get_weather(self, city: str, day: str) -> tuple[str, str | None]:
    cities = sorted({c for c, _ in self._world.weather})
    match = [c for c in cities if c.lower() == city.strip().lower()]
    if not match:
      return "", f"no forecast for {city[:30]!r}. Cities with forecasts: {', '.join(cities)}."
    days = [d for d in _DAYS if d.lower() == day.strip().lower()]
    if not days:
      return "", f"day must be one of {', '.join(_DAYS)}."
    return _dumps(self._world.weather[(match[0], days[0])]), None

  def _tool_list_todos(self) -> tuple[str, str | None]:
    return _dumps(self._world.todos), None

  def _tool_add_todo(self, title: str) -> tuple[str, str | None]:
    title = title.strip()
    if not title or len(title) > 80:
      return "", "a todo title must have 1 to 80 characters."
    if len(self._world.todos) >= 20:
      return "", "the todo list is full (20 items)."
    new = {"id": self._world.next_todo_id, "title": title, "done": False}
    self._world.next_todo_id += 1
    self._world.todos.append(new)
    return _dumps(new), None

  def _find_todo(self, todo_id: int) -> dict[str, Any] | None:
    return next((t for t in self._world.todos if t["id"] == todo_id), None)

  def _tool_complete_todo(self, id: int) -> tuple[str, str | None]:  # noqa: A002 (the API's argument name)
    todo = self._find_todo(id)
    if todo is None:
      return "", f"no todo with id {id}; call list_todos to see the ids."
    todo["done"] = True
    return _dumps(todo), None

  def _tool_delete_todo(self, id: int) -> tuple[str, str | None]:  # noqa: A002
    todo = self._find_todo(id)
    if todo is None:
      return "", f"no todo with id {id}; call list_todos to see the ids."
    self._world.todos.remove(todo)
    return _dumps({"deleted": id}), None

  def _tool_search_movies(self, genre: str | None = None, year: int | None = None,
                          director: str | None = None) -> tuple[str, str | None]:
    found = [m for m in self._world.movies
             if (genre is None or m["genre"] == genre.strip().lower()) and (year is None or m["year"] == year)
             and (director is None or m["director"].lower() == director.strip().lower())]
    return _dumps([{"title": m["title"], "year": m["year"], "rating": m["rating"]} for m in found[:8]]), None

  def _tool_get_movie(self, title: str) -> tuple[str, str | None]:
    movie = next((m for m in self._world.movies if m["title"].lower() == title.strip().lower()), None)
    if movie is None:
      return "", f"no movie titled {title[:40]!r}; use search_movies to find titles."
    return _dumps(movie), None

  def _tool_finish(self, answer: str = "") -> tuple[str, str | None]:
    self._answer = answer
    return "", None

  def _expert_turn(self) -> str:
    for goal in self._task.goals:
      for call in goal.plan:
        if call.signature() not in self._done_calls:
          return f"{base.react_turn(call.thought, call.fn)}\nAction Input: {_dumps(call.args)}"
    answers = [goal.answer for goal in self._task.goals if goal.answer]
    if answers:
      thought = "I have everything; I report " + " and ".join(answers) + "."
    else:
      thought = "Everything requested is done."
    return f"{base.react_turn(thought, 'finish')}\nAction Input: {_dumps({'answer': '; '.join(answers)})}"

  def _sample_action(self, rng: random.Random) -> str:
    cities = sorted({c for c, _ in self._world.weather})
    calls = [("get_weather", {"city": rng.choice(cities), "day": rng.choice(_DAYS)}), ("list_todos", {}),
             ("add_todo", {"title": rng.choice(_TODOS + (_RAIN_TODO, _DRY_TODO))}),
             ("complete_todo", {"id": rng.randint(1, 5)}), ("delete_todo", {"id": rng.randint(1, 5)}),
             ("search_movies", {"genre": rng.choice(_GENRES)}),
             ("get_movie", {"title": rng.choice(self._world.movies)["title"]}),
             ("finish", {"answer": rng.choice(_CONDITIONS + _DIRECTORS)})]
    fn, args = rng.choice(calls)
    return f"{fn}\nAction Input: {_dumps(args)}"
