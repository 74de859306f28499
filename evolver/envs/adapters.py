"""How `RemoteEnv` speaks to each kind of env server: ours, AgentGym's per-env servers, and AgentEvolver's
EnvService.

An adapter turns the Env calls into one server's requests and its answers back into Env results. Ours is
uniform (`EvolverAdapter`); AgentGym's servers each differ (read from their code; ALFWorld, ScienceWorld,
WebShop, SQLGym and the ToolUsage servers are described on their adapters below):

- TextCraft: `/create` takes `{commands, goal}` and answers `{id, observation, reward, done}` (it picks a
  task at once); `/reset {id, data_idx}`; `/step {id, action}` -> `{observation, reward, done}`;
  `/close {id}` -> true (false for an unknown id), since their commit 640f8bc (older servers answer 404).
- BabyAI: `/create` takes no body and answers `{id}`; `/reset {id, data_idx}` and `/step` answer with an
  extra `score` (their client's reward); a step after the end answers an error; `/close {id}` as TextCraft's.
- LMRL maze and wordle, one server under `/maze` and `/wordle`: `/create` -> `{id}`; maze resets with
  `{id, game}` -> `{observation}`, wordle with `{id, seed}`; steps answer per-step rewards (1 when solved);
  no `/close`.
- All: errors come as HTTP 200 with `{"error": ...}` (a bad body gets FastAPI's 422, an unknown route 404
  `{"detail": "Not Found"}`); `GET /` answers "This is environment TextCraft." (BabyAI, LMRL-Gym); sessions
  live until closed (no idle reaping); the ReAct parsing happens in their client, so the adapter sends only the
  action: what follows the last `Action:`, cleaned up the way AgentGym's own clients clean it.

Their servers have no expert, no instruction, no splits, no task specs, no state keys, no explorations and no
target keys: the adapter carries an instruction of its own, and the caller maps our splits onto their index
space with `task_ranges`. AgentEvolver's EnvService (`EnvServiceAdapter`) lists task ids per split of its own,
keys sessions on instance ids the client may choose, and scores an episode on `/evaluate`.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Protocol

from evolver.envs import base


class TransportError(ConnectionError):
  """The request did not complete (refused, reset, timed out, or a 5xx/429 answer): worth retrying.

  `maybe_delivered` is False only when the server certainly did not handle the request (the connection was
  refused, it broke before the whole request was sent, or the server answered 429/503), so resending it
  cannot apply it twice; see `remote.HttpClient` for how each failure is classified.
  """

  def __init__(self, message: str, maybe_delivered: bool = True):
    super().__init__(message)
    self.maybe_delivered = maybe_delivered


class UnreachableError(TransportError):
  """Every server URL kept failing through all retries."""


class SessionLostError(RuntimeError):
  """The server does not know our session (it restarted, or reaped it): recreate and replay."""


class RequestError(base.EnvError):
  """The server refused the request as malformed (a 4xx other than 404/409)."""


class ProtocolMismatchError(ValueError):
  """The server does not speak the protocol the client was told to expect (e.g. an AgentGym server given as
  one of ours): the message says which protocol was expected, what answered, and what to pass instead."""


class Http(Protocol):
  url: str

  def request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> tuple[int, Any]:
    ...


def _check(status: int, answer: Any, what: str) -> Any:
  """Maps our server's status codes to the Env's exceptions."""
  if status == 200:
    return answer
  message = answer.get("error", answer) if isinstance(answer, dict) else answer
  if status == 404:
    raise SessionLostError(f"{what}: {message}")
  if status == 409:
    raise base.EpisodeNotStartedError(f"{what}: {message}")
  if status == 429 or status >= 500:
    # 429 and 503 mean "not handled"; other 5xx (a proxy's 502/504) may hide a handled request.
    raise TransportError(f"{what}: HTTP {status}: {message}", maybe_delivered=status not in (429, 503))
  raise RequestError(f"{what}: HTTP {status}: {message}")


class Adapter:
  """One server kind. `info` gives the Env's static fields; the rest act on one server session."""

  kind = ""
  has_expert = False
  takes_specs = False  # whether the server runs tasks given as specs (`POST /reset {id, spec}`)
  has_state_keys = False  # whether the server answers `GET /state` with the env's true state key
  ends_at_max_rounds = False  # whether the server itself ends episodes after max_rounds
  has_close = False  # whether the server has a route that ends a session
  explores = False  # whether the server opens worlds without their goal and answers `GET /hindsight`

  def info(self, http: Http) -> dict[str, Any]:
    raise NotImplementedError

  def create(self, http: Http) -> int:
    raise NotImplementedError

  def reset(self, http: Http, session: int, data_idx: int, split: str) -> str:
    raise NotImplementedError

  def reset_spec(self, http: Http, session: int, spec: dict[str, Any]) -> str:
    raise NotImplementedError(f"{self.kind} servers take no task specs")

  def step(self, http: Http, session: int, turn: str) -> tuple[str, float, bool, dict[str, Any]]:
    raise NotImplementedError

  def expert(self, http: Http, session: int) -> str:
    raise NotImplementedError(f"{self.kind} servers have no scripted expert")

  def state(self, http: Http, session: int) -> str:
    raise NotImplementedError(f"{self.kind} servers have no state keys")

  def close(self, http: Http, session: int) -> None:
    """Ends the session on the server; raises as the other calls do (the caller decides what to ignore)."""
    raise NotImplementedError(f"{self.kind} servers cannot close a session")

  def reset_world(self, http: Http, session: int, data_idx: int, split: str, max_rounds: int | None) -> str:
    raise NotImplementedError(f"{self.kind} servers cannot open a world without its goal (no explorations)")

  def hindsight(self, http: Http, session: int) -> list[dict[str, Any]]:
    raise NotImplementedError(f"{self.kind} servers have no hindsight tasks (no explorations)")

  def target_key(self, http: Http, task: dict[str, Any]) -> str:
    raise NotImplementedError(f"{self.kind} servers have no target keys")


