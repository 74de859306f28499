"""The CPU reference for SmolLM2-135M's decode: llama.cpp on the original Q4_1 GGUF file against evolver's sampler
on the same file dequantized to float32.

Not a like-for-like peer: llama.cpp multiplies 4-bit blocks with its own quantized kernels and reads ~1/6 of the
bytes a float32 matmul does, so at batch 1 (memory-bound decode) it is expected to be well ahead. It is recorded once,
as the figure a CPU user of this file would otherwise get (issue: a measurement, not a dependency). Both sides: the
same 64 random prompt ids, 128 new tokens forced (no stop), greedy, batch 1 (llama-cpp-python decodes one sequence),
median of `--repeats` runs after warm-up, each thread setting in its own process; the time includes the prompt.

  pip install -e ".[llamacpp]"     # llama-cpp-python==0.3.36: builds llama.cpp from source (minutes); not a dependency
  python -m launch.benchmark --suite llama_cpp [--repeats 5] [--threads 1,2]
"""

import argparse
import os
from collections.abc import Sequence

from launch.benchmarks import common, sampler

_MODULE = "launch.benchmarks.llama_cpp"


def _worker_llama(path: str, repeats: int, new_tokens: int, threads: int) -> dict:
  """llama.cpp on the GGUF file at `path`: {"1": {seconds, times, tokens}} as the sampler suite's workers report."""
  import itertools
  import llama_cpp
  llm = llama_cpp.Llama(model_path=path, n_ctx=sampler.PROMPT_LEN + new_tokens, n_threads=threads,
                        n_threads_batch=threads, n_batch=sampler.PROMPT_LEN, verbose=False)
  prompt = sampler._prompts(1, llm.n_vocab())[0].tolist()

  def generate(batch: int) -> list[int]:
    del batch
    llm.reset()
    # `generate` yields the next token forever (the eos is a stop only for the completion API); temp 0 is greedy.
    out = list(itertools.islice(llm.generate(prompt, temp=0.0, top_k=1, reset=True), new_tokens))
    assert len(out) == new_tokens
    return out[:8]

  return sampler._per_batch([1], repeats, 1, generate)


def compare(path: str, ckpt: str, *, repeats: int, new_tokens: int, threads: Sequence[int],
            jax_settings: Sequence[str]) -> dict:
  """llama.cpp on the GGUF file `path` at each thread count and evolver's sampler on its float32 export `ckpt` at
  each of `jax_settings`, batch 1; prints the table. Returns `ours`, `peer` (each side's best tokens/s), `speedup`
  (ours / peer) and `agree` (row 0's first 8 greedy tokens equal; they may differ: Q4_1 against its dequantized
  float32 with other kernels and accumulation orders)."""
  common.check_jax_settings(jax_settings)
  rows, best = [], {}

  def record(side: str, setting: str, res: dict) -> None:
    tps = new_tokens / res["seconds"]
    rows.append([side, setting, f"{res['seconds']:.3f}", f"{tps:.1f}"])
    if side not in best or tps > best[side][0]:
      best[side] = (tps, setting, res["tokens"])

  shape = [ckpt, "1", str(repeats), str(new_tokens)]
  for name in jax_settings:
    res = common.run_worker(sampler._MODULE, ["--worker", "jax", *shape], cores=common.JAX_CORE_SETTINGS[name])
    record("evolver (jax, float32)", name, res["1"])
  for n in threads:
    res = common.run_worker(_MODULE, ["--worker", path, str(repeats), str(new_tokens), str(n)])
    record("llama.cpp (Q4_1)", f"{n} thread(s)", res["1"])
  common.print_table(f"SmolLM2-135M decode, prompt {sampler.PROMPT_LEN}, {new_tokens} new tokens, greedy, batch 1, CPU",
                     ["side", "threads", "median s", "tokens/s"], rows)
  ours, peer = best["evolver (jax, float32)"], best["llama.cpp (Q4_1)"]
  print(f"ours {ours[0]:.1f} tok/s ({ours[1]}) vs llama.cpp {peer[0]:.1f} tok/s ({peer[1]}): "
        f"{ours[0] / peer[0]:.2f}x")
  return {"ours": ours[0], "peer": peer[0], "speedup": ours[0] / peer[0], "agree": ours[2] == peer[2],
          "ours_setting": ours[1], "peer_setting": peer[1]}


def run(args: list[str]) -> dict:
  parser = argparse.ArgumentParser(prog="launch.benchmark --suite llama_cpp", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--new_tokens", type=int, default=sampler.NEW_TOKENS)
  parser.add_argument("--threads", default="1,2", help="llama.cpp's thread counts, comma-separated")
  parser.add_argument("--jax_settings", default=",".join(common.JAX_CORE_SETTINGS),
                      help="evolver's thread settings, comma-separated")
  opts = parser.parse_args(args)
  try:
    import llama_cpp
  except ImportError as e:
    raise SystemExit("the llama_cpp suite needs llama-cpp-python, which evolver does not depend on: "
                     "pip install llama-cpp-python==0.3.36, or the llamacpp extra (it builds llama.cpp from source)") from e
  from evolver.models import gguf
  path, ckpt = gguf.smollm2_path(), gguf.smollm2_checkpoint()
  result = {"suite": "llama_cpp", "unit": "tokens/s", "gguf": os.path.basename(path), "batch": 1,
            "prompt_len": sampler.PROMPT_LEN, "new_tokens": opts.new_tokens, "llama_cpp_version": llama_cpp.__version__}
  result.update(compare(path, ckpt, repeats=opts.repeats, new_tokens=opts.new_tokens,
                        threads=[int(t) for t in opts.threads.split(",")], jax_settings=opts.jax_settings.split(",")))
  return result


if __name__ == "__main__":
  import json
  import sys
  if len(sys.argv) > 1 and sys.argv[1] == "--worker":
    path, repeats, new_tokens, threads = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    print(json.dumps(_worker_llama(path, repeats, new_tokens, threads)))
