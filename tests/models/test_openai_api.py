"""The OpenAI-compatible chat client against a scripted local server: retries, Retry-After, errors, rate limit."""

import email.utils
import json
import threading
import time

import pytest

from evolver.models.openai_api import (APIRequestError, APIUnavailable, ContextLengthExceeded, OpenAIChat,
                                       RateLimiter, retry_after_s)
from tests.fake_http import JSONHandler, serving


class _Scripted(JSONHandler):
  """Answers each request with the next scripted (status, headers, body); then 200s echoing the last message."""

  script: list = []
  seen: list = []

  def do_POST(self):  # noqa: N802 (http.server's name)
    body = self.read_json()
    type(self).seen.append((self.path, self.headers.get("Authorization"), body))
    if type(self).script:
      status, headers, payload = type(self).script.pop(0)
    else:
      status, headers = 200, {}
      payload = {"choices": [{"message": {"role": "assistant", "content": "echo: " + body["messages"][-1]["content"]},
                              "finish_reason": "stop"}], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}
    self.send_json(status, payload, headers)


@pytest.fixture()
def server():
  _Scripted.script, _Scripted.seen = [], []
  with serving(_Scripted) as url:
    yield url + "/v1"


def test_a_reply_with_its_request_fields_and_usage(server):
  client = OpenAIChat(server + "/", "tiny", api_key="sk-test", timeout_s=10)
  reply = client.chat([{"role": "user", "content": "hi"}], max_tokens=16, temperature=0.5, top_p=0.9, stop=["\n"],
                      seed=3)
  assert (reply.text, reply.finish_reason, reply.prompt_tokens, reply.completion_tokens) == ("echo: hi", "stop", 7, 3)
  path, auth, body = _Scripted.seen[0]
  assert path == "/v1/chat/completions" and auth == "Bearer sk-test"
  assert body == {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5,
                  "max_tokens": 16, "top_p": 0.9, "stop": ["\n"], "seed": 3}
  assert client.stats()["requests"] == 1 and client.stats()["retries"] == 0


def test_retries_429_and_5xx_and_honours_retry_after(server):
  _Scripted.script = [(429, {"Retry-After": "0.4"}, {"error": {"message": "slow down"}}),
                      (500, {}, {"error": "boom"}), (503, {}, {})]
  # The 429 waits its Retry-After (0.4 s), the 5xx the backoff (0.1 and 0.2 s).
  client = OpenAIChat(server, "tiny", timeout_s=10, max_retries=3, backoff_s=0.05)
  started = time.perf_counter()
  assert client.chat([{"role": "user", "content": "x"}]).text == "echo: x"
  took = time.perf_counter() - started
  assert 0.4 <= took < 3.0
  assert client.stats()["requests"] == 4 and client.stats()["retries"] == 3
  _Scripted.script = [(429, {"Retry-After": "0.3"}, {})]
  slow = OpenAIChat(server, "tiny", timeout_s=10, max_retries=1, backoff_s=30.0)
  started = time.perf_counter()
  slow.chat([{"role": "user", "content": "y"}])
  assert 0.3 <= time.perf_counter() - started < 5.0  # waited the server's 0.3 s, not the 30 s backoff


def test_gives_up_after_the_retries_with_the_last_error(server):
  _Scripted.script = [(502, {}, {"error": "bad gateway"})] * 3
  with pytest.raises(APIUnavailable, match="3 attempts.*502"):
    OpenAIChat(server, "tiny", timeout_s=10, max_retries=2, backoff_s=0.01).chat([{"role": "user", "content": "x"}])
  with pytest.raises(APIUnavailable, match="attempts"):
    OpenAIChat("http://127.0.0.1:9/v1", "tiny", timeout_s=5, max_retries=1, backoff_s=0.01).chat(
        [{"role": "user", "content": "x"}])


def test_non_retryable_errors_are_clear_and_never_show_the_key(server):
  _Scripted.script = [(401, {}, {"error": {"message": "Invalid API key"}})]
  client = OpenAIChat(server, "tiny", api_key="sk-very-secret", timeout_s=10, max_retries=3, backoff_s=0.01)
  with pytest.raises(APIRequestError, match="401: Invalid API key.*api_key_env") as caught:
    client.chat([{"role": "user", "content": "x"}])
  assert caught.value.status == 401 and "sk-very-secret" not in str(caught.value)
  assert client.stats()["requests"] == 1  # not retried
  assert "sk-very-secret" not in json.dumps(client.stats())
  _Scripted.script = [(400, {}, {"error": {"message": "This model's maximum context length is 32 tokens"}})]
  with pytest.raises(ContextLengthExceeded):
    client.chat([{"role": "user", "content": "x"}])
  _Scripted.script = [(404, {}, {"detail": "Not Found"})]
  with pytest.raises(APIRequestError, match="404: Not Found.*API root"):
    client.chat([{"role": "user", "content": "x"}])
  with pytest.raises(ValueError, match="http"):
    OpenAIChat("127.0.0.1:8000/v1", "tiny")


def test_rate_limit_spaces_requests_over_threads():
  limiter = RateLimiter(20.0)
  started = time.perf_counter()
  threads = [threading.Thread(target=limiter.acquire) for _ in range(6)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert time.perf_counter() - started >= 5 / 20 - 0.01
  with pytest.raises(ValueError):
    RateLimiter(-1.0)


def test_retry_after_forms():
  assert retry_after_s("2") == 2.0 and retry_after_s(None) is None and retry_after_s("soon") is None
  later = email.utils.formatdate(time.time() + 30, usegmt=True)
  assert 25 <= retry_after_s(later) <= 31