_INFO_FIELDS = {"name", "version", "instruction", "max_rounds", "num_tasks"}
_HELLO = re.compile(r"This is environment (.+)\.")


class EvolverAdapter(Adapter):
  """Our own server (`python -m launch.serve_env`)."""

  kind = "evolver"
  has_expert = True
  takes_specs = True
  has_state_keys = True
  ends_at_max_rounds = True
  has_close = True
  explores = True

  def info(self, http: Http) -> dict[str, Any]:
    """Our server's `/info`; raises ProtocolMismatchError when another kind of server answers."""
    status, answer = http.request("GET", "/info")
    if status == 429 or (status >= 500 and status != 501):
      _check(status, answer, "GET /info")  # busy or starting: TransportError, retried
    if status == 200 and isinstance(answer, dict) and _INFO_FIELDS <= set(answer):
      return answer
    raise ProtocolMismatchError(_not_ours(http, status, answer))

  def create(self, http: Http) -> int:
    return int(_check(*http.request("POST", "/create", {}), "POST /create")["id"])

  def reset(self, http: Http, session: int, data_idx: int, split: str) -> str:
    answer = _check(*http.request("POST", "/reset", {"id": session, "data_idx": data_idx, "split": split}),
                    "POST /reset")
    return answer["observation"]

  def reset_spec(self, http: Http, session: int, spec: dict[str, Any]) -> str:
    answer = _check(*http.request("POST", "/reset", {"id": session, "spec": spec}), "POST /reset")
    return answer["observation"]

  def step(self, http: Http, session: int, turn: str) -> tuple[str, float, bool, dict[str, Any]]:
    answer = _check(*http.request("POST", "/step", {"id": session, "action": turn}), "POST /step")
    return answer["observation"], float(answer["reward"]), bool(answer["done"]), dict(answer["info"])

  def expert(self, http: Http, session: int) -> str:
    return _check(*http.request("GET", f"/expert?id={session}"), "GET /expert")

  def state(self, http: Http, session: int) -> str:
    status, answer = http.request("GET", f"/state?id={session}")
    if status == 404 and "unknown route" in str(answer):  # not a lost session: a server from before /state
      raise NotImplementedError(f"this evolver env server has no GET /state (it predates state keys): {answer}")
    return _check(status, answer, "GET /state")

  def close(self, http: Http, session: int) -> None:
    try:
      _check(*http.request("POST", "/close", {"id": session}), "POST /close")
    except SessionLostError:
      pass

  def reset_world(self, http: Http, session: int, data_idx: int, split: str, max_rounds: int | None) -> str:
    body = {"id": session, "data_idx": data_idx, "split": split, "explore": True}
    if max_rounds is not None:
      body["max_rounds"] = max_rounds
    answer = _check(*http.request("POST", "/reset", body), "POST /reset")
    if answer.get("explore") is not True:  # a server from before explorations ignores the field
      raise NotImplementedError("this evolver env server predates explorations: it reset the task with its goal")
    return answer["observation"]

  def hindsight(self, http: Http, session: int) -> list[dict[str, Any]]:
    status, answer = http.request("GET", f"/hindsight?id={session}")
    if status == 404 and "unknown route" in str(answer):  # not a lost session: a server from before /hindsight
      raise NotImplementedError(f"this evolver env server has no GET /hindsight (it predates explorations): {answer}")
    return _check(status, answer, "GET /hindsight")

  def target_key(self, http: Http, task: dict[str, Any]) -> str:
    status, answer = http.request("POST", "/target_key", task)
    if status == 404:  # no session involved: only a server from before /target_key answers 404
      raise NotImplementedError(f"this evolver env server has no POST /target_key (it predates target keys): {answer}")
    return _check(status, answer, "POST /target_key")


