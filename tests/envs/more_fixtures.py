"""Small stand-ins for AgentGym's remaining env servers and AgentEvolver's EnvService, each with a few toy tasks.

Each reproduces its server's routes, request and answer fields, id scheme and error conventions (as read from
their code and described on the adapters in `evolver/envs/adapters.py`): ALFWorld and ScienceWorld (id-keyed,
errors as HTTP 200 `{"error"}`), WebShop, SQLGym and the ToolUsage servers (`env_idx`-keyed, a bare integer
from `/create`, an unknown id answered by uvicorn's HTTP 500 "Internal Server Error"), and AgentEvolver's
EnvService (`{success, data}` answers, HTTP 400 `{"detail"}` for an unknown instance, 500 with a traceback when
the env raises). The games are toys; what is faithful is the protocol.
"""

from __future__ import annotations

import ast
import http.server
import json
import random
import re
import socket
import sqlite3
import threading
from typing import Any
from urllib.parse import parse_qs, urlsplit


class Text(str):
  """A plain-text answer (not JSON), as uvicorn's "Internal Server Error"."""


INTERNAL_ERROR = (500, Text("Internal Server Error"))
NOT_FOUND = (404, {"detail": "Not Found"})


def _unprocessable(field: str) -> tuple[int, Any]:
  return 422, {"detail": [{"type": "missing", "loc": ["body", field], "msg": "Field required"}]}


def _bad_fields(body: Any, fields: dict[str, type], optional: tuple[str, ...] = ()) -> str | None:
  """The first field that fails FastAPI's validation, or None."""
  if not isinstance(body, dict):
    return "body"
  for key, kind in fields.items():
    if key not in body:
      if key in optional:
        continue
      return key
    value = body[key]
    if (value is None and key in optional) or (isinstance(value, kind) and not isinstance(value, bool)):
      continue
    return key
  return None


class JsonServer:
  """A threaded HTTP/1.1 server on 127.0.0.1; subclasses answer `handle(method, path, query, body)`."""

  def __init__(self):
    self.requests: list[tuple[str, str, Any]] = []  # (method, path, body) of every request
    self._lock = threading.Lock()
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"

      def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # headers and body go separately

      def log_message(self, *args):
        pass

      def _serve(self, method: str):
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        try:
          body = json.loads(raw) if raw else None
        except ValueError:
          body = "invalid"
        parts = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        with server._lock:
          server.requests.append((method, parts.path, body))
          status, payload = server.handle(method, parts.path, query, body)
        text = isinstance(payload, Text)
        data = payload.encode() if text else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8" if text else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

      def do_GET(self):
        self._serve("GET")

      def do_POST(self):
        self._serve("POST")

    self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self._server.daemon_threads = True
    self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
    self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    self._thread.start()

  def handle(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, Any]:
    raise NotImplementedError

  def stop(self) -> None:
    self._server.shutdown()
    self._server.server_close()

  def bodies(self, path: str) -> list[Any]:
    return [body for _, route, body in self.requests if route == path]


# ----------------------------------------------------------------------------------------------------------
# ALFWorld and ScienceWorld: id-keyed, errors as 200 {"error"}.
# ----------------------------------------------------------------------------------------------------------

ALFWORLD_GAMES = [
    ("put a mug in sinkbasin.", ["go to countertop 1", "take mug 1 from countertop 1", "go to sinkbasin 1",
                                 "put mug 1 in/on sinkbasin 1"]),
    ("open the fridge.", ["go to fridge 1", "open fridge 1"]),
]


