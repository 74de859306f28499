"""Sampler benchmark: evolver's jitted KV-cache sampler against transformers' PyTorch `generate` (cache on).

The pinned ~20M Qwen2 shape on the same random weights (or `--checkpoint`); 64-token prompts, 128 new tokens forced
(no stop), greedy, batch 1 and 32; median of several runs after warm-up; each side at its best thread count (each
setting runs in its own process, measuring every batch size in turn). `compare` is the measurement; the smollm2
suite runs it on SmolLM2-135M.

  python -m launch.benchmark --suite sampler [--repeats 5] [--batches 1,32] [--new_tokens 128]
"""

import argparse
import json
import os
import tempfile
from collections.abc import Callable, Sequence

from launch.benchmarks import common

PROMPT_LEN = 64
NEW_TOKENS = 128
_MODULE = "launch.benchmarks.sampler"


def _prompts(batch: int, vocab: int):
  import numpy as np
  return np.random.default_rng(0).integers(10, vocab, size=(batch, PROMPT_LEN)).astype(np.int64)


def _per_batch(batches: Sequence[int], repeats: int, warmup: int, generate: Callable[[int], list[int]]) -> dict:
  """Times `generate(batch)` (which returns row 0's first 8 new tokens) at each batch size, in turn:
  {str(batch): {seconds (median), times, tokens}}."""
  results = {}
  for batch in batches:
    last = []
    seconds, times = common.median_time(lambda b=batch: last.append(generate(b)), warmup=warmup, repeats=repeats)
    results[str(batch)] = {"seconds": seconds, "times": times, "tokens": last[-1]}
  return results


def _worker_jax(ckpt: str, batches: Sequence[int], repeats: int, new_tokens: int) -> dict:
  from evolver import models
  from evolver.models.sampler import Sampler, SamplingParams
  model = models.load_hf(ckpt)
  # The cache this workload needs (a session's cache holds max_length slots from the start; transformers' grows).
  sampler = Sampler(model, max_length=PROMPT_LEN + new_tokens)
  prompts = {b: _prompts(b, model.config.vocab_size).tolist() for b in batches}
  params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)

  def generate(batch: int) -> list[int]:
    out = sampler.generate(prompts[batch], params)
    assert all(len(t) == new_tokens for t in out.tokens)
    return out.tokens[0][:8]

  return _per_batch(batches, repeats, 2, generate)


def _worker_torch(ckpt: str, batches: Sequence[int], repeats: int, new_tokens: int, threads: int) -> dict:
  import torch
  import transformers
  torch.set_num_threads(threads)
  model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
  ids = {b: torch.as_tensor(_prompts(b, model.config.vocab_size)) for b in batches}

  def generate(batch: int) -> list[int]:
    with torch.inference_mode():
      out = model.generate(ids[batch], attention_mask=torch.ones_like(ids[batch]), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, use_cache=True, eos_token_id=None,
                           pad_token_id=0)
    assert out.shape[1] == PROMPT_LEN + new_tokens
    return out[0, PROMPT_LEN:PROMPT_LEN + 8].tolist()

  return _per_batch(batches, repeats, 1, generate)