def _not_ours(http: Http, status: int, answer: Any) -> str:
  """Why a server whose `/info` is not ours cannot be used with server="evolver", and what to pass instead."""
  shown = answer if isinstance(answer, str) else repr(answer)
  message = (f"{http.url} does not speak the evolver env protocol that server='evolver' expects "
             f"(`python -m launch.serve_env`): GET {http.url}/info answered HTTP {status} {shown[:200]}")
  try:
    hello_status, hello = http.request("GET", "/")
  except TransportError:
    hello_status, hello = 0, None
  match = _HELLO.fullmatch(hello) if hello_status == 200 and isinstance(hello, str) else None
  if match is None:
    return (f"{message}. If it is one of AgentGym's env servers, use server='agentgym' with env_name (one of "
            f"{sorted(AGENTGYM_ADAPTERS)}) and task_ranges={{'train': (start, stop), 'eval': (start, stop)}}.")
  names = AGENTGYM_HELLO_NAMES.get(match.group(1))
  if names is None:
    return (f"{message}. It looks like an AgentGym server (GET {http.url}/ answered {hello!r}), but there is no "
            f"AgentGym adapter for it; have {sorted(AGENTGYM_ADAPTERS)}.")
  env_names = " or ".join(repr(name) for name in names)
  return (f"{message}. It looks like an AgentGym server (GET {http.url}/ answered {hello!r}): use "
          f"RemoteEnv({http.url!r}, env_name={env_names}, server='agentgym', "
          f"task_ranges={{'train': (start, stop), 'eval': (start, stop)}}), the ranges in its data-index space.")


# ----------------------------------------------------------------------------------------------------------
# AgentGym's servers.
# ----------------------------------------------------------------------------------------------------------

_LOST_SESSION = re.compile(r"id \S+ is not valid|has been deleted|not valid", re.IGNORECASE)


def _clamp(value: Any) -> float:
  """A server's reward or score as a reward in [0, 1]."""
  return min(1.0, max(0.0, float(value)))


class AgentGymAdapter(Adapter):
  """Shared by AgentGym's servers: 200 + {"error"} answers, one index space, ReAct parsed client-side."""

  kind = "AgentGym's"
  env_name = ""
  prefix = ""
  max_rounds = 20
  reset_key = "data_idx"
  instruction = ""

  def info(self, http: Http) -> dict[str, Any]:
    return {"name": self.env_name, "version": f"agentgym-{self.env_name}", "instruction": self.instruction,
            "max_rounds": self.max_rounds}

  def _post(self, http: Http, route: str, payload: dict[str, Any] | None) -> dict[str, Any]:
    status, answer = http.request("POST", self.prefix + route, payload)
    if status == 422:  # FastAPI's validation error: our request is wrong, not the server's state
      raise RequestError(f"POST {self.prefix}{route}: HTTP 422: {answer}")
    answer = _check(status, answer, f"POST {self.prefix}{route}")
    if isinstance(answer, dict) and "error" in answer:
      message = str(answer["error"])
      if _LOST_SESSION.search(message):
        raise SessionLostError(f"POST {self.prefix}{route}: {message}")
      raise RequestError(f"POST {self.prefix}{route}: {message}")
    return answer

  def create(self, http: Http) -> int:
    return int(self._post(http, "/create", None)["id"])

  def reset(self, http: Http, session: int, data_idx: int, split: str) -> str:
    return self._post(http, "/reset", {"id": session, self.reset_key: data_idx})["observation"]

  def action(self, turn: str) -> str:
    """What their server expects from a whole ReAct turn."""
    return base.parse_action(turn)

  def close(self, http: Http, session: int) -> None:
    if not self.has_close:
      raise NotImplementedError(f"AgentGym's {self.env_name} server has no /close route")
    self._post(http, "/close", {"id": session})  # true, or false for an id it does not know

  def step(self, http: Http, session: int, turn: str) -> tuple[str, float, bool, dict[str, Any]]:
    answer = self._post(http, "/step", {"id": session, "action": self.action(turn)})
    reward = _clamp(answer.get("reward", 0.0))
    return answer["observation"], reward, bool(answer["done"]), {"success": reward >= 1.0}


class TextCraftAdapter(AgentGymAdapter):
  env_name = "textcraft"
  has_close = True
  instruction = ("You are given crafting recipes to craft items in Minecraft. Crafting commands are of the "
                 "format \"craft [target object] using [input ingredients]\". Each round you get an observation "
                 "and respond with one action: \"get N item\" fetches raw ingredients, \"inventory\" shows what "
                 "you carry, \"craft N X using N A, N B\" applies one of the given crafting commands. Always give "
                 "quantities.\n\nEach turn, reply with a short thought and one action:\nThought: <your reasoning>"
                 "\nAction: <one action>\n\nExample:\nThought: I need 1 lapis lazuli for the blue dye.\n"
                 "Action: get 1 lapis lazuli")

  def create(self, http: Http) -> int:
    # Their /create builds an env and picks a task at once; our reset picks the task we want afterwards.
    return int(self._post(http, "/create", {"commands": None, "goal": None})["id"])

  def action(self, turn: str) -> str:
    # As their client: keep letters, digits, commas and spaces; "look" is "inventory" there.
    action = " ".join(re.sub(r"[^A-Za-z0-9, ]+", "", base.parse_action(turn)).split())
    return "inventory" if action.lower() == "look" else action


