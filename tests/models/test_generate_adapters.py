"""The generate adapters (evolver.models.generate): an endpoint (a loopback fake, the key from the variable that
api_key_env names), another checkpoint and the live policy (a real tiny policy through a rollout engine's sampler,
served only inside `live_policy`)."""

import gin
import jax
import pytest
from flax import nnx

from evolver.models import generate
from evolver.models.openai_api import APIUnavailable, api_key_from_env
from evolver.models.tokenizer import load_tokenizer
from evolver.rollout import RolloutEngine
from tests.fake_http import EchoChat, echo_chat
from tests.rollout.tiny_policy import tiny_model, tiny_sampler

KEY_ENV = "EVOLVER_TEST_GENERATE_KEY"
PROMPTS = ["Summarize: the door was locked.", "Judge: step 0 moved east.", "Propose a task."]

# -- an OpenAI-compatible endpoint --------------------------------------------------------------------------------


@pytest.fixture()
def endpoint():
  with echo_chat() as url:
    yield url


def test_the_endpoint_adapter_sends_the_key_from_the_named_variable(endpoint, monkeypatch):
  monkeypatch.setenv(KEY_ENV, "sk-from-the-environment")
  adapter = generate.OpenAIGenerate(endpoint + "/", "tiny", api_key_env=KEY_ENV, max_new_tokens=7, temperature=0.3,
                                    seed=5, timeout_s=10)
  assert adapter(PROMPTS) == [f"echo: {p}" for p in PROMPTS] and adapter([]) == []
  assert adapter.url == endpoint + "/chat/completions" and adapter.model == "tiny" and adapter.api_key_env == KEY_ENV
  path, auth, body = EchoChat.requests[0]
  assert path == "/v1/chat/completions" and auth == "Bearer sk-from-the-environment"
  assert body["messages"] == [{"role": "user", "content": body["messages"][0]["content"]}]
  assert body["max_tokens"] == 7 and body["temperature"] == 0.3 and body["seed"] == 5
  EchoChat.requests = []
  assert generate.OpenAIGenerate(endpoint, "tiny", timeout_s=10)(["x"]) == ["echo: x"]
  assert EchoChat.requests[0][1] is None  # no api_key_env: no key sent


@pytest.mark.parametrize("value", [None, ""])
def test_an_unset_or_empty_key_variable_is_an_error_that_names_it(monkeypatch, value):
  if value is None:
    monkeypatch.delenv(KEY_ENV, raising=False)
  else:
    monkeypatch.setenv(KEY_ENV, value)
  with pytest.raises(ValueError, match=f"environment variable {KEY_ENV} \\(api_key_env\\) is unset or empty"):
    generate.OpenAIGenerate("http://127.0.0.1:9/v1", "tiny", api_key_env=KEY_ENV)
  assert api_key_from_env(None) is None
  with pytest.raises(ValueError, match="must name an environment variable"):
    api_key_from_env("")


def test_the_endpoint_adapter_raises_the_clients_errors(endpoint):
  with pytest.raises(APIUnavailable, match="500: model crashed"):
    generate.OpenAIGenerate(endpoint, "broken", timeout_s=10, max_retries=0)(["x"])
  with pytest.raises(APIUnavailable):
    generate.OpenAIGenerate("http://127.0.0.1:9/v1", "tiny", timeout_s=5, max_retries=0)(["x", "y"])


@gin.configurable("role_for_test", module="tests.models.test_generate_adapters")
def role(generate_fn=gin.REQUIRED):
  """A role that takes its adapter from gin, as the judge, the summarizer and the proposer do."""
  return generate_fn(["hello"])


def test_gin_records_the_variable_name_never_the_key(endpoint, monkeypatch):
  monkeypatch.setenv(KEY_ENV, "sk-never-in-a-config")
  gin.clear_config()
  with gin.unlock_config():
    gin.parse_config(["role_for_test.generate_fn = @judge/OpenAIGenerate()",
                      f"judge/OpenAIGenerate.base_url = '{endpoint}'", "judge/OpenAIGenerate.model = 'tiny'",
                      f"judge/OpenAIGenerate.api_key_env = '{KEY_ENV}'"])
  try:
    assert role() == ["echo: hello"] and EchoChat.requests[0][1] == "Bearer sk-never-in-a-config"
    for text in (gin.config_str(), gin.operative_config_str()):
      assert KEY_ENV in text and "sk-never-in-a-config" not in text
  finally:
    gin.clear_config()


