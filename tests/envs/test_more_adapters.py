"""RemoteEnv's adapters for AgentGym's ALFWorld, ScienceWorld, WebShop, SQLGym and ToolUsage servers and for
AgentEvolver's EnvService, each against a fixture server that reproduces its protocol (tests/envs/more_fixtures.py)."""

import json

import pytest

from evolver.envs import adapters
from evolver.envs.remote import HttpClient, RemoteEnv

from tests.envs import more_fixtures as fx

TOOLS = ("weather", "movie", "todo", "sheet", "academia")


def _turn(action: str) -> str:
  return f"Thought: this is the next step.\nAction: {action}"


def _tool_turn(name: str, arguments: dict) -> str:
  return f"Thought: I call {name}.\nAction: {name}\nAction Input: {json.dumps(arguments)}"


def _winning(name: str, index: int) -> list[str]:
  """A whole episode of turns that solves fixture task `index` of env `name`."""
  if name == "alfworld":
    return [_turn(action) for action in fx.ALFWORLD_GAMES[index % 2][1]]
  if name == "sciworld":
    return [_turn(action) for action in fx.SCIWORLD_TASKS[index % 2][2]]
  if name == "webshop":
    code = fx.WEBSHOP_GOALS[index % 2][1]
    return [_turn(f"search[{fx.WEBSHOP_PRODUCTS[code]}]"), _turn(f"click[{code}]"), _turn("click[Buy Now]")]
  if name == "sqlgym":
    return [f"Thought: I query it.\nAction: ```sql\n{fx.SQLGYM_ITEMS[index][1]};\n```"]
  return [_tool_turn(tool, arguments) for tool, arguments in fx.TOOL_TASKS[index % 2][1]]


def _failing(name: str) -> list[str]:
  """Turns that end fixture task 0 of env `name` unsolved (the last one ends the episode)."""
  if name == "alfworld":
    return [_turn("look")] * adapters.AlfWorldAdapter.max_rounds
  if name == "sciworld":
    return [_turn("go to kitchen"), _turn("focus on door")]
  if name == "webshop":
    return [_turn("search[blue mug]"), _turn("click[B02]"), _turn("click[Buy Now]")]
  if name == "sqlgym":
    return ["Action: ```sql\nSELECT COUNT(*) FROM singer WHERE age > 30;\n```"]
  return [_tool_turn("get_latitude_longitude", {"name": "Paris"}), _tool_turn("finish", {"answer": 0})]


def _fixture(name: str) -> fx.JsonServer:
  factories = {"alfworld": fx.AlfWorldFixture, "sciworld": fx.SciWorldFixture, "webshop": fx.WebShopFixture,
               "sqlgym": fx.SqlGymFixture}
  return factories[name]() if name in factories else fx.ToolFixture(name)


def _ranges(name: str) -> dict:
  return {"train": (0, 1), "eval": (1, 2)} if name == "sqlgym" else {"train": (0, 2), "eval": (2, 4)}


def _play(env: RemoteEnv, turns: list[str]) -> tuple[str, float, bool, dict]:
  for turn in turns:
    observation, reward, done, info = env.step(turn)
  return observation, reward, done, info


@pytest.fixture(name="server")
def _server(request):
  """(env name, its fixture server), stopped after the test."""
  server = _fixture(request.param)
  yield request.param, server
  server.stop()


NAMES = ["alfworld", "sciworld", "webshop", "sqlgym", *TOOLS]


@pytest.mark.parametrize("server", NAMES, indirect=True, ids=NAMES)
def test_agentgym_adapter_plays_episodes_to_success_and_failure(server):
  name, server = server
  env = RemoteEnv(server.url, name, server="agentgym", task_ranges=_ranges(name))
  assert env.name == name and env.num_tasks("train") == _ranges(name)["train"][1]
  assert "Thought:" in env.instruction() and "Action" in env.instruction()
  for index in range(env.num_tasks("train")):
    observation = env.reset(index)
    assert observation
    _, reward, done, info = _play(env, _winning(name, index))
    assert done and reward == 1.0 and info["success"], (name, index, observation)
  env.reset(0)
  _, reward, done, info = _play(env, _failing(name))
  assert done and 0.0 <= reward <= 1.0
  if name == "weather":  # their weather server reports 1 for any progress: a wrong finish still counts
    assert info["success"] and reward == 1.0
  else:
    assert not info["success"] and reward < 1.0
  env.close()


