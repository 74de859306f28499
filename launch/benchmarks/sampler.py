"""Sampler benchmark: evolver's jitted KV-cache sampler against transformers' PyTorch `generate` (cache on).

The pinned ~20M Qwen2 shape on the same random weights; 64-token prompts, 128 new tokens forced (no stop),
greedy, batch 1 and 32; median of several runs after warm-up; each side at its best thread count (each
setting runs in its own process).

  python -m launch.benchmark --suite sampler [--repeats 5] [--batches 1,32]
"""

import argparse
import json
import os
import tempfile

from launch.benchmarks import common

PROMPT_LEN = 64
NEW_TOKENS = 128


def _prompts(batch: int, vocab: int):
  import numpy as np
  return np.random.default_rng(0).integers(10, vocab, size=(batch, PROMPT_LEN)).astype(np.int64)


def _worker_jax(ckpt: str, batch: int, repeats: int) -> dict:
  from evolver import models
  from evolver.models.sampler import Sampler, SamplingParams
  model = models.load_hf(ckpt)
  # The cache this workload needs (a session's cache holds max_length slots from the start; transformers' grows).
  sampler = Sampler(model, max_length=PROMPT_LEN + NEW_TOKENS)
  prompts = _prompts(batch, model.config.vocab_size).tolist()
  params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0)

  def once():
    out = sampler.generate(prompts, params)
    assert all(len(t) == NEW_TOKENS for t in out.tokens)
    return out

  seconds, times = common.median_time(once, warmup=2, repeats=repeats)
  return {"seconds": seconds, "times": times, "tokens": once().tokens[0][:8]}


def _worker_torch(ckpt: str, batch: int, repeats: int, threads: int) -> dict:
  import torch
  import transformers
  torch.set_num_threads(threads)
  model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
  ids = torch.as_tensor(_prompts(batch, model.config.vocab_size))
  mask = torch.ones_like(ids)

  def once():
    with torch.inference_mode():
      out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                           do_sample=False, use_cache=True, eos_token_id=None, pad_token_id=0)
    assert out.shape[1] == PROMPT_LEN + NEW_TOKENS
    return out

  seconds, times = common.median_time(once, warmup=1, repeats=repeats)
  return {"seconds": seconds, "times": times, "tokens": once()[0, PROMPT_LEN:PROMPT_LEN + 8].tolist()}


_JAX_THREAD_SETTINGS = {
    # name: environment for the worker process
    "all cores": {},
    "1 thread": {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"},
}


def run(args: list[str]) -> dict:
  parser = argparse.ArgumentParser(prog="launch.benchmark --suite sampler")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--batches", default="1,32")
  parser.add_argument("--torch_threads", default="1,2")
  parser.add_argument("--checkpoint", default=None, help="a transformers Qwen2 directory (default: random pinned ~20M)")
  opts = parser.parse_args(args)
  batches = [int(b) for b in opts.batches.split(",")]
  ckpt = opts.checkpoint or common.make_reference_checkpoint(
      os.path.join(tempfile.gettempdir(), "evolver_bench_qwen2_20m"))
  mod = "launch.benchmarks.sampler"
  rows, best = [], {}
  for batch in batches:
    for side, settings in (("evolver (jax)", _JAX_THREAD_SETTINGS),
                           ("transformers generate", {f"{t} thread(s)": t for t in opts.torch_threads.split(",")})):
      for name, setting in settings.items():
        if side.startswith("evolver"):
          res = common.run_worker(mod, ["--worker", "jax", ckpt, str(batch), str(opts.repeats)], env=setting)
        else:
          res = common.run_worker(mod, ["--worker", "torch", ckpt, str(batch), str(opts.repeats), str(setting)])
        tps = batch * NEW_TOKENS / res["seconds"]
        rows.append([batch, side, name, f"{res['seconds']:.3f}", f"{tps:.0f}"])
        key = (batch, side)
        if key not in best or tps > best[key][0]:
          best[key] = (tps, name, res["tokens"])
  common.print_table(f"Sampler: ~20M Qwen2, prompt {PROMPT_LEN}, {NEW_TOKENS} new tokens, greedy, float32, CPU",
                     ["batch", "side", "threads", "median s", "tokens/s"], rows)
  result = {"suite": "sampler", "unit": "tokens/s", "prompt_len": PROMPT_LEN, "new_tokens": NEW_TOKENS}
  for batch in batches:
    ours, peer = best[(batch, "evolver (jax)")], best[(batch, "transformers generate")]
    agree = ours[2] == peer[2]
    print(f"batch {batch}: ours {ours[0]:.0f} tok/s ({ours[1]}) vs peer {peer[0]:.0f} tok/s ({peer[1]}): "
          f"{ours[0] / peer[0]:.2f}x; first greedy tokens agree: {agree}")
    result[f"ours_b{batch}"], result[f"peer_b{batch}"] = ours[0], peer[0]
    result[f"speedup_b{batch}"] = ours[0] / peer[0]
  top = max(batches)
  result.update(ours=result[f"ours_b{top}"], peer=result[f"peer_b{top}"], speedup=result[f"speedup_b{top}"],
                batch=top)
  return result


if __name__ == "__main__":
  import sys
  if len(sys.argv) > 1 and sys.argv[1] == "--worker":
    kind, ckpt, batch, repeats = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    if kind == "jax":
      print(json.dumps(_worker_jax(ckpt, batch, repeats)))
    else:
      print(json.dumps(_worker_torch(ckpt, batch, repeats, int(sys.argv[6]))))
