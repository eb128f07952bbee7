"""Confusion counts per 1024-example batch on CPU: scatter-add vs one-hot matmul.

Times the jitted batch statistics of the multiclass ``[C, C]`` matrix by the two
methods of ``classification_inputs.matrix_counts``, and the per-class tp/fp/fn/tn
counts (one scatter-add) against a one-hot reduction, for C = 10 and C = 1000.
Prints microseconds per batch and the ratio to the scatter-add in the same process.
Also times a binary AUROC update (histogram scatter + exact merge) at the default
65_537 bins against 1_025 bins.

Run: ``python benchmarks/bench_classification.py [--repeats 200]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.metrics import AUROC
from padded_eval.metrics.classification import _inputs as ci

BATCH = 1024


def _one_hot_class_counts(labels, predicted, valid, c):
  """Baseline for per-class counts: reductions of one-hot ``[N, C]`` arrays."""
  true_hot = jnp.where(valid[:, None], jax.nn.one_hot(labels, c, dtype=jnp.int32), 0)
  pred_hot = jnp.where(valid[:, None], jax.nn.one_hot(predicted[:, 0], c, dtype=jnp.int32), 0)
  tp = jnp.sum(true_hot * pred_hot, axis=0)
  fp, fn = jnp.sum(pred_hot, axis=0) - tp, jnp.sum(true_hot, axis=0) - tp
  return jnp.stack([tp, fp, fn, jnp.sum(valid, dtype=jnp.int32) - tp - fp - fn])


def _time_us(fn, args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))  # compile
  best = float("inf")
  for _ in range(3):
    start = time.perf_counter()
    for _ in range(repeats):
      out = fn(*args)
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - start) / repeats)
  return best * 1e6


def run(repeats: int) -> list[tuple[int, str, float]]:
  rows = []
  rng = np.random.default_rng(0)
  for c in (10, 1000):
    labels = jnp.asarray(rng.integers(0, c, BATCH), jnp.int32)
    predicted = jnp.asarray(rng.integers(0, c, (BATCH, 1)), jnp.int32)
    valid = jnp.asarray(rng.random(BATCH) < 0.9)
    args = (labels, predicted, valid)
    variants = {
      "matrix scatter": jax.jit(lambda t, p, v, c=c: ci.matrix_counts(t, p, v, c, "scatter")),
      "matrix matmul": jax.jit(lambda t, p, v, c=c: ci.matrix_counts(t, p, v, c, "matmul")),
      "per-class scatter": jax.jit(lambda t, p, v, c=c: ci.class_counts(t, p, v, c)),
      "per-class one-hot": jax.jit(lambda t, p, v, c=c: _one_hot_class_counts(t, p, v, c)),
    }
    reference = {}
    for name, fn in variants.items():
      reference[name] = np.asarray(fn(*args))
      rows.append((c, name, _time_us(fn, args, repeats)))
    assert (reference["matrix scatter"] == reference["matrix matmul"]).all()
    assert (reference["per-class scatter"] == reference["per-class one-hot"]).all()
  return rows


def run_auroc(repeats: int) -> list[tuple[int, float]]:
  rng = np.random.default_rng(0)
  preds = jnp.asarray(rng.random(BATCH), jnp.float32)
  target = jnp.asarray(rng.integers(0, 2, BATCH), jnp.int32)
  rows = []
  for bins in (1_025, 65_537):
    step = jax.jit(lambda m, p, t: m.update(preds=p, target=t))
    rows.append((bins, _time_us(step, (AUROC(bins), preds, target), repeats)))
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=200)
  args = parser.parse_args()
  rows = run(args.repeats)
  print(f"{'C':>5}  {'variant':<18} {'us/batch':>10}  ratio to scatter")
  for c, name, micros in rows:
    kind = name.split()[0]
    base = next(m for cc, n, m in rows if cc == c and n == f"{kind} scatter")
    print(f"{c:>5}  {name:<18} {micros:>10.1f}  {micros / base:6.2f}x")
  auroc = run_auroc(args.repeats)
  for bins, micros in auroc:
    print(
      f"AUROC update, {bins:>6} bins: {micros:8.1f} us/batch  "
      f"{micros / auroc[0][1]:6.2f}x of {auroc[0][0]} bins"
    )


if __name__ == "__main__":
  main()
