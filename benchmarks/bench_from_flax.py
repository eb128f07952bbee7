"""Converted Flax examples against their original loops: eval time ratios, cold and warm, in one process.

Run from the repository root: ``python -m benchmarks from_flax [--repeats N] [--only NAME ...]``.
The examples are our own re-creations of today's Flax loops (`examples/from_flax/`: same pipelines, same
eval steps, tiny models, 8 virtual CPU devices unless ``XLA_FLAGS`` says otherwise); the repository holds
no Flax code, so the real files' conversions (`docs/howto`) are timed by the same two functions when run
against a Flax checkout. Nothing is asserted.

The converted loop runs on the devices the original uses: one device for mnist, sst2 and ogbg
(whose Flax loops ``jax.jit`` on the default device), all 8 for the others; for mnist and sst2 the
last column is the converted loop on ``masked_eval``'s default, every device (on 8 virtual
devices of 2 CPU cores, sharding a tiny model 8 ways costs more than it saves).

Per example: ``cold`` is the first call of each loop, tracing and compilation included, each in a
fresh Python process of its own (imports and the inputs made before the clock starts; the
median of ``--cold-repeats`` such processes per loop, interleaved), so neither loop is warmed
by the other or by an earlier example (in one process, whichever runs first also pays JAX's
and TensorFlow's first-use costs: mnist's original loop measured 0.46 s first and 1.06 s second);
``--cold in-process`` times them in this process instead, the original first. ``warm`` is the minimum
over ``--repeats`` interleaved later calls, and the last column the ratio of the medians (a data-bound
loop's minimum is one lucky pass of its pipeline). Ratio: converted over original (issue 33's goals:
mnist and sst2 within 1.1 warm and cold, the others within 1.05 warm).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GOALS = {"mnist_nnx": (1.1, 1.1), "sst2": (1.1, 1.1)}  # (cold, warm); the others: warm 1.05
DEFAULT_GOAL = (None, 1.05)
ONE_DEVICE = ("mnist_nnx", "sst2", "ogbg")  # their original loops run on the default device


def converted_kwargs(name: str, all_devices: bool = False) -> dict:
  """The converted loop's keyword arguments: on the devices the original uses (one device for
  the examples of `ONE_DEVICE`, which ``ogbg`` itself passes), or with ``all_devices`` on
  ``masked_eval``'s default, every device."""
  if name not in ONE_DEVICE or name == "ogbg" or all_devices:
    return {}
  import jax
  import numpy as np

  return {"mesh": jax.sharding.Mesh(np.array(jax.devices()[:1]), ("batch",))}


def _runs(name: str):
  """``(module, inputs, {role: (trace counter, eval function, kwargs)})`` of one example."""
  module = importlib.import_module(f"examples.from_flax.{name}")
  runs = {
    role: (getattr(module, f"{role.upper()}_TRACES"), getattr(module, f"{role}_eval"), kwargs)
    for role, kwargs in (("original", {}), ("converted", converted_kwargs(name)))
  }
  if converted_kwargs(name):
    runs["all_devices"] = (module.CONVERTED_TRACES, module.converted_eval, {})
  return module, module.make_inputs(), runs


def cold_seconds(name: str, role: str) -> float:
  """The first call of one loop (``"original"`` or ``"converted"``) in this process, in seconds."""
  from examples.from_flax import common

  _, inputs, runs = _runs(name)
  counter, fn, kwargs = runs[role]
  return common.run_counted(counter, fn, *inputs, **kwargs).seconds


def cold_in_fresh_process(name: str, role: str) -> float:
  """`cold_seconds` in a new Python process (same interpreter, flags and environment)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
  command = [sys.executable, "-m", "benchmarks.bench_from_flax", "--cold-child", name, role]
  done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=600)
  if done.returncode != 0:
    raise RuntimeError(f"cold run of {name} ({role}) failed:\n{done.stderr[-3000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def time_example(name: str, repeats: int, fresh_cold: bool = True, cold_repeats: int = 3) -> dict:
  """``{"cold": (original, converted), "warm": (original, converted), "median": (original,
  converted)}`` in seconds, and, for the examples of `ONE_DEVICE` but ogbg, ``"all_devices"``:
  the converted loop's warm time on every device (``masked_eval``'s default mesh). ``cold`` is
  the median of ``cold_repeats`` fresh processes per loop, interleaved (one first call is one
  sample of a noisy quantity: mnist's converted loop measured 0.70 to 1.24 s in six)."""
  from examples.from_flax import common

  if fresh_cold:
    samples = [
      [cold_in_fresh_process(name, role) for role in ("original", "converted")]
      for _ in range(max(1, cold_repeats))
    ]
    cold = tuple(statistics.median(column) for column in zip(*samples))
  _, inputs, runs = _runs(name)
  if not fresh_cold:  # this process: the original first
    cold = tuple(
      common.run_counted(counter, fn, *inputs, **kwargs).seconds
      for role, (counter, fn, kwargs) in runs.items()
      if role != "all_devices"
    )
  else:  # compile here too, untimed: the warm calls below are warm
    for counter, fn, kwargs in runs.values():
      common.run_counted(counter, fn, *inputs, **kwargs)
  warm = {role: [] for role in runs}
  for _ in range(repeats):  # interleaved: a slow moment of the machine costs both
    for role, (counter, fn, kwargs) in runs.items():
      warm[role].append(common.run_counted(counter, fn, *inputs, **kwargs).seconds)
  times = {
    "cold": cold,
    "warm": (min(warm["original"]), min(warm["converted"])),
    "median": (statistics.median(warm["original"]), statistics.median(warm["converted"])),
  }
  if "all_devices" in warm:
    times["all_devices"] = min(warm["all_devices"])
  return times


def main(argv: list[str] | None = None) -> None:
  from examples.from_flax import report

  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=5, help="warm calls per loop (default 5)")
  parser.add_argument(
    "--cold-repeats",
    type=int,
    default=3,
    help="fresh processes per loop for the cold time, their median (default 3)",
  )
  parser.add_argument("--only", nargs="*", default=None, help="example module names")
  parser.add_argument(
    "--cold",
    choices=("fresh", "in-process"),
    default="fresh",
    help="time each first call in a fresh process (default) or in this one",
  )
  parser.add_argument("--cold-child", nargs=2, metavar=("NAME", "ROLE"), help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.cold_child:  # a fresh process timing one first call (see cold_in_fresh_process)
    print(json.dumps({"seconds": cold_seconds(*args.cold_child)}))
    return
  names = args.only or list(report.EXAMPLES + report.GRAPHS)
  print(
    "| example | cold: original s | converted s | ratio | warm: original s | converted s | ratio "
    "| warm, converted on all 8 devices s | warm, ratio of medians |"
  )
  print("|---|---|---|---|---|---|---|---|---|")
  for name in names:
    times = time_example(name, args.repeats, args.cold == "fresh", args.cold_repeats)
    goal_cold, goal_warm = GOALS.get(name, DEFAULT_GOAL)
    cells = []
    for (original, converted), goal in ((times["cold"], goal_cold), (times["warm"], goal_warm)):
      ratio = converted / original
      mark = "" if goal is None else f" (goal {goal}{'' if ratio <= goal else ', missed'})"
      cells += [f"{original:.3f}", f"{converted:.3f}", f"{ratio:.2f}{mark}"]
    all_devices = times.get("all_devices")
    cells.append("same" if all_devices is None else f"{all_devices:.3f}")
    original, converted = times["median"]
    cells.append(f"{converted / original:.2f}")
    print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
  main()
