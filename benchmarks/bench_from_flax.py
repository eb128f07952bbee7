"""Converted Flax examples against their original loops: eval time ratios, cold and warm, in one process.

Run from the repository root: ``python -m benchmarks.bench_from_flax [--repeats N] [--only NAME ...]``.
The examples are our own re-creations of today's Flax loops (`examples/from_flax/`: same pipelines, same
eval steps, tiny models, 8 virtual CPU devices unless ``XLA_FLAGS`` says otherwise); the repository holds
no Flax code, so the real files' conversions (`docs/howto`) are timed by the same two functions when run
against a Flax checkout. Nothing is asserted.

Per example: ``cold`` is the first call of each loop (tracing and compilation included; the original
first, so the converted loop's data pipeline is not warmed by it: they build their own), ``warm`` the
minimum over ``--repeats`` interleaved later calls. Ratio: converted over original (issue 33's goals:
mnist and sst2 within 1.1 warm and cold, the others within 1.05 warm).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GOALS = {"mnist_nnx": (1.1, 1.1), "sst2": (1.1, 1.1)}  # (cold, warm); the others: warm 1.05
DEFAULT_GOAL = (None, 1.05)


def time_example(name: str, repeats: int) -> dict:
  """``{"cold": (original, converted), "warm": (original, converted)}`` in seconds."""
  from examples.from_flax import common

  module = importlib.import_module(f"examples.from_flax.{name}")
  inputs = module.make_inputs()
  run = {
    role: (getattr(module, f"{role.upper()}_TRACES"), getattr(module, f"{role}_eval"))
    for role in ("original", "converted")
  }
  cold = tuple(common.run_counted(*run[role], *inputs).seconds for role in run)
  warm = {role: [] for role in run}
  for _ in range(repeats):  # interleaved: a slow moment of the machine costs both
    for role in run:
      warm[role].append(common.run_counted(*run[role], *inputs).seconds)
  return {"cold": cold, "warm": (min(warm["original"]), min(warm["converted"]))}


def main(argv: list[str] | None = None) -> None:
  from examples.from_flax import report

  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5, help="warm calls per loop (default 5)")
  parser.add_argument("--only", nargs="*", default=None, help="example module names")
  args = parser.parse_args(argv)
  names = args.only or list(report.EXAMPLES + report.BINNED)
  print(
    "| example | cold: original s | converted s | ratio | warm: original s | converted s | ratio |"
  )
  print("|---|---|---|---|---|---|---|")
  for name in names:
    times = time_example(name, args.repeats)
    goal_cold, goal_warm = GOALS.get(name, DEFAULT_GOAL)
    cells = []
    for (original, converted), goal in ((times["cold"], goal_cold), (times["warm"], goal_warm)):
      ratio = converted / original
      mark = "" if goal is None else f" (goal {goal}{'' if ratio <= goal else ', missed'})"
      cells += [f"{original:.3f}", f"{converted:.3f}", f"{ratio:.2f}{mark}"]
    print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
  main()