class AlfWorldFixture(JsonServer):
  """AgentGym's ALFWorld server; game `g` is `ALFWORLD_GAMES[g % 2]`, won by playing its actions in order."""

  def __init__(self):
    self.next_id = 0
    self.games: dict[int, dict[str, Any]] = {}
    super().__init__()

  def handle(self, method, path, query, body):
    if method == "GET" and path == "/":
      return 200, "This is environment AlfWorld."
    if method == "GET" and path == "/observation":
      game = self.games.get(int(query.get("id", -1)))
      return 200, game["observation"] if game else {"error": f"The id {query.get('id')} is not valid."}
    if method != "POST":
      return NOT_FOUND
    if path == "/create":
      self.games[self.next_id] = {"done": False, "deleted": False, "observation": ""}
      self.next_id += 1
      return 200, {"id": self.next_id - 1}
    if path == "/reset":
      bad = _bad_fields(body, {"id": int, "game": int, "world_type": str})
      if bad:
        return _unprocessable(bad)
      if body["world_type"] not in ("Text", "Embody", "Hybrid"):
        return 200, {"error": 'world_type must be one of "Text", "Embody" and "Hybrid"'}
      game = self.games.get(body["id"])
      if game is None:
        return 200, {"error": f"The id {body['id']} is not valid."}
      goal, solution = ALFWORLD_GAMES[body["game"] % len(ALFWORLD_GAMES)]
      observation = ("You are in the middle of a room. Looking quickly around you, you see a countertop 1, a "
                     f"fridge 1, and a sinkbasin 1.\n\nYour task is to: {goal}")
      game.update(solution=solution, progress=0, done=False, observation=observation)
      return 200, {"id": body["id"], "observation": observation, "available_actions": self._actions(game),
                   "task_type": "pick_and_place_simple/trial_0"}
    if path == "/step":
      bad = _bad_fields(body, {"id": int, "action": str})
      if bad:
        return _unprocessable(bad)
      game = self.games.get(body["id"])
      if game is None:
        return 200, {"error": f"The id {body['id']} is not valid."}
      if game["done"]:
        return 200, {"error": f"The task with environment {body['id']} has finished."}
      if "solution" in game and body["action"] == game["solution"][game["progress"]]:
        game["progress"] += 1
        observation = f"You {body['action']}."
      else:
        observation = "Nothing happens."
      won = "solution" in game and game["progress"] == len(game["solution"])
      game.update(done=won, observation=observation)
      return 200, {"observation": observation, "reward": float(won), "available_actions": self._actions(game),
                   "done": won}
    return NOT_FOUND

  @staticmethod
  def _actions(game: dict[str, Any]) -> list[str]:
    if "solution" not in game:
      return ["look", "inventory"]
    following = game["solution"][game["progress"]:game["progress"] + 1]
    return ["look", "inventory", *following]


SCIWORLD_TASKS = [
    ("boil", "Your task is to boil water.", ["go to kitchen", "pick up pot", "focus on water"]),
    ("grow-plant", "Your task is to grow a plant.", ["go to greenhouse", "focus on seed"]),
]


