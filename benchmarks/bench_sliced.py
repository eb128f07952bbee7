"""Cost of ``pe.metrics.Sliced`` at 1, 100 and 10,000 slices, as ratios to the bare metric.

One compiled step ``state.merge(metric.batch_updates(**batch))`` on one CPU device (256 rows, slice
ids uniform over the slices), for Accuracy and macro F1 (C=10), by both methods: ``segments``
(per-row states segment-summed into the slices, the default) and ``vmap`` (the batch update once
per slice). Reported per configuration: ms per step and its ratio to the unsliced metric's
(median of interleaved rounds, measured in the same process), the state's bytes and their ratio,
and the compiled step's temporary memory (XLA's ``memory_analysis``) and its ratio.

Run: ``python -m benchmarks.bench_sliced [--quick]``.
"""

from __future__ import annotations

import os

if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import statistics  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import padded_eval as pe  # noqa: E402
from benchmarks.common import interleaved_seconds, markdown_table  # noqa: E402
from padded_eval.metrics.resampling.bootstrap import nbytes  # noqa: E402

SLICE_COUNTS = (1, 100, 10_000)


def batch_of(rows: int, classes: int, num_slices: int, rng) -> dict:
  return {
    "preds": rng.normal(size=(rows, classes)).astype(np.float32),
    "target": rng.integers(0, classes, rows).astype(np.int32),
    "mask": np.arange(rows) < rows - 3,
    "slice": rng.integers(0, num_slices, rows).astype(np.int32),
  }


def compiled_step(metric, batch):
  """``(run, temporary bytes)``: a function running ``steps`` compiled steps, and XLA's temp size."""
  step = jax.jit(lambda state, b: state.merge(metric.batch_updates(**b)))
  batch = jax.device_put(batch)
  state = metric.empty()
  compiled = step.lower(state, batch).compile()
  analysis = compiled.memory_analysis()
  temp = getattr(analysis, "temp_size_in_bytes", 0) if analysis is not None else 0

  def run(steps):
    current = state
    for _ in range(steps):
      current = compiled(current, batch)
    return jax.block_until_ready(current)

  return run, temp


def run(quick: bool = False) -> str:
  """The results table (Markdown)."""
  rng = np.random.default_rng(0)
  rows, steps, rounds = (64, 2, 3) if quick else (256, 5, 5)
  slice_counts = (1, 100, 1000) if quick else SLICE_COUNTS
  table = []
  for label, metric in (
    ("Accuracy", pe.metrics.Accuracy()),
    ("macro F1 C=10", pe.metrics.F1Score(num_classes=10, average="macro")),
  ):
    for num_slices in slice_counts:
      batch = batch_of(rows, 10, num_slices, rng)
      bare_batch = {k: v for k, v in batch.items() if k != "slice"}
      bare_run, bare_temp = compiled_step(metric, bare_batch)
      runs, temps, states = {"bare": lambda: bare_run(steps)}, {}, {}
      for method in ("segments", "vmap"):
        sliced = pe.metrics.Sliced(metric, num_slices, method=method)
        fn, temps[method] = compiled_step(sliced, batch)
        runs[method] = lambda fn=fn: fn(steps)
        states[method] = sliced.state_nbytes()
      timings = interleaved_seconds(runs, rounds)
      bare_s = statistics.median(t["bare"] for t in timings) / steps
      for method in ("segments", "vmap"):
        ratio = statistics.median(t[method] / t["bare"] for t in timings)
        seconds = bare_s * ratio
        table.append(
          [
            label,
            f"{num_slices:,}",
            method,
            f"{seconds * 1e3:.2f} ({ratio:.1f}x)",
            f"{states[method]:,} ({states[method] / nbytes(metric.empty()):.0f}x)",
            f"{temps[method]:,} ({temps[method] / max(bare_temp, 1):.0f}x)",
          ]
        )
  header = [
    "metric",
    "slices",
    "method",
    "ms/step (/ bare)",
    "state bytes (/ bare)",
    "temp bytes (/ bare)",
  ]
  return markdown_table(header, table)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
  args = parser.parse_args()
  print(run(quick=args.quick))


if __name__ == "__main__":
  main()