def compare(ckpt: str, batches: Sequence[int], *, repeats: int, new_tokens: int = NEW_TOKENS,
            torch_threads: Sequence[int] = (1, 2), jax_settings: Sequence[str] = tuple(common.JAX_CORE_SETTINGS),
            model_desc: str = "~20M Qwen2") -> dict:
  """Both sides on the transformers directory `ckpt`, every thread setting in its own process; prints the table.

  Returns, for each batch B: `ours_bB` and `peer_bB` (each side's best tokens/s: B x new_tokens / median seconds),
  `speedup_bB` (ours / peer) and `agree_bB` (the first 8 greedy tokens of row 0 are the same on both sides)."""
  common.check_jax_settings(jax_settings)
  rows, best = [], {}

  def record(batch: int, side: str, setting: str, res: dict) -> None:
    tps = batch * new_tokens / res["seconds"]
    rows.append([batch, side, setting, f"{res['seconds']:.3f}", f"{tps:.0f}"])
    if (batch, side) not in best or tps > best[(batch, side)][0]:
      best[(batch, side)] = (tps, setting, res["tokens"])

  # Each setting in its own process (thread settings apply at start-up), measuring every batch size in turn.
  shape = [ckpt, ",".join(map(str, batches)), str(repeats), str(new_tokens)]
  for name in jax_settings:
    res = common.run_worker(_MODULE, ["--worker", "jax", *shape], cores=common.JAX_CORE_SETTINGS[name])
    for batch in batches:
      record(batch, "evolver (jax)", name, res[str(batch)])
  for threads in torch_threads:
    res = common.run_worker(_MODULE, ["--worker", "torch", *shape, str(threads)])
    for batch in batches:
      record(batch, "transformers generate", f"{threads} thread(s)", res[str(batch)])
  common.print_table(f"Sampler: {model_desc}, prompt {PROMPT_LEN}, {new_tokens} new tokens, greedy, float32, CPU",
                     ["batch", "side", "threads", "median s", "tokens/s"], sorted(rows, key=lambda row: row[0]))
  result = {}
  for batch in batches:
    ours, peer = best[(batch, "evolver (jax)")], best[(batch, "transformers generate")]
    agree = ours[2] == peer[2]
    print(f"batch {batch}: ours {ours[0]:.0f} tok/s ({ours[1]}) vs peer {peer[0]:.0f} tok/s ({peer[1]}): "
          f"{ours[0] / peer[0]:.2f}x; first greedy tokens agree: {agree}")
    result.update({f"ours_b{batch}": ours[0], f"peer_b{batch}": peer[0], f"speedup_b{batch}": ours[0] / peer[0],
                   f"agree_b{batch}": agree})
  return result


def run(args: list[str]) -> dict:
  parser = argparse.ArgumentParser(prog="launch.benchmark --suite sampler")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--batches", default="1,32")
  parser.add_argument("--new_tokens", type=int, default=NEW_TOKENS)
  parser.add_argument("--torch_threads", default="1,2")
  parser.add_argument("--jax_settings", default=",".join(common.JAX_CORE_SETTINGS),
                      help=f"comma-separated, of {list(common.JAX_CORE_SETTINGS)}")
  parser.add_argument("--checkpoint", default=None, help="a transformers Qwen2 directory (default: random pinned ~20M)")
  opts = parser.parse_args(args)
  batches = [int(b) for b in opts.batches.split(",")]
  ckpt = opts.checkpoint or common.make_reference_checkpoint(
      os.path.join(tempfile.gettempdir(), "evolver_bench_qwen2_20m"))
  result = {"suite": "sampler", "unit": "tokens/s", "prompt_len": PROMPT_LEN, "new_tokens": opts.new_tokens}
  result.update(compare(ckpt, batches, repeats=opts.repeats, new_tokens=opts.new_tokens,
                        torch_threads=[int(t) for t in opts.torch_threads.split(",")],
                        jax_settings=opts.jax_settings.split(","),
                        model_desc=opts.checkpoint or "~20M Qwen2"))
  top = max(batches)
  result.update(ours=result[f"ours_b{top}"], peer=result[f"peer_b{top}"], speedup=result[f"speedup_b{top}"],
                batch=top)
  return result


if __name__ == "__main__":
  import sys
  if len(sys.argv) > 1 and sys.argv[1] == "--worker":
    kind, ckpt = sys.argv[2:4]
    batches, repeats, new_tokens = [int(b) for b in sys.argv[4].split(",")], int(sys.argv[5]), int(sys.argv[6])
    if kind == "jax":
      print(json.dumps(_worker_jax(ckpt, batches, repeats, new_tokens)))
    else:
      print(json.dumps(_worker_torch(ckpt, batches, repeats, new_tokens, int(sys.argv[7]))))