class SciWorldFixture(JsonServer):
  """AgentGym's ScienceWorld server; task `d` is `SCIWORLD_TASKS[d % 2]`, each right action adding to the score
  (100 once all are played); focusing on anything else ends the task with a score of -100."""

  def __init__(self):
    self.next_id = 0
    self.envs: dict[int, dict[str, Any]] = {}
    super().__init__()

  def _check(self, idx: int, reset: bool = False) -> str | None:
    if idx not in self.envs:
      return f"The id {idx} is not valid."
    if self.envs[idx]["deleted"]:
      return f"The task with environment {idx} has been deleted."
    if not reset and self.envs[idx]["done"]:
      return f"The task with environment {idx} has finished."
    return None

  def handle(self, method, path, query, body):
    if method == "GET" and path == "/":
      return 200, "This is environment ScienceWorld."
    if method != "POST":
      return NOT_FOUND
    if path == "/create":
      self.envs[self.next_id] = {"deleted": False, "done": False}
      self.next_id += 1
      return 200, {"id": self.next_id - 1}
    if path == "/close":
      bad = _bad_fields(body, {"id": int})
      if bad:
        return _unprocessable(bad)
      env = self.envs.get(body["id"])
      if env is None or env["deleted"]:  # theirs raises outside its try: uvicorn's 500
        return INTERNAL_ERROR
      env["deleted"] = True
      return 200, True
    fields = {"/reset": {"id": int, "data_idx": int}, "/step": {"id": int, "action": str}}.get(path)
    if fields is None:
      return NOT_FOUND
    bad = _bad_fields(body, fields)
    if bad:
      return _unprocessable(bad)
    error = self._check(body["id"], reset=path == "/reset")
    if error:
      return 200, {"error": error}
    env = self.envs[body["id"]]
    if path == "/reset":
      name, description, solution = SCIWORLD_TASKS[body["data_idx"] % len(SCIWORLD_TASKS)]
      env.update(solution=solution, progress=0, score=0, done=False)
      observation = "This room is called the hallway. In it, you see: a door to the kitchen."
      return 200, {"task_name": name, "var_num": body["data_idx"] // len(SCIWORLD_TASKS),
                   "task_description": description, "observation": observation, "reward": 0, "score": 0,
                   "deleted": False, "done": False}
    action, before = body["action"], env.get("score", 0)
    if "solution" in env and action == env["solution"][env["progress"]]:
      env["progress"] += 1
      env["score"] = 100 * env["progress"] // len(env["solution"])
      observation = f"You {action}."
    elif action.startswith("focus on"):
      env["score"] = -100
      observation = f"You focus on {action[len('focus on '):]}. That is not what the task asks: it failed."
    else:
      observation = "No known action matches that input."
    env["done"] = env.get("score", 0) >= 100 or env.get("score", 0) < 0
    return 200, {"observation": observation, "reward": env.get("score", 0) - before, "score": env.get("score", 0),
                 "done": env["done"]}


# ----------------------------------------------------------------------------------------------------------
# WebShop, SQLGym and the ToolUsage servers: env_idx-keyed, bare-int ids, unknown ids answer 500.
# ----------------------------------------------------------------------------------------------------------

WEBSHOP_PRODUCTS = {"B01": "red ceramic mug", "B02": "blue ceramic mug", "B03": "red plastic cup"}
WEBSHOP_GOALS = [("i need a red ceramic mug", "B01"), ("i want a blue ceramic mug", "B02")]


class WebShopFixture(JsonServer):
  """AgentGym's WebShop server over a three-product shop; session `s` asks for `WEBSHOP_GOALS[s % 2]`; buying
  the asked product rewards 1, another 0.25."""

  def __init__(self):
    self.envs: dict[int, dict[str, Any]] = {}
    self._random = random.Random(7)
    super().__init__()

  def handle(self, method, path, query, body):
    if method == "GET" and path == "/":
      return 200, "ok"
    if method == "GET" and path == "/list_envs":
      return 200, list(self.envs)
    if method == "GET" and path == "/observation":
      env = self.envs.get(int(query.get("env_idx", -1)))
      return (200, env["observation"]) if env else INTERNAL_ERROR
    if method != "POST":
      return NOT_FOUND
    if path == "/create":
      idx = self._random.randint(0, 48950076)
      self.envs[idx] = {"goal": WEBSHOP_GOALS[0], "page": "search", "observation": self._search_page(0)}
      return 200, idx
    if path == "/reset":
      bad = _bad_fields(body, {"env_idx": int, "session_id": int}, optional=("session_id",))
      if bad:
        return _unprocessable(bad)
      env = self.envs.get(body["env_idx"])
      if env is None:
        return INTERNAL_ERROR
      session = body.get("session_id") or 0
      env.update(goal=WEBSHOP_GOALS[session % len(WEBSHOP_GOALS)], page="search",
                 observation=self._search_page(session))
      return 200, [env["observation"], None]
    if path == "/step":
      bad = _bad_fields(body, {"env_idx": int, "action": str})
      if bad:
        return _unprocessable(bad)
      env = self.envs.get(body["env_idx"])
      if env is None:
        return INTERNAL_ERROR
      return 200, self._step(env, body["action"])
    return NOT_FOUND

  @staticmethod
  def _search_page(session: int) -> str:
    return f"WebShop [SEP] Instruction: [SEP] {WEBSHOP_GOALS[session % len(WEBSHOP_GOALS)][0]} [SEP] Search"

  @staticmethod
  def _step(env: dict[str, Any], action: str) -> dict[str, Any]:
    reward, done = 0.0, False
    match = re.fullmatch(r"(search|click)\[(.+)\]", action.strip())
    if match and match.group(1) == "search" and env["page"] == "search":
      words = set(match.group(2).lower().split())
      found = [f"{code} [SEP] {name} [SEP] $9.99" for code, name in WEBSHOP_PRODUCTS.items()
               if words & set(name.split())]
      env.update(page="results", observation=" [SEP] ".join(["Back to Search", *found]))
    elif match and match.group(1) == "click" and match.group(2).upper() in WEBSHOP_PRODUCTS:
      code = match.group(2).upper()
      env.update(page="item", item=code, observation=f"Back to Search [SEP] {WEBSHOP_PRODUCTS[code]} [SEP] Buy Now")
    elif match and match.group(2).lower() == "buy now" and env["page"] == "item":
      reward, done = (1.0 if env["item"] == env["goal"][1] else 0.25), True
      env.update(page="done", observation="Thank you for shopping with us!")
    return {"state": env["observation"], "reward": reward, "done": done, "info": None}


