"""Eager metric calls (no jit around them): the merge and compute as one program against op by op.

A user who calls ``metric.update(...)`` in a plain Python loop, as with torchmetrics or nnx's
metrics, runs the update eagerly: ``batch_updates`` (op by op) then ``merge``, which now runs as
one jitted program per configuration and state shapes, as do ``aggregate`` and ``compute``. The
baseline is the same methods called without the jit (op by op, as before).

Per metric, in one process: the first update (compilation included, after ``jax.clear_caches()``)
and the median warm update, both ways, interleaved; ratio = now / op by op (below 1 is faster).
A third column times the caller's own ``jax.jit`` of the update; the last two, a warm
``compute()`` both ways.

Run: ``python -m benchmarks.bench_eager [--rounds 15]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

import padded_eval as pe  # noqa: E402
from benchmarks.common import block, markdown_table  # noqa: E402

ROWS, CLASSES = 256, 10
CALLERS_JIT = "caller's jit"

METRICS = {
  "Accuracy": lambda: pe.metrics.Accuracy(),
  "Mean": lambda: pe.metrics.Mean("values"),
  "MSE": lambda: pe.metrics.MSE(),
  "F1Score macro": lambda: pe.metrics.F1Score(num_classes=CLASSES, average="macro"),
}


def _batch(rng: np.random.Generator, rows: int) -> dict:
  mask = rng.random(rows) < 0.8
  preds = rng.normal(size=(rows, CLASSES)).astype(np.float32)
  target = rng.integers(0, CLASSES, rows)
  values = rng.normal(size=rows).astype(np.float32)
  return {"preds": preds, "target": target, "values": values, "mask": mask}


def _inputs(name: str, batch: dict) -> dict:
  if name == "Mean":
    return {"values": batch["values"], "mask": batch["mask"]}
  if name == "MSE":
    return {"preds": batch["values"], "target": batch["values"][::-1].copy(), "mask": batch["mask"]}
  return {"preds": batch["preds"], "target": batch["target"], "mask": batch["mask"]}


def _first_call(update, metric, inputs) -> float:
  jax.clear_caches()
  start = time.perf_counter()
  block(update(metric, inputs))
  return time.perf_counter() - start


def measure(name: str, rounds: int) -> dict:
  rng = np.random.default_rng(0)
  metric = METRICS[name]()
  inputs = _inputs(name, _batch(rng, ROWS))

  def eager(m, kw):
    return m.update(**kw)

  def op_by_op(m, kw):  # the path an eager update took before: the same code, not jitted
    checked = m._checked_inputs(m.routed(kw))
    return m._merged(m._statistics(checked))

  ways = {"op by op": op_by_op, "now": eager, CALLERS_JIT: jax.jit(eager)}
  first = {way: [] for way in ways}
  for _ in range(3):  # interleaved first calls; their median
    for way, update in ways.items():
      first[way].append(_first_call(update, metric, inputs))
  warm = {way: [] for way in ways}
  for update in ways.values():
    block(update(metric, inputs))
  for r in range(rounds):
    order = list(ways)[r % 3 :] + list(ways)[: r % 3]
    for way in order:
      start = time.perf_counter()
      block(ways[way](metric, inputs))
      warm[way].append(time.perf_counter() - start)
  updated = eager(metric, inputs)
  plain_compute = type(updated).compute.__wrapped__  # the subclass's own compute, op by op
  computes = {"op by op": lambda: plain_compute(updated), "now": updated.compute}
  compute = {way: [] for way in computes}
  for fn in computes.values():
    block(fn())
  for r in range(rounds):
    for way in list(computes)[r % 2 :] + list(computes)[: r % 2]:
      start = time.perf_counter()
      block(computes[way]())
      compute[way].append(time.perf_counter() - start)
  return {
    "first": {way: statistics.median(t) for way, t in first.items()},
    "warm": {way: statistics.median(t) for way, t in warm.items()},
    "compute": {way: statistics.median(t) for way, t in compute.items()},
  }


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=15, help="warm calls per way (median)")
  args = parser.parse_args(argv)
  rows = []
  for name in METRICS:
    result = measure(name, args.rounds)
    first, warm = result["first"], result["warm"]
    rows.append(
      [
        name,
        f"{first['op by op']:.3f}",
        f"{first['now']:.3f}",
        f"{first['now'] / first['op by op']:.2f}",
        f"{warm['op by op'] * 1e3:.2f}",
        f"{warm['now'] * 1e3:.2f}",
        f"{warm['now'] / warm['op by op']:.3f}",
        f"{warm[CALLERS_JIT] * 1e3:.2f}",
        f"{result['compute']['op by op'] * 1e3:.2f}",
        f"{result['compute']['now'] * 1e3:.2f}",
      ]
    )
  header = [
    "metric",
    "first call: op by op s",
    "now s",
    "ratio",
    "warm: op by op ms",
    "now ms",
    "ratio",
    "caller's jit ms",
    "compute: op by op ms",
    "now ms",
  ]
  print(f"{ROWS} rows, {CLASSES} classes; first calls: median of 3, warm: median of {args.rounds}")
  print(markdown_table(header, rows))


if __name__ == "__main__":
  main()