class BabyAIAdapter(AgentGymAdapter):
  env_name = "babyai"
  has_close = True
  instruction = ("You are an exploration master that wants to finish every goal you are given. You are placed "
                 "in a room and must reach the goal with actions: turn right, turn left, move forward, go to "
                 "<obj> <id>, pick up <obj> <id>, go through <door> <id> (an open door), toggle and go through "
                 "<door> <id>, toggle (the closed or locked door in front of you; a locked one needs its key).\n\n"
                 "Each turn, reply with a short thought and one action:\nThought: <your reasoning>\n"
                 "Action: <one action>\n\nExample:\nThought: The red ball is ahead.\nAction: go to red ball 1")

  def step(self, http: Http, session: int, turn: str) -> tuple[str, float, bool, dict[str, Any]]:
    answer = self._post(http, "/step", {"id": session, "action": self.action(turn).lower()})
    # Their client reports `score` as the reward; BabyAI's reward is positive only on success.
    reward = _clamp(answer.get("score", answer.get("reward", 0.0)))
    done = bool(answer["done"])
    return answer["observation"], reward, done, {"success": done and reward > 0.0}


class LmrlMazeAdapter(AgentGymAdapter):
  env_name = "maze"
  prefix = "/maze"
  reset_key = "game"
  instruction = ("You are an expert maze solver. Reach the goal in as few steps as possible. Each step you are "
                 "told where the goal is, your position, and the walls around you. Moving right increases your "
                 "y position by 1; moving down increases your x position by 1. Actions: move up, move down, "
                 "move left, move right.\n\nEach turn, reply with a short thought and one action:\n"
                 "Thought: <your reasoning>\nAction: <one action>\n\nExample:\nThought: The goal is below me.\n"
                 "Action: move down")

  def action(self, turn: str) -> str:
    action = base.parse_action(turn).lower()
    return f"move {action}" if action in ("up", "down", "left", "right") else action


class LmrlWordleAdapter(AgentGymAdapter):
  env_name = "wordle"
  prefix = "/wordle"
  reset_key = "seed"
  max_rounds = 8
  instruction = ("Let's play Wordle. Guess the hidden 5-letter word in at most 6 tries. Type a guess as five "
                 "space-separated letters, like \"s h i r e\". After each guess you get one letter per position: "
                 "g (right letter, right place), y (in the word, elsewhere), b (not in the word). Invalid words "
                 "get \"invalid word\".\n\nEach turn, reply with a short thought and one action:\n"
                 "Thought: <your reasoning>\nAction: <your guess>\n\nExample:\nThought: A common opener.\n"
                 "Action: c r a t e")

  def action(self, turn: str) -> str:
    action = base.parse_action(turn).lower().strip()
    if len(action) == 5 and action.isalpha():
      return " ".join(action)  # their env wants space-separated letters
    return action


def _one_line(text: str) -> str:
  return " ".join(text.split())


class AlfWorldAdapter(AgentGymAdapter):
  """AgentGym's ALFWorld server (agentenv-alfworld/agentenv_alfworld/server.py and env_wrapper.py).

  `/create` takes no body and answers `{id}`; `/reset {id, game, world_type}` (world_type one of "Text",
  "Embody", "Hybrid"; their client sends "Text") answers `{id, observation, available_actions, task_type}`;
  `/step {id, action}` answers `{observation, reward, available_actions, done}`, the reward being the game's
  `won` flag (0 or 1); a step after the end answers `{"error": "The task with environment N has finished."}`;
  no `/close` route (their client's close gets 404); `GET /` answers "This is environment AlfWorld.". Game
  indices run over the games of their configs/mappings_train.json, then those of mappings_test.json. Their client
  shows the reset observation followed by "AVAILABLE ACTIONS: " and the admissible commands joined by commas,
  and each step's observation alone.
  """

  env_name = "alfworld"
  reset_key = "game"
  max_rounds = 30
  instruction = ("You are in a household and must complete the task you are given. Each round you see what "
                 "happened and the actions you may take; reply with one of them, e.g. \"go to countertop 1\", "
                 "\"take mug 1 from countertop 1\", \"put mug 1 in/on sinkbasin 1\", \"open fridge 1\".\n\n"
                 "Each turn, reply with a short thought and one action:\nThought: <your reasoning>\n"
                 "Action: <one action>\n\nExample:\nThought: The mug may be on the countertop.\n"
                 "Action: go to countertop 1")

  def reset(self, http: Http, session: int, data_idx: int, split: str) -> str:
    answer = self._post(http, "/reset", {"id": session, "game": data_idx, "world_type": "Text"})
    return f"{answer['observation']}\nAVAILABLE ACTIONS: {','.join(answer.get('available_actions', []))}"

  def step(self, http: Http, session: int, turn: str) -> tuple[str, float, bool, dict[str, Any]]:
    answer = self._post(http, "/step", {"id": session, "action": self.action(turn)})
    reward = _clamp(answer.get("reward", 0.0))
    return answer["observation"], reward, bool(answer["done"]), {"success": reward >= 1.0}