SQLGYM_ITEMS = [("How many singers are there?", "SELECT COUNT(*) FROM singer"),
                ("What is the name of the oldest singer?", "SELECT name FROM singer ORDER BY age DESC LIMIT 1")]


class SqlGymFixture(JsonServer):
  """AgentGym's SQLGym server over one toy database (`singer(name, age)`); item ids [0, 2) exist."""

  def __init__(self):
    self.envs: dict[int, int | None] = {}  # env_idx -> item id (None before a reset)
    self.db = sqlite3.connect(":memory:", check_same_thread=False)
    self.db.executescript("CREATE TABLE singer(name TEXT, age INT); INSERT INTO singer VALUES ('Ann', 31), "
                          "('Bo', 52), ('Cy', 27);")
    self._random = random.Random(11)
    super().__init__()

  def _rows(self, sql: str) -> list[tuple] | str:
    try:
      return self.db.execute(sql).fetchall()
    except sqlite3.Error as error:
      return str(error)

  def handle(self, method, path, query, body):
    if method == "GET" and path == "/":
      return 200, "ok"
    if method == "GET" and path == "/list_envs":
      return 200, list(self.envs)
    if method == "GET" and path == "/observation":
      idx = int(query.get("env_idx", -1))
      if self.envs.get(idx) is None:  # unknown, or never reset (theirs has no env yet): both raise
        return INTERNAL_ERROR
      return 200, SQLGYM_ITEMS[self.envs[idx]][0]
    if method != "POST":
      return NOT_FOUND
    if path == "/create":
      idx = self._random.randint(0, 489576)
      self.envs[idx] = None
      return 200, idx
    if path == "/reset":
      bad = _bad_fields(body, {"env_idx": int, "item_id": int})
      if bad:
        return _unprocessable(bad)
      if body["env_idx"] not in self.envs or not 0 <= body["item_id"] < len(SQLGYM_ITEMS):
        return INTERNAL_ERROR
      self.envs[body["env_idx"]] = body["item_id"]
      return 200, [SQLGYM_ITEMS[body["item_id"]][0], None]
    if path == "/step":
      bad = _bad_fields(body, {"env_idx": int, "action": str})
      if bad:
        return _unprocessable(bad)
      item = self.envs.get(body["env_idx"])
      if item is None:
        return INTERNAL_ERROR
      rows, truth = self._rows(body["action"]), self._rows(SQLGYM_ITEMS[item][1])
      reward = 1.0 if isinstance(rows, list) and set(rows) == set(truth) else 0.0
      state = str(rows)
      state = state[:100] + "..." if len(state) > 100 else state
      return 200, {"state": state, "reward": reward, "done": True, "info": {"ground_truth": SQLGYM_ITEMS[item][1]}}
    return NOT_FOUND


