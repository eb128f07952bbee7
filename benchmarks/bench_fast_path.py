"""Does the small-state fast path pay? masked_eval with the one switch on and off, same process.

The switch is `padded_eval.eval.placement.SMALL_STATE_BYTES`: on (the default), a small state is
carried packed (one byte vector per shard, placed once, not donated) and combined on one device
at the end; off (0), the state's tree is placed fresh, donated from step to step and reduced by
the collective. The scaling benchmark's setup (MLP 32-64-10, accuracy, batches of 1000, 8 virtual
CPU devices), N = 1,000 and 10,000. Reported: the median over interleaved rounds of the ratio
(switch off) / (switch on) per backend: above 1.10 the fast path pays more than 10%.

Usage: ``python -m benchmarks.bench_fast_path [--rounds R]``.
"""

from __future__ import annotations

import os

if "device_count" not in os.environ.get("XLA_FLAGS", ""):  # run alone: 8 virtual devices
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import statistics  # noqa: E402
import sys  # noqa: E402

import padded_eval as pe  # noqa: E402
from benchmarks import speed  # noqa: E402
from benchmarks.common import interleaved_seconds, markdown_table  # noqa: E402
from padded_eval.eval import placement  # noqa: E402

BATCH = 1000
SIZES = speed.Sizes(features=32, hidden=64, classes=10)
BACKENDS = ("pmap", "shard_map", "jit")


def _call(params, data, backend: str, limit: int):
  def run():
    saved, placement.SMALL_STATE_BYTES = placement.SMALL_STATE_BYTES, limit
    try:
      return pe.masked_eval(
        speed._accuracy_step, params, pe.pad_batches(data, BATCH), backend=backend
      )  # noqa: SLF001
    finally:
      placement.SMALL_STATE_BYTES = saved

  return run


def measure(n: int, rounds: int) -> dict[str, float]:
  """{backend: median of (fast path off) / (fast path on)}."""
  params = speed.mlp_init(5, (SIZES.features, SIZES.hidden, SIZES.classes))
  data = speed._data(SIZES, n, seed=n)  # noqa: SLF001 - the scaling benchmark's data
  on = placement.SMALL_STATE_BYTES
  fns = {}
  for backend in BACKENDS:
    fns[f"{backend} on"] = _call(params, data, backend, on)
    fns[f"{backend} off"] = _call(params, data, backend, 0)
  timings = interleaved_seconds(fns, rounds)
  return {b: statistics.median(t[f"{b} off"] / t[f"{b} on"] for t in timings) for b in BACKENDS}


def run(rounds: int = 15, log=print) -> tuple[str, dict]:
  values = {}
  for n in (10**3, 10**4):
    log(f"bench_fast_path: N={n}")
    values[n] = measure(n, rounds)
  rows = [[f"{n:,}", b, f"{r:.2f}"] for n, by in values.items() for b, r in by.items()]
  table = markdown_table(["N", "backend", "time without / with the fast path"], rows)
  return table + f"\n\nMedian of {rounds} interleaved rounds; 8 virtual CPU devices.\n", values


if __name__ == "__main__":
  argv = sys.argv[1:]
  print(run(int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 15)[0])