# ScienceWorld's instruction, shared by `SciWorldAdapter` and the built-in sciworld env (evolver.envs.sciworld), so
# that a policy reads the same text whichever way it plays ScienceWorld.
SCIWORLD_INSTRUCTION = (
    "You are a scientist in a simulated world and must complete the science task you are given. "
    "Act with commands such as \"look around\", \"go to kitchen\", \"open door to hallway\", "
    "\"pick up thermometer\", \"focus on substance in beaker\", \"use thermometer on water\", "
    "\"wait1\" and \"inventory\". Focus only on what the task asks: a wrong focus fails the task.\n\n"
    "Each turn, reply with a short thought and one action:\nThought: <your reasoning>\n"
    "Action: <one action>\n\nExample:\nThought: I should find the kitchen first.\n"
    "Action: go to kitchen")


class SciWorldAdapter(AgentGymAdapter):
  """AgentGym's ScienceWorld server (agentenv-sciworld/agentenv_sciworld/server.py and environment.py).

  `/create` takes no body and answers `{id}`; `/reset {id, data_idx}` answers `{task_name, var_num,
  task_description, observation, reward, score, deleted, done}` (it loads the task and looks around); `/step {id,
  action}` answers `{observation, reward, score, done}` where `reward` is the change of `score` and `score` runs
  to 100; their client reports `score` as the reward and shows the task description, a newline and the
  observation after a reset. Errors are 200 `{"error"}` ("The id N is not valid.", "... has finished.", "...
  has been deleted."); `/close {id}` answers true, but raises (HTTP 500) for an unknown or closed id; `GET /`
  answers "This is environment ScienceWorld.". Data indices run over every (task, variation) pair of
  ScienceWorld's tasks but seven (5-1, 5-2, 9-1, 9-2, 9-3, 10-1, 10-2), in the library's task order.
  """

  env_name = "sciworld"
  has_close = True
  max_rounds = 30
  instruction = SCIWORLD_INSTRUCTION  # the built-in sciworld env (evolver.envs.sciworld) shows the same

  def reset(self, http: Http, session: int, data_idx: int, split: str) -> str:
    answer = self._post(http, "/reset", {"id": session, "data_idx": data_idx})
    return f"{answer['task_description']}\n{answer['observation']}"

  def step(self, http: Http, session: int, turn: str) -> tuple[str, float, bool, dict[str, Any]]:
    answer = self._post(http, "/step", {"id": session, "action": self.action(turn)})
    score = float(answer.get("score", 0.0))
    done = bool(answer["done"])
    return answer["observation"], _clamp(score / 100.0), done, {"success": done and score >= 100.0}


class EnvIdxAdapter(AgentGymAdapter):
  """AgentGym's servers keyed on `env_idx` (WebShop, SQLGym and the ToolUsage servers).

  They answer `/create` with a bare integer, take `{env_idx, ...}` bodies and `GET /observation?env_idx=`, list
  their live ids at `GET /list_envs`, answer `GET /` with "ok", and have no `{"error"}` convention: an unknown
  id raises a KeyError there, which uvicorn answers as HTTP 500 "Internal Server Error". On a 500 the adapter
  asks `/list_envs` whether the id still lives: if not the session was lost (a restart), otherwise the server's
  env failed on the request.
  """

  create_body: dict[str, Any] | None = None

  def _request(self, http: Http, method: str, route: str, payload: dict[str, Any] | None, session: int | None) -> Any:
    status, answer = http.request(method, route, payload)
    if status == 500 and session is not None:
      live_status, live = http.request("GET", "/list_envs")
      if live_status == 200 and isinstance(live, list) and session not in live:
        raise SessionLostError(f"{method} {route}: env_idx {session} is not among the server's envs {live[:20]}")
      raise RequestError(f"{method} {route}: HTTP 500: the server's env failed on the request: {answer}")
    if status == 422:
      raise RequestError(f"{method} {route}: HTTP 422: {answer}")
    return _check(status, answer, f"{method} {route}")

  def create(self, http: Http) -> int:
    answer = self._request(http, "POST", "/create", self.create_body, None)
    if isinstance(answer, bool) or not isinstance(answer, int):
      raise ProtocolMismatchError(f"{http.url}/create answered {answer!r}, not the bare env_idx that AgentGym's "
                                  f"{self.env_name} server answers")
    return answer

  def observe(self, http: Http, session: int) -> str:
    return self._request(http, "GET", f"/observation?env_idx={session}", None, session)

  def step(self, http: Http, session: int, turn: str) -> tuple[str, float, bool, dict[str, Any]]:
    answer = self._request(http, "POST", "/step", {"env_idx": session, "action": self.action(turn)}, session)
    observation = answer["observation"] if "observation" in answer else answer["state"]
    reward = _clamp(answer.get("reward", 0.0))
    done = bool(answer["done"])
    return observation, reward, done, {"success": done and reward >= 1.0}