TOOL_TASKS = [
    ("What is the latitude of Paris?", [("get_latitude_longitude", {"name": "Paris"}), ("finish", {"answer": 48.85})]),
    ("What is today's date?", [("get_user_current_date", {}), ("finish", {"answer": "2023-01-01"})]),
]
_TOOL_RESULTS = {"get_latitude_longitude": "{'latitude': 48.85, 'longitude': 2.35}",
                 "get_user_current_date": "2023-01-01"}


class ToolFixture(JsonServer):
  """One of AgentGym's ToolUsage servers (`name`: weather, movie, todo, sheet or academia); task `i` is
  `TOOL_TASKS[i % 2]`, its sub-goals the listed calls; the reward is the fraction met, with weather's and todo's
  quirks."""

  def __init__(self, name: str):
    self.name = name
    self.next_id = 0
    self.envs: dict[int, dict[str, Any]] = {}
    super().__init__()

  def _new(self, task: int) -> dict[str, Any]:
    goal, subgoals = TOOL_TASKS[task % len(TOOL_TASKS)]
    return {"goal": goal, "subgoals": subgoals, "met": [], "reward": 0.0, "done": False, "last": None}

  def handle(self, method, path, query, body):
    if method == "GET" and path == "/":
      return 200, "ok"
    if method == "GET" and path == "/list_envs":
      return 200, list(self.envs)
    if method == "GET" and path == "/observation":
      env = self.envs.get(int(query.get("env_idx", -1)))
      return (200, self._observation(env)) if env else INTERNAL_ERROR
    if method != "POST":
      return NOT_FOUND
    if path == "/create":
      bad = _bad_fields(body, {"id": int})
      if bad:
        return _unprocessable(bad)
      self.envs[self.next_id] = self._new(body["id"])
      self.next_id += 1
      return 200, self.next_id - 1
    if path == "/reset":
      bad = _bad_fields(body, {"env_idx": int, "id": int}, optional=("id",))
      if bad:
        return _unprocessable(bad)
      if body["env_idx"] not in self.envs:
        return INTERNAL_ERROR
      self.envs[body["env_idx"]] = self._new(body.get("id") or 0)
      return 200, self._observation(self.envs[body["env_idx"]])
    if path == "/step":
      bad = _bad_fields(body, {"env_idx": int, "action": str})
      if bad:
        return _unprocessable(bad)
      env = self.envs.get(body["env_idx"])
      if env is None:
        return INTERNAL_ERROR
      return 200, self._step(env, body["action"])
    return NOT_FOUND

  @staticmethod
  def _observation(env: dict[str, Any]) -> str:
    if env["last"] is None:
      return ("Now new trial starts.\nYou should perform actions to accomplish the goal: " + env["goal"] +
              "\nGive me one action.")
    return "Observation: " + env["last"]

  def _step(self, env: dict[str, Any], message: str) -> dict[str, Any]:
    outer = re.search(r"\s*(.*?)\s*with\s*Action Input:\s*(.*?)$", message)
    if outer is None:
      observation = 'Format error, please response in the format of  "Action: [your action] with Action Input: ' \
                    '[your action input]'
      return {"observation": observation, "reward": self._reported(env), "done": False}
    text = outer.group(1) + " with Action Input: " + outer.group(2)
    inner = re.match(r".*?Action:\s*(.*?)\s*with\s*Action Input:\s*(.*?)$", text, re.MULTILINE | re.DOTALL)
    try:
      if inner is None:
        raise TypeError("cannot unpack non-iterable NoneType object")
      name, params = inner.group(1), ast.literal_eval(inner.group(2))  # theirs: eval
    except (TypeError, ValueError, SyntaxError) as error:
      env["last"] = f"ERROR | {type(error).__name__}({error})"
      return {"observation": "Observation: " + env["last"] + "\nGive me one action.", "reward": self._reported(env),
              "done": env["done"]}
    if name == "finish":
      result = str(params.get("answer"))
    elif name in _TOOL_RESULTS:
      result = _TOOL_RESULTS[name]
    else:
      result = f"ERROR | Invalid action: {name}."
    done = "finish" in text or "Finish" in text
    if (name, params) in env["subgoals"] and (name, params) not in env["met"]:
      env["met"].append((name, params))
    env["reward"] = max(env["reward"], len(env["met"]) / len(env["subgoals"]))
    env["done"], env["last"] = done, result
    return {"observation": "Observation: " + result + "\nGive me one action.", "reward": self._reported(env),
            "done": done}

  def _reported(self, env: dict[str, Any]) -> float:
    reward = env["reward"]
    if self.name == "weather" and reward > 0:
      return 1.0
    if self.name == "todo" and env["done"]:
      return float(reward == 1.0)  # theirs also compares the todo state with the ground truth
    return reward