def test_observations_and_request_bodies_follow_each_protocol():
  alfworld, sciworld, webshop, sqlgym, todo = (fx.AlfWorldFixture(), fx.SciWorldFixture(), fx.WebShopFixture(),
                                               fx.SqlGymFixture(), fx.ToolFixture("todo"))
  try:
    env = RemoteEnv(alfworld.url, "alfworld", server="agentgym", task_ranges=_ranges("alfworld"))
    observation = env.reset(1)
    assert observation.endswith("AVAILABLE ACTIONS: look,inventory,go to fridge 1")
    assert alfworld.bodies("/reset")[-1] == {"id": 0, "game": 1, "world_type": "Text"}
    env.step(_turn("go to fridge 1"))
    assert alfworld.bodies("/step")[-1] == {"id": 0, "action": "go to fridge 1"}  # the bare action

    env = RemoteEnv(sciworld.url, "sciworld", server="agentgym", task_ranges=_ranges("sciworld"))
    assert env.reset(0).startswith("Your task is to boil water.\nThis room is called the hallway.")
    _, reward, _, _ = env.step(_turn("go to kitchen"))
    assert reward == pytest.approx(0.33)  # score 33 of 100

    env = RemoteEnv(webshop.url, "webshop", server="agentgym", task_ranges=_ranges("webshop"))
    assert env.reset(1) == "WebShop [SEP] Instruction: [SEP] i want a blue ceramic mug [SEP] Search"
    (idx,) = webshop.envs
    assert webshop.bodies("/reset")[-1] == {"env_idx": idx, "session_id": 1}
    assert ("GET", "/observation", None) in webshop.requests  # the observation comes as their client reads it

    env = RemoteEnv(sqlgym.url, "sqlgym", server="agentgym", task_ranges=_ranges("sqlgym"))
    assert env.reset(0) == "How many singers are there?"
    observation, reward, done, _ = env.step("Thought: all rows.\nAction: ```sql\nSELECT * FROM singer;\n```")
    assert done and reward == 0.0 and observation.startswith("[('Ann', 31)")
    assert sqlgym.bodies("/step")[-1]["action"] == "SELECT * FROM singer;"

    env = RemoteEnv(todo.url, "todo", server="agentgym", task_ranges=_ranges("todo"))
    assert env.reset(0).startswith("Now new trial starts.\nYou should perform actions to accomplish the goal:")
    assert todo.bodies("/create") == [{"id": 0}] and todo.bodies("/reset")[-1] == {"env_idx": 0, "id": 0}
    _, reward, done, _ = env.step(_tool_turn("get_latitude_longitude", {"name": "Paris"}))
    assert reward == 0.5 and not done
  finally:
    for server in (alfworld, sciworld, webshop, sqlgym, todo):
      server.stop()


def test_tool_actions_are_rewritten_to_their_one_line_format():
  adapter = adapters.WeatherAdapter()
  expected = 'Action: get_latitude_longitude with Action Input: {"name": "Paris"}'
  assert adapter.action('Thought: t\nAction: get_latitude_longitude\nAction Input: {\n  "name": "Paris"\n}') == expected
  assert adapter.action('Thought: t\n\nAction: get_latitude_longitude with Action Input: {"name": "Paris"}') == expected
  assert adapter.action("Action: get_user_current_date") == "Action: get_user_current_date with Action Input: {}"
  assert adapter.action('Action: finish\nAction Input: {"answer": true}') == \
      "Action: finish with Action Input: {'answer': True}"  # their server reads the input with Python's eval
  assert adapter.action("Action: finish\nAction Input: {oops") == "Action: finish with Action Input: {oops"
  assert adapters.SqlGymAdapter().action("Action: SELECT 1") == "SELECT 1"


@pytest.mark.parametrize("server", NAMES[2:], indirect=True, ids=NAMES[2:])
def test_env_idx_servers_lost_session_is_replayed(server):
  name, server = server
  env = RemoteEnv(server.url, name, server="agentgym", task_ranges=_ranges(name), backoff_s=0.01)
  env.reset(0)
  turns = _winning(name, 0)
  if len(turns) > 1:
    env.step(turns[0])
    turns = turns[1:]
  server.envs.clear()  # a restart: the old env_idx answers uvicorn's 500
  _, reward, done, info = _play(env, turns)
  assert done and info["success"] and reward == 1.0 and env.recoveries == 1