class WebShopAdapter(EnvIdxAdapter):
  """AgentGym's WebShop server (agentenv-webshop/agentenv_webshop/server.py, environment.py and model.py).

  `POST /create` (no body) answers a bare integer drawn at random from [0, 48950076] (ids do not restart at 0,
  and a clash replaces an env); once 8000 envs exist it hands out existing ids again, in turn. `POST /reset
  {env_idx, session_id}` answers `[observation, null]`, and their client then shows `GET /observation?env_idx=`;
  `POST /step {env_idx, action}` answers `{state, reward, done, info: null}`, actions being `search[keywords]`
  or `click[button]`, the reward (in [0, 1]) coming with `click[buy now]`. No `/close` route.
  """

  env_name = "webshop"
  max_rounds = 15
  instruction = ("You are shopping on a web store for the product the instruction describes. Act with "
                 "\"search[keywords]\" when the page has a search bar, or \"click[button]\" to click one of the "
                 "buttons shown in brackets (a product, an option such as a size, \"Next >\", \"< Prev\", "
                 "\"Back to Search\" or \"Buy Now\"). Buying ends the episode.\n\nEach turn, reply with a short "
                 "thought and one action:\nThought: <your reasoning>\nAction: <one action>\n\nExample:\n"
                 "Thought: I should search for the product first.\nAction: search[red running shoes]")

  def reset(self, http: Http, session: int, data_idx: int, split: str) -> str:
    self._request(http, "POST", "/reset", {"env_idx": session, "session_id": data_idx}, session)
    return self.observe(http, session)


class SqlGymAdapter(EnvIdxAdapter):
  """AgentGym's SQLGym server (agentenv-sqlgym/agentenv_sqlgym/server.py, environment.py and model.py).

  `POST /create` (no body) answers a bare integer drawn at random from [0, 489576]; once 8 envs exist it hands
  out existing ids again, in turn. `POST /reset {env_idx, item_id}` answers `[observation, null]`; item ids
  [0, 9428) are BIRD's train set and [9428, 10962) its dev set, and an id outside both raises (HTTP 500); their
  client then shows `GET /observation?env_idx=`. `POST /step {env_idx, action}` takes one SQL statement (their
  client sends what is inside the last ```sql block) and answers `{state, reward, done, info}`, the execution
  result cut to 100 characters and "...". Behind it, sqlgym's `SqlGymEnv` (KYLN24/sqlgym, sqlgym/sqlgym.py)
  shows the question as the observation, ends the episode at the first statement, and rewards 1 when the
  statement's rows equal the ground truth's as sets (0 otherwise, and for an SQL error, whose message is the
  state); `info` carries the ground-truth SQL, which the adapter drops.
  """

  env_name = "sqlgym"
  max_rounds = 5
  instruction = ("You are given a description of a SQLite database and a question. Explain the problem and your "
                 "solution, then give one SQL statement, on one line, in a ```sql block, that answers the "
                 "question.\n\nEach turn, reply with a short thought and one action:\nThought: <your reasoning>\n"
                 "Action: ```sql\n<one SQL statement>\n```\n\nExample:\nThought: I count the rows of singer.\n"
                 "Action: ```sql\nSELECT COUNT(*) FROM singer;\n```")

  def action(self, turn: str) -> str:
    if "```sql" in turn:
      return turn.split("```sql")[-1].split("```")[0].strip()
    return base.action_text(turn).strip("`").strip()

  def reset(self, http: Http, session: int, data_idx: int, split: str) -> str:
    self._request(http, "POST", "/reset", {"env_idx": session, "item_id": data_idx}, session)
    return self.observe(http, session)


_TOOL_INPUT = re.compile(r"\s*with\s*$", re.IGNORECASE)


class ToolUsageAdapter(EnvIdxAdapter):
  """AgentGym's ToolUsage servers: weather, movie, todo, sheet and academia, one protocol
  (agentenv-tool/agentenv_<name>/<name>_server.py, <name>_environment.py, <name>_model.py, and
  agentenv-tool/Toolusage/toolusage/environment/<name>_env.py, utils/tool/helpers.py).

  `POST /create {id}` needs a body (`id`, a task index; their client sends 0) and answers a bare integer env_idx
  counting from 0; `POST /reset {env_idx, id}` answers the observation as a string ("Now new trial starts.\\nYou
  should perform actions to accomplish the goal: <goal>\\nGive me one action."); `POST /step {env_idx, action}`
  answers `{observation, reward, done}`. The server parses the turn itself: it wants the last line to read
  `Action: <name> with Action Input: <arguments>`, reads the arguments with Python's `eval`, and answers a format
  error otherwise; an action whose text holds "finish" or "Finish" ends the episode. The reward is the env's
  progress rate (the fraction of ground-truth sub-goals met, never decreasing), except that weather's server
  reports 1.0 for any progress and todo's reports, once done, 1 only when the progress is 1 and the todo state
  equals the ground truth. A step after the end is still played. Their servers do not send the tool list (their
  client's first message holds it): the instruction says how to ask for it.
  """

  create_body = {"id": 0}
  max_rounds = 20

  @property
  def instruction(self) -> str:
    return (f"You are an autonomous agent using the {self.env_name} tools to achieve the goal you are given. "
            "Call one tool per turn; \"check_valid_actions\" lists the tools where the env offers it. When you "
            "have the answer, call \"finish\" with it.\n\nEach turn, reply with a short thought and one tool "
            "call:\nThought: <your reasoning>\nAction: <tool name> with Action Input: <JSON arguments>\n\n"
            "Example:\nThought: I have the answer.\nAction: finish with Action Input: {\"answer\": 42}")

  def action(self, turn: str) -> str:
    name, arguments, error = base.parse_tool_call(turn)
    name = _TOOL_INPUT.sub("", name)
    if error is not None:  # let their server say what is wrong with the input
      match = base._INPUT_MARK.search(base.action_text(turn))  # pylint: disable=protected-access
      raw = base.action_text(turn)[match.end():] if match else ""
      return f"Action: {name} with Action Input: {_one_line(raw)}"
    if arguments is None:
      arguments = {}
    text = json.dumps(arguments, ensure_ascii=False)
    if re.search(r"\b(true|false|null)\b", text):  # their server reads the input with Python's eval
      text = repr(arguments)
    return f"Action: {name} with Action Input: {text}"

  def reset(self, http: Http, session: int, data_idx: int, split: str) -> str:
    return self._request(http, "POST", "/reset", {"env_idx": session, "id": data_idx}, session)