# ----------------------------------------------------------------------------------------------------------
# AgentEvolver's EnvService.
# ----------------------------------------------------------------------------------------------------------

APPWORLD_TASKS = {"train": {"82e2fac_1": ("How many playlists do I have in Spotify?", 23),
                            "29caf6f_1": ("How many songs are in my Spotify queue?", 7)},
                  "dev": {"50e1ac9_1": ("How many Venmo friends do I have?", 12)}}
BFCL_TASKS = {"train": {"multi_turn_base_0": [["What is in my cart?", "list_cart"], ["Add a pen.", "add_item"]],
                        "multi_turn_base_1": [["Empty my cart.", "clear_cart"]]},
              "test": {"multi_turn_base_2": [["What is in my cart?", "list_cart"]]}}


class EnvServiceFixture(JsonServer):
  """AgentEvolver's EnvService serving one `env_type` ("appworld" or "bfcl", as its `--env`), over toy tasks.

  AppWorld: the first ```python block of a turn runs; `apis.supervisor.complete_task(answer=X)` ends the task,
  scored by two tests (completed; right answer). BFCL: `<tool_call>{json}</tool_call>` calls answer with their
  results; a turn without calls brings the next question, and after the last "[CONVERSATION_COMPLETED]", with
  reward 1 when every question's expected function was called.
  """

  def __init__(self, env_type: str):
    self.env_type = env_type
    self.tasks = APPWORLD_TASKS if env_type == "appworld" else BFCL_TASKS
    self.instances: dict[str, dict[str, Any]] = {}
    self.released: list[str] = []
    self.evaluations: list[dict[str, Any]] = []
    super().__init__()

  def handle(self, method, path, query, body):
    if method == "GET" and path == "/healthz":
      return 200, Text("OK")
    if method != "POST" or path not in ("/get_env_profile", "/create", "/step", "/evaluate", "/get_info",
                                        "/release"):
      return NOT_FOUND
    if not isinstance(body, dict):
      return _unprocessable("body")
    for key, kind in (("env_type", str), ("task_id", str), ("instance_id", str), ("messages", dict),
                      ("params", dict)):
      if body.get(key) is not None and not isinstance(body[key], kind):
        return 422, {"detail": [{"type": f"{kind.__name__}_type", "loc": ["body", key], "msg": "Input should be "
                                 f"a valid {kind.__name__}"}]}
    env_type = body.get("env_type", "appworld")
    params = body.get("params") or {}
    if path == "/get_env_profile":
      if env_type != self.env_type:
        return self._traceback(f"KeyError: '{env_type}'")
      return 200, {"success": True, "data": list(self.tasks.get(params.get("split", "train"), {}))}
    if path == "/create":
      if not env_type:
        return 400, {"detail": "env_type is required"}
      if not body.get("task_id"):
        return 400, {"detail": "task_id is required"}
      if env_type != self.env_type:
        return self._traceback(f"ModuleNotFoundError: No module named 'env_service.environments.{env_type}'")
      task = next((split[body["task_id"]] for split in self.tasks.values() if body["task_id"] in split), None)
      if task is None:
        return self._traceback(f"ValueError: Test case id '{body['task_id']}' not found")
      instance_id = body.get("instance_id") or f"exp_1700000000_{len(self.instances):08x}"
      self.instances[instance_id] = {"task": task, "turn": 0, "calls": [], "done": False, "answer": None}
      info = {"instance_id": instance_id, "task_id": body["task_id"]}
      return 200, {"success": True, "data": {"state": self._first_messages(task), "info": info}}
    if path == "/release":
      if not body.get("instance_id"):
        return 400, {"detail": "instance_id is required"}
      found = self.instances.pop(body["instance_id"], None) is not None
      if found:
        self.released.append(body["instance_id"])
      return 200, {"success": found, "data": None}
    if not body.get("instance_id"):
      return 400, {"detail": "instance_id is required"}
    instance = self.instances.get(body["instance_id"])
    if instance is None:
      return 400, {"detail": f"Instance {body['instance_id']} not found!"}
    if path == "/get_info":
      return 200, {"success": True, "data": "Available tools:\n- appworld"}
    if path == "/evaluate":
      self.evaluations.append(params)
      return 200, {"success": True, "data": self._score(instance, sparse=bool(params.get("sparse")))}
    return 200, {"success": True, "data": self._step(instance, body.get("messages") or {})}

  @staticmethod
  def _traceback(last_line: str) -> tuple[int, Any]:
    return 500, {"detail": f"Traceback (most recent call last):\n  File \"env_service.py\", line 1\n{last_line}\n"}

  def _first_messages(self, task: Any) -> list[dict[str, str]]:
    if self.env_type == "appworld":
      return [{"role": "system", "content": "I am your supervisor; write Python code in ```python blocks."},
              {"role": "user", "content": task[0]}]
    return [{"role": "system", "content": "# Tools\n<tools>\n{\"name\": \"list_cart\"}\n</tools>"},
            {"role": "user", "content": task[0][0]}]

  def _step(self, instance: dict[str, Any], message: dict[str, Any]) -> dict[str, Any]:
    content = str(message.get("content", ""))
    if self.env_type == "appworld":
      code = re.search(r"```python\n(.*?)```", content, re.DOTALL)
      text = ""
      if code:
        answer = re.search(r"apis\.supervisor\.complete_task\(answer=(.*?)\)", code.group(1))
        if answer:
          instance["answer"], instance["done"] = answer.group(1).strip(), True
          output = "Marked the active task complete."
        else:
          output = "Executed."
        text = "Output:\n```\n" + output + "```\n\n"
      reward = self._score(instance, sparse=False) if instance["done"] else 0.0
    else:
      calls = re.findall(r"<tool_call>\s*\n?({.*?})\s*\n?</tool_call>", content, re.DOTALL)
      if calls:
        names = [json.loads(call)["name"] for call in calls]
        instance["calls"].append((instance["turn"], names))
        text = "".join(f"<tool_call>\n{json.dumps({'name': f'{name}_{i + 1}', 'content': 'ok'})}\n</tool_call>\n"
                       for i, name in enumerate(names))
      else:
        instance["turn"] += 1
        if instance["turn"] >= len(instance["task"]):
          instance["done"], text = True, "[CONVERSATION_COMPLETED]"
        else:
          text = instance["task"][instance["turn"]][0]
      reward = self._score(instance, sparse=True) if instance["done"] else 0.0
    return {"state": [{"role": "user", "content": text, "tool_calls": []}], "reward": reward,
            "is_terminated": instance["done"], "info": {}}

  def _score(self, instance: dict[str, Any], sparse: bool) -> float:
    if self.env_type == "appworld":
      passes = int(instance["done"]) + int(instance["done"] and instance["answer"] == str(instance["task"][1]))
      return float(passes == 2) if sparse else passes / 2
    wanted = [(turn, name) for turn, (_, name) in enumerate(instance["task"])]
    made = {(turn, name) for turn, names in instance["calls"] for name in names}
    return float(all(item in made for item in wanted))
