"""Train-step benchmark: evolver's jitted train step against a PyTorch eager step of the same model.

Both sides: the pinned ~20M Qwen2 shape on the same random weights, batch 16 x 512 tokens, token-mean
next-token cross-entropy, AdamW (lr 1e-4, wd 0.01, clip 1.0), float32, CPU, all cores. Reports tokens/s,
the ratio, and evolver's model FLOP utilisation (6 x params x tokens + attention, against a measured f32
matmul peak on this machine). `compare` is the measurement; the smollm2 suite runs it on SmolLM2-135M.

  python -m launch.benchmark --suite train [--repeats 5] [--batch 16] [--seq 512]
"""

import argparse
import json
import os
import tempfile

from launch.benchmarks import common

_MODULE = "launch.benchmarks.train"


def _batch(batch: int, seq: int, vocab: int):
  import numpy as np
  rng = np.random.default_rng(0)
  ids = rng.integers(10, vocab, size=(batch, seq)).astype(np.int32)
  mask = np.ones((batch, seq), np.float32)
  mask[:, 0] = 0
  return ids, mask


def _worker_jax(ckpt: str, batch: int, seq: int, repeats: int) -> dict:
  import jax
  from flax import nnx
  from evolver import models
  from evolver.models import sharding
  from evolver.train import optimizer as optimizer_lib, state as state_lib, step as step_lib
  model = models.load_hf(ckpt)
  graphdef, params = nnx.split(model)
  opt = optimizer_lib.make_optimizer(1000, learning_rate=1e-4, warmup_steps=0, decay="constant",
                                     weight_decay=0.01, b2=0.999, grad_clip=1.0)
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  state = state_lib.create_train_state(params, opt, seed=0)
  shardings = step_lib.state_shardings(state, mesh)
  state = jax.device_put(state, shardings)
  step = step_lib.TrainStepPrograms(graphdef, step_lib.sft_loss_fn, opt, mesh, shardings)
  ids, mask = _batch(batch, seq, model.config.vocab_size)
  data = {"input_ids": ids, "loss_mask": mask}
  holder = {"state": state}

  def once():
    holder["state"], metrics = step(holder["state"], data)
    return float(metrics["loss"])

  first_loss = once()
  seconds, times = common.median_time(once, warmup=1, repeats=repeats)
  flops = 3 * model.config.flops_per_token(seq) * batch * seq
  return {"seconds": seconds, "times": times, "first_loss": first_loss, "flops": flops}


def _worker_torch(ckpt: str, batch: int, seq: int, repeats: int, threads: int) -> dict:
  import torch
  import transformers
  torch.set_num_threads(threads)
  model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32,
                                                            attn_implementation="sdpa")
  model.train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8)
  ids, mask = _batch(batch, seq, model.config.vocab_size)
  ids_t = torch.as_tensor(ids, dtype=torch.long)
  mask_t = torch.as_tensor(mask)

  def once():
    logits = model(ids_t).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids_t[:, 1:].reshape(-1),
                                            reduction="none").view(batch, seq - 1)
    m = mask_t[:, 1:]
    loss = (nll * m).sum() / m.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss)

  first_loss = once()
  seconds, times = common.median_time(once, warmup=1, repeats=repeats)
  return {"seconds": seconds, "times": times, "first_loss": first_loss}


def _worker_peak() -> dict:
  import jax
  import jax.numpy as jnp
  n = 2048
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  seconds, _ = common.median_time(lambda: f(a).block_until_ready(), warmup=2, repeats=10)
  return {"flops_per_s": 2 * n ** 3 / seconds}


def compare(ckpt: str, *, batch: int, seq: int, repeats: int, torch_threads: int, model_desc: str = "~20M Qwen2",
            mfu: bool = True) -> dict:
  """Both sides' train step on the transformers directory `ckpt`, each in its own process; prints the table.

  Returns `ours` and `peer` (tokens/s: batch x seq / median seconds a step), `speedup` (ours / peer), each side's
  first loss (`first_loss_ours`, `first_loss_peer`) and, with `mfu`, evolver's `mfu` against the measured
  `peak_flops_per_s`."""
  shape = [ckpt, str(batch), str(seq), str(repeats)]
  ours = common.run_worker(_MODULE, ["--worker", "jax", *shape])
  peer = common.run_worker(_MODULE, ["--worker", "torch", *shape, str(torch_threads)])
  tokens = batch * seq
  ours_tps, peer_tps = tokens / ours["seconds"], tokens / peer["seconds"]
  common.print_table(
      f"Train step: {model_desc}, batch {batch} x {seq}, token-mean CE + AdamW, float32, CPU",
      ["side", "median s", "tokens/s", "first loss"],
      [["evolver (jax, jit)", f"{ours['seconds']:.3f}", f"{ours_tps:.0f}", f"{ours['first_loss']:.4f}"],
       [f"PyTorch eager ({torch_threads} threads)", f"{peer['seconds']:.3f}", f"{peer_tps:.0f}",
        f"{peer['first_loss']:.4f}"]])
  result = {"ours": ours_tps, "peer": peer_tps, "speedup": ours_tps / peer_tps, "first_loss_ours": ours["first_loss"],
            "first_loss_peer": peer["first_loss"]}
  if mfu:
    peak = common.run_worker(_MODULE, ["--worker", "peak"])
    result.update(mfu=ours["flops"] / ours["seconds"] / peak["flops_per_s"], peak_flops_per_s=peak["flops_per_s"])
    print(f"matmul peak (f32 2048^3, jax): {peak['flops_per_s'] / 1e9:.1f} GFLOP/s; evolver MFU {result['mfu']:.1%}")
  print(f"train step speedup {result['speedup']:.2f}x")
  return result


def run(args: list[str]) -> dict:
  parser = argparse.ArgumentParser(prog="launch.benchmark --suite train")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--seq", type=int, default=512)
  parser.add_argument("--torch_threads", type=int, default=os.cpu_count() or 1)
  parser.add_argument("--checkpoint", default=None)
  opts = parser.parse_args(args)
  ckpt = opts.checkpoint or common.make_reference_checkpoint(
      os.path.join(tempfile.gettempdir(), "evolver_bench_qwen2_20m"))
  result = compare(ckpt, batch=opts.batch, seq=opts.seq, repeats=opts.repeats, torch_threads=opts.torch_threads,
                   model_desc=opts.checkpoint or "~20M Qwen2")
  return {"suite": "train", "unit": "tokens/s", **result, "batch": opts.batch, "seq": opts.seq}


if __name__ == "__main__":
  import sys
  if sys.argv[1] == "--worker":
    kind = sys.argv[2]
    if kind == "peak":
      print(json.dumps(_worker_peak()))
    else:
      ckpt, batch, seq, repeats = sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
      if kind == "jax":
        print(json.dumps(_worker_jax(ckpt, batch, seq, repeats)))
      else:
        print(json.dumps(_worker_torch(ckpt, batch, seq, repeats, int(sys.argv[7]))))