class WeatherAdapter(ToolUsageAdapter):
  env_name = "weather"


class MovieAdapter(ToolUsageAdapter):
  env_name = "movie"


class TodoAdapter(ToolUsageAdapter):
  env_name = "todo"


class SheetAdapter(ToolUsageAdapter):
  env_name = "sheet"


class AcademiaAdapter(ToolUsageAdapter):
  env_name = "academia"


AGENTGYM_ADAPTERS: dict[str, type[AgentGymAdapter]] = {
    "textcraft": TextCraftAdapter, "babyai": BabyAIAdapter, "maze": LmrlMazeAdapter, "wordle": LmrlWordleAdapter,
    "alfworld": AlfWorldAdapter, "sciworld": SciWorldAdapter, "webshop": WebShopAdapter, "sqlgym": SqlGymAdapter,
    "weather": WeatherAdapter, "movie": MovieAdapter, "todo": TodoAdapter, "sheet": SheetAdapter,
    "academia": AcademiaAdapter}

# What AgentGym's servers call themselves on `GET /` ("This is environment <name>.") -> our env names. WebShop,
# SQLGym and the ToolUsage servers answer "ok" instead.
AGENTGYM_HELLO_NAMES: dict[str, tuple[str, ...]] = {
    "TextCraft": ("textcraft",), "BabyAI": ("babyai",), "LMRL-Gym": ("maze", "wordle"), "AlfWorld": ("alfworld",),
    "ScienceWorld": ("sciworld",)}


# ----------------------------------------------------------------------------------------------------------
# AgentEvolver's EnvService.
# ----------------------------------------------------------------------------------------------------------

_AGENTEVOLVER_INSTRUCTIONS = {
    "appworld": ("You act for a user through the apps of AppWorld by writing Python code that a REPL runs. Each "
                 "turn, write one small chunk of code in a ```python block; call apis.supervisor.complete_task() "
                 "(with answer=... when the task asks for information) when you are done. The environment's first "
                 "message explains the APIs."),
    "bfcl": ("You answer the user with the functions listed in the environment's first message. To call one, "
             "write <tool_call>{\"name\": <function name>, \"arguments\": <JSON object>}</tool_call>; a turn "
             "without a call ends your answer to the current question and brings the next one."),
}
# The service's split names (AppWorld's `load_task_ids` splits; BFCL's split-ids file from bfcl_dataprocess.py).
_AGENTEVOLVER_SPLITS = {"appworld": {"train": "train", "eval": "dev"}, "bfcl": {"train": "train", "eval": "test"}}
_INSTANCE_LOST = re.compile(r"Instance \S+ not found")