def test_errors_become_clear_exceptions():
  sqlgym, alfworld, sciworld = fx.SqlGymFixture(), fx.AlfWorldFixture(), fx.SciWorldFixture()
  try:
    http = HttpClient(sqlgym.url, timeout_s=10)
    adapter = adapters.SqlGymAdapter()
    session = adapter.create(http)
    with pytest.raises(adapters.RequestError, match="HTTP 500: the server's env failed"):
      adapter.reset(http, session, 99, "train")  # item id out of range: their server raises, the env lives
    with pytest.raises(adapters.SessionLostError, match="not among the server's envs"):
      adapter.step(http, session + 1, "Action: SELECT 1")
    with pytest.raises(adapters.RequestError, match="422"):
      adapter._request(http, "POST", "/reset", {"env_idx": "zero", "item_id": 0}, None)

    http = HttpClient(alfworld.url, timeout_s=10)
    with pytest.raises(adapters.SessionLostError, match="not valid"):
      adapters.AlfWorldAdapter().reset(http, 5, 0, "train")
    env = RemoteEnv(alfworld.url, "alfworld", server="agentgym", task_ranges=_ranges("alfworld"))
    env.reset(1)
    _play(env, _winning("alfworld", 1))
    observation, _, done, info = env.step(_turn("look"))  # their server would answer "has finished"
    assert done and info["success"] and "over" in observation

    http = HttpClient(sciworld.url, timeout_s=10)
    adapter = adapters.SciWorldAdapter()
    session = adapter.create(http)
    adapter.reset(http, session, 0, "train")
    adapter.close(http, session)
    with pytest.raises(adapters.SessionLostError, match="has been deleted"):  # a closed env: start a new one
      adapter.step(http, session, _turn("look around"))
    with pytest.raises(adapters.TransportError):  # their /close raises on a closed id: uvicorn's 500
      adapter.close(http, session)
  finally:
    for server in (sqlgym, alfworld, sciworld):
      server.stop()


def test_close_where_the_server_has_one():
  sciworld, alfworld, weather = fx.SciWorldFixture(), fx.AlfWorldFixture(), fx.ToolFixture("weather")
  try:
    env = RemoteEnv(sciworld.url, "sciworld", server="agentgym", task_ranges=_ranges("sciworld"))
    env.reset(0)
    env.close()
    assert sciworld.bodies("/close") == [{"id": 0}] and sciworld.envs[0]["deleted"]
    env.reset(1)  # a new session
    assert sciworld.next_id == 2
    for server, name in ((alfworld, "alfworld"), (weather, "weather")):
      env = RemoteEnv(server.url, name, server="agentgym", task_ranges=_ranges(name))
      env.reset(0)
      env.close()
      assert not server.bodies("/close")
  finally:
    for server in (sciworld, alfworld, weather):
      server.stop()


def test_agentgym_hello_names_the_new_servers():
  for fixture, suggestion in ((fx.AlfWorldFixture(), "env_name='alfworld'"),
                              (fx.SciWorldFixture(), "env_name='sciworld'")):
    try:
      with pytest.raises(ValueError, match=suggestion):
        RemoteEnv(fixture.url, max_retries=1)
    finally:
      fixture.stop()


# ----------------------------------------------------------------------------------------------------------
# AgentEvolver's EnvService.
# ----------------------------------------------------------------------------------------------------------

APPWORLD_SPLITS = {"train": "train", "eval": "dev"}


def _code(code: str) -> str:
  return f"Let me do this.\n```python\n{code}\n```"


def test_envservice_adapter_create_step_evaluate_release():
  service = fx.EnvServiceFixture("appworld")
  try:
    http = HttpClient(service.url, timeout_s=10)
    adapter = adapters.EnvServiceAdapter("appworld", APPWORLD_SPLITS)
    info = adapter.info(http)
    assert info["num_tasks"] == {"train": 2, "eval": 1} and adapter.task_ids["eval"] == ["50e1ac9_1"]
    assert service.bodies("/get_env_profile")[0]["params"] == {"split": "train"}
    session = adapter.create(http)
    observation = adapter.reset(http, session, 0, "train")
    assert "supervisor" in observation and observation.endswith("How many playlists do I have in Spotify?")
    body = service.bodies("/create")[-1]
    assert (body["env_type"], body["task_id"], body["instance_id"]) == ("appworld", "82e2fac_1", session)
    observation, reward, done, _ = adapter.step(http, session, _code("print(apis.spotify)"))
    assert observation == "Output:\n```\nExecuted.```\n\n" and reward == 0.0 and not done
    assert service.bodies("/step")[-1]["messages"] == {"role": "assistant", "content": _code("print(apis.spotify)")}
    assert adapter.evaluate(http, session) == 0.0
    _, reward, done, info = adapter.step(http, session, _code("apis.supervisor.complete_task(answer=22)"))
    assert done and reward == 0.5 and not info["success"]  # one of two tests passed
    assert adapter.evaluate(http, session, sparse=True) == 0.0 and service.evaluations[-1] == {"sparse": True}
    adapter.close(http, session)
    assert service.released == [session] and not service.instances
    adapter.close(http, session)  # already released: the service answers success false, no error
    with pytest.raises(adapters.SessionLostError, match="not found"):
      adapter.step(http, session, _code("print(1)"))
    with pytest.raises(adapters.SessionLostError):
      adapter.evaluate(http, "never-created")
  finally:
    service.stop()


