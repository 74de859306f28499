"""The ReMe-compatible experience service, on a real HTTP server on loopback.

Requests replay the JSON shapes of AgentEvolver's `EMClient` (agentevolver/client/em_client.py): retrieval posts
`{"query": json.dumps(steps), "top_k", "workspace_id"}` and reads `answer`; summary posts
`{"trajectories": [{"messages": steps, "score": r}], "workspace_id"}`.
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from evolver.experience.embedders import HashingEmbedder
from evolver.experience.manager import task_query
from evolver.experience.service import (ExperienceBackend, ExperienceClient, ExperienceService, ExperienceServiceError,
                                        LocalBackend, ServiceThread)
from evolver.experience.summarizer import LLMSummarizer
from evolver.experience.pool import ExperiencePool
from evolver.experience.store import ExperienceStore
from tests.experience.helpers import GOAL, LOSE, OTHER_GOAL, WIN, conversation

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_service(root, **kwargs):
  return ExperienceService(ExperienceStore(str(root / "store")), HashingEmbedder(dim=256), **kwargs)


@pytest.fixture()
def server(tmp_path):
  service = make_service(tmp_path)
  with ServiceThread(service, request_timeout_s=5) as thread:
    yield thread
  service.close()


def call(url, route, body=None, *, method=None, raw=None, headers=None):
  """(status, JSON answer) of one request; `raw` sends bytes as they are."""
  data = raw if raw is not None else None if body is None else json.dumps(body).encode()
  request = urllib.request.Request(url + route, data=data, method=method or ("GET" if data is None else "POST"),
                                   headers=headers or {"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=30) as response:
      return response.status, json.loads(response.read())
  except urllib.error.HTTPError as error:
    return error.code, json.loads(error.read())


def em_summary(url, trajectories, workspace_id="default"):
  """What EMClient.call_summarizer posts."""
  return call(url, "/summary_task_memory", {
      "trajectories": [{"messages": steps, "score": score} for steps, score in trajectories],
      "workspace_id": workspace_id})


def em_retrieve(url, steps, top_k=1, workspace_id="default"):
  """What EMClient.call_context_generator posts (the rollout's initial messages as JSON)."""
  return call(url, "/retrieve_task_memory", {"query": json.dumps(steps, ensure_ascii=False), "top_k": top_k,
                                             "workspace_id": workspace_id})


def initial(goal):
  return conversation(goal, [])[:3]


def fill(url, workspace_id="default"):
  status, answer = em_summary(url, [(conversation(GOAL, WIN), 1.0), (conversation(GOAL, LOSE), 0.0),
                                    (conversation(OTHER_GOAL, ["pick up ball"]), 1.0)], workspace_id)
  assert status == 200, answer
  return answer


def test_summary_then_retrieve_as_agentevolver(server):
  status, answer = em_summary(server.url, [(conversation(GOAL, WIN), 1.0), (conversation(GOAL, LOSE), 0.0)])
  assert status == 200 and answer["success"] is True and answer["messages"] == []
  memories = answer["metadata"]["memory_list"]
  assert {m["metadata"]["kind"] for m in memories} == {"success", "failure", "comparative"}
  assert json.loads(answer["answer"]) == memories
  assert answer["metadata"]["stats"]["successes"] == 1 and answer["metadata"]["stats"]["failures"] == 1
  assert answer["metadata"]["update_result"] == {"deleted_count": 0, "inserted_count": 3}
  # right after: the rollout's opening as EMClient sends it finds them
  status, answer = em_retrieve(server.url, initial(GOAL), top_k=3)
  assert status == 200 and isinstance(answer["answer"], str)
  assert answer["answer"].startswith("Memory 1 :\n When to use: " + GOAL)
  assert "move north x2 -> turn left -> open door" in answer["answer"]
  assert answer["metadata"]["query"] == GOAL  # the JSON of messages reduced to the task's text
  assert len(answer["metadata"]["memory_list"]) == 3 and len(answer["metadata"]["scores"]) == 3
  assert answer["metadata"]["scores"][0] == pytest.approx(1.0, abs=1e-4)


def test_retrieve_finds_the_right_task(server):
  fill(server.url)
  status, answer = em_retrieve(server.url, initial(OTHER_GOAL), top_k=1)
  assert status == 200 and answer["metadata"]["memory_list"][0]["when_to_use"] == OTHER_GOAL
  status, answer = call(server.url, "/retrieve_task_memory", {"workspace_id": "default", "query": OTHER_GOAL})
  assert status == 200 and len(answer["metadata"]["memory_list"]) == 3  # ReMe's default top_k


def test_nothing_found(server):
  status, answer = em_retrieve(server.url, initial(GOAL), workspace_id="never-made")
  assert status == 200 and answer == {"answer": "", "messages": [], "success": True,
                                      "metadata": {"memory_list": [], "scores": [], "query": GOAL}}
  status, answer = call(server.url, "/vector_store", {"action": "list"})
  assert answer["metadata"]["action_result"] == []  # a retrieval creates no workspace
  status, answer = em_summary(server.url, [])
  assert status == 200 and answer["metadata"]["memory_list"] == []


def test_summary_is_deduplicated(server):
  fill(server.url)
  answer = fill(server.url)
  assert answer["metadata"]["memory_list"] == [] and answer["metadata"]["stats"]["duplicates"] == 4


@pytest.mark.parametrize("body,message", [
    (b"{not json", "not valid JSON"), (b"[1, 2]", "JSON object"), (b"", "JSON object"),
    ({"workspace_id": "default"}, "missing field 'query'"),
    ({"workspace_id": "default", "query": 3}, "'query' must be str"),
    ({"workspace_id": "default", "query": "   "}, "empty"),
    ({"workspace_id": "default", "query": "q", "top_k": 0}, "top_k"),
    ({"workspace_id": "default", "query": "q", "top_k": "3"}, "top_k"),
    ({"workspace_id": "default", "query": "q", "top_k": True}, "top_k"),
    ({"workspace_id": "default", "query": "q", "top_k": 101}, "top_k"),
    ({"workspace_id": "default", "query": "q", "top_k": 2.5}, "top_k"),
    ({"query": "q"}, "missing field 'workspace_id'"),
    ({"workspace_id": "../escape", "query": "q"}, "workspace_id"),
    ({"workspace_id": "/abs", "query": "q"}, "workspace_id"),
    ({"workspace_id": 7, "query": "q"}, "workspace_id"),
])
def test_bad_retrievals(server, body, message):
  raw = body if isinstance(body, bytes) else json.dumps(body).encode()
  status, answer = call(server.url, "/retrieve_task_memory", raw=raw)
  assert status == 400 and message in answer["error"] and answer["success"] is False


@pytest.mark.parametrize("body,message", [
    ({"workspace_id": "w", "trajectories": {"messages": []}}, "'trajectories' must be list"),
    ({"workspace_id": "w", "trajectories": [{"score": 1.0}]}, "no 'messages'"),
    ({"workspace_id": "w", "trajectories": [{"messages": "hi", "score": 1.0}]}, "JSON list of messages"),
    ({"workspace_id": "w", "trajectories": [{"messages": [{"role": "x", "content": "y"}], "score": 1}]}, "role"),
    ({"workspace_id": "w", "trajectories": [{"messages": [], "score": "1"}]}, "score"),
    ({"workspace_id": "w", "trajectories": [], "step": "3"}, "'step' must be int"),
    ({"workspace_id": "a/b", "trajectories": []}, "workspace_id"),
])
def test_bad_summaries(server, body, message):
  status, answer = call(server.url, "/summary_task_memory", body)
  assert status == 400 and message in answer["error"]


def test_bad_workspace_ids_create_nothing(server, tmp_path):
  for workspace_id in ("../escape", "..", ".hidden", "a/b", "x" * 200):
    assert call(server.url, "/summary_task_memory", {"workspace_id": workspace_id,
                                                      "trajectories": [{"messages": conversation(GOAL, WIN),
                                                                        "score": 1.0}]})[0] == 400
  assert not os.path.exists(tmp_path / "escape")
  assert call(server.url, "/vector_store", {"action": "list"})[1]["metadata"]["action_result"] == []


def test_routes_and_methods(server):
  assert call(server.url, "/nope", {"a": 1})[0] == 404
  assert call(server.url, "/retrieve_task_memory")[0] == 405
  assert call(server.url, "/health", {"a": 1})[0] == 405
  status, answer = call(server.url, "/health")
  assert status == 200 and answer["status"] == "healthy" and answer["embedder"] == "hashing"


def raw_request(port, data, read_timeout=10):
  with socket.create_connection(("127.0.0.1", port), timeout=read_timeout) as sock:
    sock.sendall(data)
    chunks = []
    while True:
      chunk = sock.recv(65536)
      if not chunk:
        break
      chunks.append(chunk)
  return b"".join(chunks)


def test_framing(tmp_path):
  service = make_service(tmp_path)
  with ServiceThread(service, max_body_bytes=1000, request_timeout_s=1) as thread:
    assert raw_request(thread.port, b"POST /summary_task_memory HTTP/1.1\r\nContent-Length: 5000\r\n\r\n"
                       ).startswith(b"HTTP/1.1 413")
    assert raw_request(thread.port, b"POST /summary_task_memory HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                       ).startswith(b"HTTP/1.1 411")
    assert raw_request(thread.port, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400")
    for length in (b"\xb2", b"+5", b"1_0", b"-1", b"5 5", b""):  # \xb2 is '\u00b2' in latin-1: isdigit() but no int
      answer = raw_request(thread.port, b"POST /vector_store HTTP/1.1\r\nContent-Length: " + length + b"\r\n\r\n{}")
      assert answer.startswith(b"HTTP/1.1 400") and b"bad Content-Length" in answer, (length, answer[:80])
    assert raw_request(thread.port, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n").startswith(
        b"HTTP/1.1 200")  # still serving
    assert raw_request(thread.port, b"POST /vector_store HTTP/1.1\r\nContent-Length: 10\r\n\r\n{}"
                       ).startswith(b"HTTP/1.1 408")
    assert raw_request(thread.port, b"GET /health HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n"
                       ).startswith(b"HTTP/1.1 431")
    # keep-alive: two requests on one connection, then close
    both = raw_request(thread.port, b"GET /health HTTP/1.1\r\n\r\nGET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert both.count(b"HTTP/1.1 200 OK") == 2
  service.close()


def test_record_and_threshold_delete(server):
  fill(server.url)
  status, answer = em_retrieve(server.url, initial(GOAL), top_k=3)
  used = answer["metadata"]["memory_list"]
  status, answer = call(server.url, "/record_task_memory", {"workspace_id": "default", "memory_dicts": used,
                                                            "update_utility": True})
  assert status == 200 and answer["metadata"]["update_result"] == {"updated_count": 3, "missing_ids": []}
  assert all(m["metadata"]["freq"] == 1 and m["metadata"]["utility"] == 1 for m in answer["metadata"]["memory_list"])
  first = used[0]["memory_id"]
  status, answer = call(server.url, "/record_task_memory", {
      "workspace_id": "default", "update_utility": False,
      "memory_dicts": [{"memory_id": first}, {"memory_id": "gone"}]})
  assert answer["metadata"]["update_result"] == {"updated_count": 1, "missing_ids": ["gone"]}
  assert answer["metadata"]["memory_list"][0]["metadata"]["freq"] == 2
  # utility / freq: first 1/2, the other two 1/1, the untouched memory freq 0
  delete = {"workspace_id": "default", "freq_threshold": 1, "utility_threshold": 0.5}
  assert call(server.url, "/delete_task_memory", delete)[1]["metadata"]["deleted_memory_ids"] == []
  status, answer = call(server.url, "/delete_task_memory", {**delete, "utility_threshold": 0.6})
  assert status == 200 and answer["metadata"]["deleted_memory_ids"] == [first]
  assert answer["metadata"]["update_result"] == {"deleted_count": 1, "inserted_count": 0}
  hits = em_retrieve(server.url, initial(GOAL), top_k=5)[1]["metadata"]["memory_list"]
  assert first not in {m["memory_id"] for m in hits}  # gone from the index too
  assert call(server.url, "/delete_task_memory", {**delete, "freq_threshold": 0})[0] == 400
  assert call(server.url, "/delete_task_memory", {**delete, "workspace_id": "nope"})[0] == 404
  assert call(server.url, "/record_task_memory", {"workspace_id": "nope", "memory_dicts": []})[0] == 404
  assert call(server.url, "/record_task_memory", {"workspace_id": "default", "memory_dicts": [{"id": 1}]})[0] == 400


def test_vector_store_actions(server):
  fill(server.url, "w1")
  status, answer = call(server.url, "/vector_store", {"action": "list"})
  assert status == 200 and answer["metadata"]["action_result"] == ["w1"]
  listed = call(server.url, "/vector_store", {"action": "list", "workspace_id": "w1"})[1]["metadata"]["action_result"]
  assert len(listed) == 4 and all(m["workspace_id"] == "w1" for m in listed)
  # dump (ReMe's layout: path is a folder, the file <workspace_id>.jsonl) and load into another workspace
  status, answer = call(server.url, "/vector_store", {"action": "dump", "workspace_id": "w1", "path": "libs"})
  library = server.server.service.library_dir
  assert status == 200 and answer["metadata"]["action_result"] == {"path": os.path.join(library, "libs", "w1.jsonl"),
                                                                   "count": 4}
  status, answer = call(server.url, "/vector_store", {"action": "load", "workspace_id": "w2",
                                                      "path": "libs/w1.jsonl"})
  assert status == 200 and answer["metadata"]["action_result"]["count"] == 4
  hits = em_retrieve(server.url, initial(OTHER_GOAL), workspace_id="w2")[1]["metadata"]["memory_list"]
  assert hits[0]["when_to_use"] == OTHER_GOAL and hits[0]["workspace_id"] == "w2"
  assert call(server.url, "/vector_store", {"action": "load", "workspace_id": "w3", "path": "libs"})[0] == 404
  # copy, delete_ids, delete
  status, answer = call(server.url, "/vector_store", {"action": "copy", "src_workspace_id": "w1",
                                                      "workspace_id": "w4"})
  assert status == 200 and answer["metadata"]["action_result"] == {"count": 4}
  assert em_retrieve(server.url, initial(GOAL), workspace_id="w4")[1]["answer"]
  assert call(server.url, "/vector_store", {"action": "copy", "src_workspace_id": "w1", "workspace_id": "w4"})[0] == 400
  assert call(server.url, "/vector_store", {"action": "copy", "src_workspace_id": "no", "workspace_id": "w5"})[0] == 404
  status, answer = call(server.url, "/vector_store", {"action": "delete_ids", "workspace_id": "w4",
                                                      "memory_ids": [listed[0]["memory_id"]]})
  assert status == 200 and answer["metadata"]["action_result"] == {"deleted": 1}
  assert len(call(server.url, "/vector_store", {"action": "list", "workspace_id": "w4"})[1]["metadata"]
             ["action_result"]) == 3
  assert call(server.url, "/vector_store", {"action": "delete", "workspace_id": "w4"})[1]["metadata"] == {
      "action_result": {"deleted": True}}
  assert em_retrieve(server.url, initial(GOAL), workspace_id="w4")[1]["answer"] == ""
  assert call(server.url, "/vector_store", {"action": "list"})[1]["metadata"]["action_result"] == ["w1", "w2"]
  assert call(server.url, "/vector_store", {"action": "explode", "workspace_id": "w1"})[0] == 400
  assert call(server.url, "/vector_store", {"action": "list", "workspace_id": "none"})[0] == 404


def test_library_paths_are_confined(server, tmp_path):
  fill(server.url, "w1")
  library = server.server.service.library_dir
  outside = tmp_path / "outside"
  outside.mkdir()
  os.symlink(outside, os.path.join(library, "link"))
  (outside / "w1.jsonl").write_text("")
  for path in ("../outside", str(outside), "/etc", "link", "libs/../../outside", "/"):
    for action in ("dump", "load"):
      status, answer = call(server.url, "/vector_store", {"action": action, "workspace_id": "w1", "path": path})
      assert status == 403, (action, path, answer)
      assert "outside the library directory" in answer["error"]
  assert (outside / "w1.jsonl").read_text() == ""  # nothing written there
  assert call(server.url, "/vector_store", {"action": "dump", "workspace_id": "w1", "path": ""})[0] == 400
  status, answer = call(server.url, "/vector_store", {"action": "dump", "workspace_id": "w1",
                                                      "path": os.path.join(library, "abs")})
  assert status == 200  # an absolute path inside the library directory is fine
  assert call(server.url, "/vector_store", {"action": "dump", "workspace_id": "w1", "path": "."})[0] == 200


def test_internal_failures_are_not_500(tmp_path):
  def broken_pool(*args):
    raise RuntimeError("index exploded")

  service = ExperienceService(ExperienceStore(str(tmp_path / "s1")), HashingEmbedder(), pool_factory=broken_pool)
  with ServiceThread(service) as thread:
    status, answer = em_summary(thread.url, [(conversation(GOAL, WIN), 1.0)])
    assert status == 422 and "index exploded" in answer["error"]
    assert call(thread.url, "/health")[0] == 200
  service.close()

  def unreachable(prompts):
    raise ConnectionError("no model server")

  service = make_service(tmp_path, summarizer=LLMSummarizer(unreachable))
  with ServiceThread(service) as thread:
    status, answer = em_summary(thread.url, [(conversation(GOAL, WIN), 1.0)])
    assert status == 503 and "no model server" in answer["error"]
  service.close()


# -- one interface: the in-process pool or the service ---------------------------------------------------------


def test_client_and_local_backend_agree(server, tmp_path):
  local = LocalBackend(ExperiencePool(ExperienceStore(str(tmp_path / "local")), "default", HashingEmbedder(dim=256)))
  client = ExperienceClient(server.url, workspace_id="default")
  assert isinstance(local, ExperienceBackend) and isinstance(client, ExperienceBackend)
  trajectories = [{"messages": conversation(GOAL, WIN), "score": 1.0, "task_id": "t1",
                   "metadata": {"env": "maze", "item_id": "maze/train/1"}},
                  {"messages": conversation(OTHER_GOAL, ["pick up ball"]), "score": 1.0}]
  results = [backend.summarize(trajectories, step=7) for backend in (local, client)]
  for result in results:
    assert [m.when_to_use for m in result.memories] == [GOAL, OTHER_GOAL]
    assert result.stats["extracted"] == 2
  assert results[0].memories[0].metadata["source"] == ["maze/train/1"]
  queries = [json.dumps(initial(GOAL)), OTHER_GOAL, "   "]
  for backend in (local, client):
    if backend is client:
      queries = queries[:2]  # the service refuses an empty query
    hits = backend.retrieve(queries, 1)
    assert [[m.when_to_use for m, _ in row] for row in hits][:2] == [[GOAL], [OTHER_GOAL]]
    assert hits[0][0][1] == pytest.approx(1.0, abs=1e-4)
    assert hits[0][0][0].metadata["committed_step"] == 7
  assert local.retrieve(["   "], 1) == [[]]
  with pytest.raises(ValueError, match="serves workspace"):
    local.retrieve([GOAL], 1, workspace_id="other")
  with pytest.raises(ExperienceServiceError) as error:
    client.retrieve([GOAL], 0)
  assert error.value.status == 400
  memory_id = client.retrieve([GOAL], 1)[0][0][0].memory_id
  assert client.record([memory_id], update_utility=True) == {"updated_count": 1, "missing_ids": []}
  assert client.delete_by_utility(1, 0.5) == []
  assert client.vector_store("list") == ["default"]
  assert client.health()["status"] == "healthy"
  with pytest.raises(ExperienceServiceError) as error:
    ExperienceClient("http://127.0.0.1:9", timeout_s=5).health()
  assert error.value.status is None


def test_task_query_reduction_matches_the_service(server):
  fill(server.url)
  opening = json.dumps(initial(GOAL), ensure_ascii=False)
  assert task_query(opening) == GOAL
  status, answer = call(server.url, "/retrieve_task_memory", {"workspace_id": "default", "query": opening,
                                                              "top_k": 1})
  assert status == 200 and answer["metadata"]["query"] == task_query(opening)
  assert answer["metadata"]["memory_list"][0]["when_to_use"] == GOAL  # the reduced text is what was searched
  status, answer = call(server.url, "/retrieve_task_memory", {"workspace_id": "default", "query": OTHER_GOAL})
  assert status == 200 and answer["metadata"]["query"] == task_query(OTHER_GOAL) == OTHER_GOAL


# -- access and limits ---------------------------------------------------------------------------------------------

TOKEN = "t0ken-for-tests_" + "x" * 16
TOKEN_ENV = "EVOLVER_TEST_EXPERIENCE_TOKEN"


def exchange(url, route, body=None, headers=None):
  """(status, headers, raw body) of one request, whatever the status."""
  data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
  request = urllib.request.Request(url + route, data=data, method="GET" if data is None else "POST",
                                   headers={"Content-Type": "application/json", **(headers or {})})
  try:
    with urllib.request.urlopen(request, timeout=30) as response:
      return response.status, response.headers, response.read()
  except urllib.error.HTTPError as error:
    return error.code, error.headers, error.read()


def bearer(token=TOKEN):
  return {"Authorization": f"Bearer {token}"}


def healthy(url, headers=None, workspaces=None):
  """Whether /health answers 200 healthy (with that many workspaces, when given)."""
  status, _, raw = exchange(url, "/health", headers=headers)
  answer = json.loads(raw)
  return status == 200 and answer["status"] == "healthy" and workspaces in (None, answer["workspaces"])


def test_token_is_required_on_every_route(tmp_path):
  service = make_service(tmp_path)
  with ServiceThread(service, token=TOKEN, request_timeout_s=5) as thread:
    summary = {"workspace_id": "secret-ws", "trajectories": [{"messages": conversation(GOAL, WIN), "score": 1.0}]}
    assert exchange(thread.url, "/summary_task_memory", summary, bearer())[0] == 200
    requests = [("/health", None), ("/", None), ("/vector_store", {"action": "list"}),
                ("/retrieve_task_memory", {"workspace_id": "secret-ws", "query": GOAL}),
                ("/summary_task_memory", summary), ("/vector_store", {"action": "count", "workspace_id": "secret-ws"}),
                ("/vector_store", {"action": "list", "workspace_id": "secret-ws" + " " * 2**20})]  # a 1 MiB body
    refused = [None, bearer("wrong"), bearer(TOKEN + "x"), bearer(TOKEN[:-1]), {"Authorization": TOKEN},
               {"Authorization": f"Basic {TOKEN}"}, {"Authorization": "Bearer"}]
    for route, body in requests:
      for headers in refused:
        status, answer_headers, raw = exchange(thread.url, route, body, headers)
        assert status == 401, (route, headers, raw[:200])
        assert answer_headers["WWW-Authenticate"] == "Bearer" and answer_headers["Connection"] == "close"
        assert b"secret-ws" not in raw and TOKEN.encode() not in raw and json.loads(raw)["success"] is False
    two = raw_request(thread.port, b"GET /health HTTP/1.1\r\nAuthorization: Bearer " + TOKEN.encode() +
                      b"\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n\r\n")
    assert two.startswith(b"HTTP/1.1 401")  # two Authorization headers: refused, not guessed
    assert raw_request(thread.port, b"GET /health HTTP/1.1\r\nauthorization: bearer " + TOKEN.encode() +
                       b"\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 200")  # names are case-insensitive
    status, _, raw = exchange(thread.url, "/vector_store", {"action": "list"}, bearer())
    assert status == 200 and json.loads(raw)["metadata"]["action_result"] == ["secret-ws"]
    assert healthy(thread.url, bearer(), workspaces=1)  # still serving after the refusals
  service.close()
  with pytest.raises(ValueError, match="visible ASCII"):
    ServiceThread(make_service(tmp_path / "other"), token="has space")


def test_client_sends_the_token_from_its_env(tmp_path, monkeypatch):
  service = make_service(tmp_path)
  with ServiceThread(service, token=TOKEN) as thread:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    client = ExperienceClient(thread.url, workspace_id="w", token_env=TOKEN_ENV)
    assert TOKEN not in repr(client) and TOKEN_ENV in repr(client)
    assert client.health()["status"] == "healthy"
    assert len(client.summarize([{"messages": conversation(GOAL, WIN), "score": 1.0}]).memories) == 1
    assert client.retrieve([GOAL], 1)[0][0][0].when_to_use == GOAL and client.count() == 1
    with pytest.raises(ExperienceServiceError) as error:
      ExperienceClient(thread.url).health()
    assert error.value.status == 401 and "token_env" in str(error.value)
    monkeypatch.setenv(TOKEN_ENV, "not-the-token")
    wrong = ExperienceClient(thread.url, token_env=TOKEN_ENV)
    with pytest.raises(ExperienceServiceError) as error:
      wrong.count("w")
    assert error.value.status == 401 and "not-the-token" not in str(error.value) and "'w'" not in str(error.value)
    for value in ("", None):
      if value is None:
        monkeypatch.delenv(TOKEN_ENV)
      else:
        monkeypatch.setenv(TOKEN_ENV, value)
      with pytest.raises(ValueError, match=f"{TOKEN_ENV} .*unset or empty"):
        ExperienceClient(thread.url, token_env=TOKEN_ENV)
    assert client.health()["status"] == "healthy"  # the token was read once, at construction
  service.close()


def read_response(sock):
  """One HTTP response (head and Content-Length body) from a kept-alive socket."""
  data = b""
  while b"\r\n\r\n" not in data:
    data += sock.recv(65536)
  head, _, body = data.partition(b"\r\n\r\n")
  length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
  while len(body) < length:
    body += sock.recv(65536)
  return head


def test_connections_past_the_cap_get_503(tmp_path):
  service = make_service(tmp_path)
  with ServiceThread(service, max_connections=2) as thread:
    held = [socket.create_connection(("127.0.0.1", thread.port), timeout=10) for _ in range(2)]
    try:
      for sock in held:  # answered, so both count as open (idle keep-alive) connections
        sock.sendall(b"GET /health HTTP/1.1\r\n\r\n")
        assert read_response(sock).startswith(b"HTTP/1.1 200")
      refused = raw_request(thread.port, b"GET /health HTTP/1.1\r\n\r\n")
      assert refused.startswith(b"HTTP/1.1 503") and b"\r\nRetry-After: 1\r\n" in refused
      assert b"max_connections" in refused and b"Connection: close" in refused
      status, headers, _ = exchange(thread.url, "/vector_store", {"action": "list"})
      assert status == 503 and headers["Retry-After"] == "1"
      held[0].sendall(b"GET /health HTTP/1.1\r\n\r\n")  # the held connections are unaffected
      assert read_response(held[0]).startswith(b"HTTP/1.1 200")
    finally:
      held.pop().close()
    deadline = time.monotonic() + 10
    while not healthy(thread.url) and time.monotonic() < deadline:  # the server notices the close
      time.sleep(0.05)
    assert healthy(thread.url)
    held[0].close()
  service.close()


def test_workspace_cap_refuses_new_workspaces(tmp_path):
  service = make_service(tmp_path, max_workspaces=2, max_open_pools=1)
  store_root = tmp_path / "store"
  with ServiceThread(service) as thread:
    fill(thread.url, "w1")
    fill(thread.url, "w2")
    assert call(thread.url, "/vector_store", {"action": "dump", "workspace_id": "w1", "path": "libs"})[0] == 200
    creations = [("/summary_task_memory", {"workspace_id": "w3", "trajectories": [
                     {"messages": conversation(GOAL, WIN), "score": 1.0}]}),
                 ("/vector_store", {"action": "load", "workspace_id": "w3", "path": "libs/w1.jsonl"}),
                 ("/vector_store", {"action": "copy", "src_workspace_id": "w1", "workspace_id": "w3"})]
    for route, body in creations:
      status, answer = call(thread.url, route, body)
      assert status == 409 and "max_workspaces" in answer["error"] and answer["success"] is False, (route, answer)
    # what never creates a workspace still answers
    assert em_retrieve(thread.url, initial(GOAL), workspace_id="w3")[1]["answer"] == ""
    assert call(thread.url, "/vector_store", {"action": "count", "workspace_id": "w3"})[1]["metadata"] == {
        "action_result": {"count": 0}}
    assert call(thread.url, "/record_task_memory", {"workspace_id": "w3", "memory_dicts": []})[0] == 404
    assert sorted(os.listdir(store_root)) == ["libraries", "w1", "w2"]  # nothing of w3 on disk
    assert call(thread.url, "/vector_store", {"action": "list"})[1]["metadata"]["action_result"] == ["w1", "w2"]
    # existing workspaces take writes; one pool open at a time, reopened as needed
    assert em_summary(thread.url, [(conversation("Your goal: find the key.", ["search"]), 1.0)], "w1")[0] == 200
    for workspace_id in ("w2", "w1", "w2"):
      hits = em_retrieve(thread.url, initial(OTHER_GOAL), workspace_id=workspace_id)[1]["metadata"]["memory_list"]
      assert hits[0]["when_to_use"] == OTHER_GOAL and hits[0]["workspace_id"] == workspace_id
      assert len(service._pools) == 1  # pylint: disable=protected-access
    # room again once one is deleted
    assert call(thread.url, "/vector_store", {"action": "delete", "workspace_id": "w2"})[0] == 200
    status, answer = call(thread.url, "/vector_store", {"action": "copy", "src_workspace_id": "w1",
                                                        "workspace_id": "w3"})
    assert status == 200 and answer["metadata"]["action_result"] == {"count": 5}
    assert healthy(thread.url, workspaces=2)
  service.close()
  with pytest.raises(ValueError, match="max_workspaces"):
    make_service(tmp_path / "other", max_workspaces=0)


def test_record_counts_each_listing_and_stamps_steps(server, tmp_path):
  """The service and the in-process pool bump alike (an id listed twice twice), and a rewind undoes exactly the
  bumps stamped after its step."""
  store = ExperienceStore(str(tmp_path / "local"))
  local = LocalBackend(ExperiencePool(store, "default", HashingEmbedder(dim=256)))
  client = ExperienceClient(server.url)
  trajectories = [{"messages": conversation(GOAL, WIN), "score": 1.0},
                  {"messages": conversation(OTHER_GOAL, ["pick up ball"]), "score": 1.0}]
  workspaces = {}
  for backend, root in ((local, tmp_path / "local"), (client, tmp_path / "store")):
    a, b = (m.memory_id for m in backend.summarize(trajectories, step=1).memories)
    assert backend.record([a, a, b], step=3) == {"updated_count": 3, "missing_ids": []}
    assert backend.record([a, "gone", "gone"], update_utility=True, step=5) == {"updated_count": 1,
                                                                               "missing_ids": ["gone"]}
    assert backend.record([b], update_utility=True) == {"updated_count": 1, "missing_ids": []}  # unstamped
    assert backend.record([]) == {"updated_count": 0, "missing_ids": []}
    workspaces[backend] = (ExperienceStore(str(root)).open("default", create=False), a, b)

  def counters(backend):
    workspace, a, b = workspaces[backend]
    by_id = {m.memory_id: m.metadata for m in workspace.all()}
    return [(by_id[i]["freq"], by_id[i]["utility"]) for i in (a, b)]

  def served(backend):  # what the backend itself answers, not the store read behind its back
    _, a, b = workspaces[backend]
    found = {m.memory_id: m.metadata for row in backend.retrieve([GOAL, OTHER_GOAL], 1) for m, _ in row}
    return [(found[i]["freq"], found[i]["utility"]) for i in (a, b)]

  for backend in (local, client):
    assert counters(backend) == served(backend) == [(3, 1), (2, 1)]
    workspaces[backend][0].set_aside_after(4)  # undoes the step-5 bump
    assert served(backend) == [(2, 0), (2, 1)]
    workspaces[backend][0].set_aside_after(2)  # undoes the step-3 bumps; the unstamped one stays
    assert served(backend) == counters(backend) == [(0, 0), (1, 1)]
  with pytest.raises(ExperienceServiceError) as error:
    client.record(["x"], step=-1)
  assert error.value.status == 400 and "step" in error.value.message
  for step in ("3", 1.5, True):
    status, answer = call(server.url, "/record_task_memory", {"workspace_id": "default", "memory_dicts": [],
                                                              "step": step})
    assert status == 400 and "step" in answer["error"]
  with pytest.raises(ValueError, match="step"):
    local.record(["x"], step=-1)
  with pytest.raises(TypeError, match="sequence of ids"):
    client.record("abc")
  assert healthy(server.url)


def test_count_and_load_library(server, tmp_path):
  client = ExperienceClient(server.url, workspace_id="w1")
  assert client.count() == 0 and client.count("never-made") == 0
  assert client.vector_store("list") == []  # counting created nothing
  fill(server.url, "w1")
  assert client.count() == 4
  local = LocalBackend(ExperiencePool(ExperienceStore(str(tmp_path / "local")), "w1", HashingEmbedder(dim=256)))
  assert local.count() == 0
  local.summarize([{"messages": conversation(GOAL, WIN), "score": 1.0}])
  assert local.count() == 1
  assert client.vector_store("dump", workspace_id="w1", path="libs")["count"] == 4
  assert client.load_library("libs/w1.jsonl", workspace_id="w2") == 4
  assert client.count("w2") == 4
  with pytest.raises(ExperienceServiceError) as error:
    client.load_library("../elsewhere.jsonl", workspace_id="w3")
  assert error.value.status == 403 and client.count("w3") == 0
  assert healthy(server.url, workspaces=2)


# -- the launcher -----------------------------------------------------------------------------------------------


def test_serve_experience_launcher(tmp_path, monkeypatch):
  monkeypatch.setenv(TOKEN_ENV, TOKEN)
  process = subprocess.Popen(
      [sys.executable, "-m", "launch.serve_experience", "--store", str(tmp_path / "store"), "--embedder", "hashing",
       "--port", "0", "--token_env", TOKEN_ENV, "--max_connections", "8", "--max_workspaces", "1"], cwd=ROOT,
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  try:
    deadline, url = time.monotonic() + 120, None
    lines = []
    while time.monotonic() < deadline:
      line = process.stdout.readline()
      if not line:
        break
      lines.append(line)
      if line.startswith("READY "):
        url = line.split()[1].strip()
        break
    assert url and url.startswith("http://127.0.0.1:"), "".join(lines)
    assert TOKEN not in "".join(lines) and f"${TOKEN_ENV}" in "".join(lines)
    assert call(url, "/health")[0] == 401
    client = ExperienceClient(url, token_env=TOKEN_ENV)
    assert client.health()["status"] == "healthy"
    assert len(client.summarize([{"messages": conversation(GOAL, WIN), "score": 1.0}]).memories) == 1
    assert client.retrieve([json.dumps(initial(GOAL))], 1)[0][0][0].when_to_use == GOAL
    with pytest.raises(ExperienceServiceError) as error:
      client.summarize([{"messages": conversation(GOAL, WIN), "score": 1.0}], workspace_id="second")
    assert error.value.status == 409  # --max_workspaces 1
  finally:
    process.kill()
    process.wait(timeout=30)


def test_serve_experience_launcher_refuses_an_unset_token_env(tmp_path, monkeypatch):
  monkeypatch.delenv(TOKEN_ENV, raising=False)
  done = subprocess.run([sys.executable, "-m", "launch.serve_experience", "--store", str(tmp_path / "store"),
                         "--embedder", "hashing", "--token_env", TOKEN_ENV], cwd=ROOT, capture_output=True, text=True,
                        timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert done.returncode == 2 and f"{TOKEN_ENV} (token_env) is unset or empty" in done.stderr, done.stderr
  assert not os.path.exists(tmp_path / "store")  # refused before touching the store
