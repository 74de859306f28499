"""Speed benchmarks, side by side with a named peer.

  python -m launch.benchmark --suite sampler
  python -m launch.benchmark --suite env
  python -m launch.benchmark --suite retrieval   # experience index: ScaNN vs exact numpy at 100k and 1M
  python -m launch.benchmark --suite smollm2     # SmolLM2-135M: sampler, train step vs PyTorch; GRPO step memory
  python -m launch.benchmark --suite dot_ceiling # XLA's matmul kernels vs PyTorch's on SmolLM2's shapes
  python -m launch.benchmark --suite NAME --help  # the suite's options

Prints a readable table; the last line is one JSON object with at least `suite`, `ours`, `peer`, `unit` and
`speedup` (ours / peer, higher is better), `machine` (the CPU it ran on), plus per-suite fields.
"""

import argparse
import importlib
import json
import os
import pkgutil
import platform
import sys

from launch import benchmarks


HELPER_MODULES = ("common",)  # launch/benchmarks/ modules that are not suites


def available_suites() -> list[str]:
  return sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__)
                if not m.name.startswith("_") and m.name not in HELPER_MODULES)


def machine() -> dict:
  """The CPU a result was measured on: its model name, cores this process may use, and the widest vector ISA
  (from /proc/cpuinfo where there is one)."""
  model, flags = platform.processor() or platform.machine(), set()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
          model = value.strip()
        elif key.strip() == "flags":
          flags = set(value.split())
  except OSError:
    pass
  isa = next((name for name in ("avx512f", "avx2", "avx", "neon", "asimd") if name in flags), "unknown")
  return {"cpu": model, "cores": len(os.sched_getaffinity(0)), "vector_isa": isa}


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   add_help=False)
  parser.add_argument("-h", "--help", action="store_true", help="this help; with --suite, the suite's options")
  parser.add_argument("--suite", help=f"one of {available_suites()}")
  args, rest = parser.parse_known_args(argv)
  if args.suite is None:
    if args.help:
      parser.print_help()
      parser.exit()
    parser.error("the following arguments are required: --suite")
  if args.help:
    rest = ["--help", *rest]  # the suite's parser prints its options and exits
  if args.suite not in available_suites():
    parser.error(f"unknown suite {args.suite!r}; choose one of {available_suites()}")
  module = importlib.import_module(f"launch.benchmarks.{args.suite}")
  result = module.run(rest)
  for key in ("suite", "ours", "peer", "unit", "speedup"):
    if key not in result:
      raise RuntimeError(f"suite {args.suite!r} returned no {key!r}")
  result.setdefault("machine", machine())
  sys.stdout.flush()
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