class EnvServiceAdapter(Adapter):
  """AgentEvolver's EnvService (modelscope/AgentEvolver, env_service/env_service.py, env_client.py, interface.md,
  and environments/appworld/appworld_env.py, environments/bfcl/bfcl_env.py).

  Every route is a POST of `{env_type, task_id, instance_id, messages, params}` (FastAPI; any field may be left
  out). `/get_env_profile {env_type, params: {split}}` -> `{success: true, data: [task ids]}` (strings);
  `/create {env_type, task_id, instance_id}` starts the task on a new instance (the client may name it; a name
  already in use replaces that instance without closing it) -> `{success, data: {state: [{role, content}, ...],
  info: {instance_id, task_id, ...}}}` (a system message with the env's prompt and tools, then the user's task);
  `/step {instance_id, messages: {role: "assistant", content}, params}` -> `{success, data: {state: [{role,
  content, ...}], reward, is_terminated, info}}`, the env parsing the content itself (AppWorld runs the first
  ```python block; BFCL reads `<tool_call>{json}</tool_call>` calls, answers a turn without calls with the next
  question, and ends with "[CONVERSATION_COMPLETED]"); the reward comes when the episode ends (AppWorld: the
  fraction of its tests passed; BFCL: 1 or 0); `/evaluate {instance_id, params: {sparse}}` -> `{success, data:
  score}`; `/release {instance_id}` -> `{success: true|false, data: null}` (false for an unknown instance);
  `GET /healthz` -> "OK". Errors: HTTP 400 `{"detail": "Instance <id> not found!"}` for an unknown instance
  (never created, released, reaped after an hour idle, or lost in a restart) and for a missing field, HTTP 500
  `{"detail": <traceback>}` when the env raises, FastAPI's 422 for a body of the wrong shape. AgentEvolver's own
  client retries each call 3 times and then returns a made-up fallback answer (an "empty task", a zero score);
  the adapter raises instead. AppWorld's step reward is the fraction of tests passed even when the step's params
  ask for `sparse` (its step hands the params to `evaluate` as its messages argument).

  Our session is the instance id, chosen here; `reset` (re)creates the instance on the task, releasing the one it
  replaces, and `close` releases it. Our splits map to the service's own (`task_splits`; by default AppWorld's
  "train" and "dev", BFCL's "train" and "test"), our indices to the positions in its task-id lists.
  """

  kind = "AgentEvolver's"
  has_close = True

  def __init__(self, env_type: str, task_splits: dict[str, str] | None = None, max_rounds: int = 30):
    self.env_type = env_type
    if task_splits is None and env_type not in _AGENTEVOLVER_SPLITS:
      raise ValueError(f"no default splits for AgentEvolver env_type {env_type!r} (have {sorted(_AGENTEVOLVER_SPLITS)})"
                       ": pass task_splits={'train': <its train split>, 'eval': <its held-out split>}")
    self.task_splits = dict(task_splits or _AGENTEVOLVER_SPLITS[env_type])
    if set(self.task_splits) != set(base.SPLITS):
      raise ValueError(f"task_splits maps exactly 'train' and 'eval' to the service's split names, e.g. "
                       f"{{'train': 'train', 'eval': 'dev'}}; got {task_splits!r}")
    self.max_rounds = max_rounds
    self.task_ids: dict[str, list[str]] = {}
    self._live: set[str] = set()

  def _post(self, http: Http, route: str, body: dict[str, Any]) -> Any:
    status, answer = http.request("POST", route, {"env_type": self.env_type, **body})
    detail = answer.get("detail") if isinstance(answer, dict) else None
    if status == 400 and _INSTANCE_LOST.search(str(detail)):
      raise SessionLostError(f"POST {route}: {detail}")
    if status in (400, 422) or (status == 500 and detail is not None):
      shown = str(detail).strip().splitlines()[-1] if detail else answer  # a traceback's last line says what
      raise RequestError(f"POST {route} ({self.env_type}): HTTP {status}: {shown}")
    answer = _check(status, answer, f"POST {route}")
    if not isinstance(answer, dict) or "success" not in answer:
      raise ProtocolMismatchError(f"{http.url}{route} answered {str(answer)[:200]!r}, not AgentEvolver's "
                                  "EnvService {success, data}")
    return answer

  def info(self, http: Http) -> dict[str, Any]:
    for split, name in self.task_splits.items():
      ids = self._post(http, "/get_env_profile", {"params": {"split": name}})["data"]
      if not isinstance(ids, list) or not ids:
        raise base.EnvError(f"{http.url} lists no {self.env_type} tasks for split {name!r} (our {split!r})")
      self.task_ids[split] = [str(task_id) for task_id in ids]
    instruction = _AGENTEVOLVER_INSTRUCTIONS.get(
        self.env_type, "Solve the task the environment's first messages describe; it answers each of your turns.")
    return {"name": self.env_type, "version": f"agentevolver-{self.env_type}", "instruction": instruction,
            "max_rounds": self.max_rounds, "num_tasks": {split: len(ids) for split, ids in self.task_ids.items()}}

  def create(self, http: Http) -> str:
    return f"evolver-{uuid.uuid4().hex}"  # the service starts an instance only with its task: see reset

  def reset(self, http: Http, session: str, data_idx: int, split: str) -> str:
    if session in self._live:
      self.close(http, session)
    data = self._post(http, "/create", {"task_id": self.task_ids[split][data_idx], "instance_id": session})["data"]
    self._live.add(session)
    return _messages_text(data["state"])

  def step(self, http: Http, session: str, turn: str) -> tuple[str, float, bool, dict[str, Any]]:
    body = {"instance_id": session, "messages": {"role": "assistant", "content": turn}, "params": {}}
    data = self._post(http, "/step", body)["data"]
    reward = _clamp(data.get("reward") or 0.0)
    done = bool(data.get("is_terminated"))
    return _messages_text(data["state"]), reward, done, {"success": done and reward >= 1.0}

  def evaluate(self, http: Http, session: str, sparse: bool = False) -> float:
    """The service's score of the instance's episode so far (AppWorld: the fraction of tests passed, or 1/0 when
    `sparse`)."""
    body = {"instance_id": session, "messages": {}, "params": {"sparse": sparse}}
    return float(self._post(http, "/evaluate", body)["data"])

  def close(self, http: Http, session: str) -> None:
    self._live.discard(session)
    self._post(http, "/release", {"instance_id": session})  # success false: already gone


def _messages_text(messages: Any) -> str:
  """The text of the service's `state` messages, one after another."""
  if not isinstance(messages, list):
    raise RequestError(f"expected the service's state as a list of messages, got {str(messages)[:200]!r}")
  return "\n\n".join(str(message.get("content") or "") for message in messages if isinstance(message, dict))