# -- in process: the live policy and another checkpoint ------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer():
  return load_tokenizer()


@pytest.fixture(scope="module")
def engine(tokenizer):
  with jax.default_device(jax.devices()[0]):
    rollout_engine = RolloutEngine(tiny_sampler(tiny_model(tokenizer)), tokenizer)
  with rollout_engine:
    yield rollout_engine


def test_the_live_policy_is_served_only_inside_the_block(engine):
  live = generate.LivePolicyGenerate(max_new_tokens=6)
  assert live.model == generate.LIVE_POLICY_MODEL
  with pytest.raises(generate.NoLivePolicy, match="only a running RL loop serves"):
    live(["x"])
  with generate.live_policy(lambda: engine):
    assert generate.current_live_policy() == (engine.sampler, engine.tokenizer)
    with pytest.raises(RuntimeError, match="already being served"):
      generate.serve_live_policy(lambda: engine)
  with pytest.raises(generate.NoLivePolicy):
    live(["x"])
  with generate.live_policy(lambda: "not a policy"), pytest.raises(TypeError, match="must have .sampler"):
    live(["x"])
  with pytest.raises(TypeError, match="provider is a function"):
    generate.serve_live_policy(engine)


def test_the_live_policy_samples_the_weights_being_trained(engine, tokenizer):
  live = generate.LivePolicyGenerate(max_new_tokens=6, batch_size=2)
  first_weights = engine.sampler.params
  with jax.default_device(jax.devices()[0]), generate.live_policy(lambda: engine):
    replies = live(PROMPTS)
    assert len(replies) == 3 and all(isinstance(r, str) for r in replies) and any(replies)
    assert live(PROMPTS[::-1]) == replies[::-1]  # greedy; a reply does not depend on the batch
    # The provider is read at every call: new weights in the sampler, new replies.
    engine.sampler.update_params(nnx.split(tiny_model(tokenizer, seed=1))[1])
    try:
      assert live(PROMPTS) != replies
    finally:
      engine.sampler.update_params(first_weights)
    assert live(PROMPTS) == replies
    long_prompt = "word " * 3000  # with max_new_tokens, longer than the sampler's 2,048 slots
    assert live([long_prompt, PROMPTS[0]]) == ["", replies[0]]


def test_sampled_replies_are_keyed_on_the_prompt_not_the_call(engine):
  warm = generate.LivePolicyGenerate(max_new_tokens=6, temperature=1.0, batch_size=1, seed=3)
  with jax.default_device(jax.devices()[0]), generate.live_policy(lambda: engine):
    replies = warm(PROMPTS)
    assert warm(PROMPTS) == replies  # a second call (a resumed run) replies the same
    batched = generate.LivePolicyGenerate(max_new_tokens=6, temperature=1.0, batch_size=3, seed=3)
    assert batched([PROMPTS[2], PROMPTS[0]]) == [replies[2], replies[0]]
  keys = generate.prompt_keys(["a", "b", "a"], seed=0)
  assert keys.shape[0] == 3 and (keys[0] != keys[2]).any() and (keys[0] != keys[1]).any()
  assert (generate.prompt_keys(["a"], seed=0)[0] == keys[0]).all()


def test_another_checkpoint_plays_the_role(engine, tokenizer):
  loaded = []

  def load_policy(init_checkpoint=None, hf_checkpoint=None):
    loaded.append((init_checkpoint, hf_checkpoint))
    return tiny_model(tokenizer)

  with jax.default_device(jax.devices()[0]):
    adapter = generate.CheckpointGenerate(load_policy=load_policy, init_checkpoint="runs/bc", max_new_tokens=6,
                                          batch_size=2, max_length=2048)
    assert loaded == [("runs/bc", None)] and adapter.model == "runs/bc"
    with generate.live_policy(lambda: engine):  # the same weights as the live engine's: the same greedy replies
      assert adapter(PROMPTS) == generate.LivePolicyGenerate(max_new_tokens=6)(PROMPTS)
  for kwargs in ({}, {"init_checkpoint": "a", "hf_checkpoint": "b"}):
    with pytest.raises(ValueError, match="exactly one"):
      generate.CheckpointGenerate(load_policy=load_policy, **kwargs)