def test_envservice_errors_become_clear_exceptions():
  service = fx.EnvServiceFixture("appworld")
  try:
    http = HttpClient(service.url, timeout_s=10)
    adapter = adapters.EnvServiceAdapter("appworld", APPWORLD_SPLITS)
    adapter.info(http)
    adapter.task_ids["train"][0] = "missing_task"
    with pytest.raises(adapters.RequestError, match="HTTP 500: ValueError: Test case id 'missing_task' not found"):
      adapter.reset(http, adapter.create(http), 0, "train")
    with pytest.raises(adapters.RequestError, match="HTTP 400: task_id is required"):
      adapter._post(http, "/create", {"task_id": None})
    with pytest.raises(adapters.RequestError, match="HTTP 422"):
      adapter._post(http, "/step", {"instance_id": 7})
    with pytest.raises(adapters.RequestError, match="ModuleNotFoundError"):
      adapters.EnvServiceAdapter("bfcl")._post(http, "/create", {"task_id": "82e2fac_1"})  # not served here
    with pytest.raises(ValueError, match="task_splits"):
      adapters.EnvServiceAdapter("appworld", {"train": "train"})
    with pytest.raises(ValueError, match="no default splits.*'openworld'"):
      adapters.EnvServiceAdapter("openworld")
  finally:
    service.stop()


def test_remote_env_plays_appworld_through_envservice():
  service = fx.EnvServiceFixture("appworld")
  try:
    env = RemoteEnv(service.url, "appworld", server="agentevolver", backoff_s=0.01)  # AppWorld's train and dev
    assert env.name == "appworld" and env.num_tasks("train") == 2 and env.num_tasks("eval") == 1
    assert "```python" in env.instruction()
    env.reset(1)
    first = service.bodies("/create")[-1]["instance_id"]
    env.step(_code("print(1)"))
    service.instances.clear()  # reaped after an hour idle, or a restart: the replay starts a new instance
    _, reward, done, info = env.step(_code("apis.supervisor.complete_task(answer=7)"))
    assert done and reward == 1.0 and info["success"] and env.recoveries == 1
    env.reset(0, "eval")
    assert service.bodies("/create")[-1]["task_id"] == "50e1ac9_1"
    env.reset(0)  # a new task on the same session: the instance it replaces is released first
    assert service.released[-1] == service.bodies("/create")[-2]["instance_id"] != first
    _, reward, done, info = env.step(_code("apis.supervisor.complete_task(answer=0)"))
    assert done and reward == 0.5 and not info["success"]
    env.close()
    assert not service.instances
  finally:
    service.stop()


def test_remote_env_plays_bfcl_through_envservice():
  service = fx.EnvServiceFixture("bfcl")
  try:
    env = RemoteEnv(service.url, "bfcl", server="agentevolver")
    assert env.num_tasks("train") == 2 and env.num_tasks("eval") == 1
    assert env.reset(0).endswith("What is in my cart?")
    observation, _, done, _ = env.step('<tool_call>\n{"name": "list_cart", "arguments": {}}\n</tool_call>')
    assert not done and json.loads(observation.split("\n")[1]) == {"name": "list_cart_1", "content": "ok"}
    observation, _, done, _ = env.step("Your cart is empty.")
    assert observation == "Add a pen." and not done
    env.step('<tool_call>{"name": "add_item", "arguments": {"item": "pen"}}</tool_call>')
    observation, reward, done, info = env.step("Added.")
    assert observation == "[CONVERSATION_COMPLETED]" and done and reward == 1.0 and info["success"]
    env.reset(1)
    observation, reward, done, info = env.step("I cannot do that.")  # no call: the conversation ends, failed
    assert done and reward == 0.0 and not info["success"]
    env.close()
  finally:
    service.stop()


def test_agentevolver_arguments_are_checked():
  with pytest.raises(ValueError, match="needs env_name"):
    RemoteEnv("http://127.0.0.1:9", server="agentevolver")
  with pytest.raises(ValueError, match="task_ranges is only for server='agentgym'"):
    RemoteEnv("http://127.0.0.1:9", "appworld", server="agentevolver", task_ranges={"train": (0, 1), "eval": (1, 2)})
  with pytest.raises(ValueError, match="task_splits is only for server='agentevolver'"):
    RemoteEnv("http://127.0.0.1:9", "alfworld", server="agentgym", task_ranges={"train": (0, 1), "eval": (1, 2)},
              task_splits=APPWORLD_SPLITS)
