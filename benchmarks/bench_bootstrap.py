"""Step-time cost of ``pe.metrics.Bootstrap`` (100 and 1000 replicas) as a ratio to the bare metric.

One compiled step ``state.merge(metric.batch_updates(**batch))`` on one CPU device, timed as the median of
``rounds`` runs of ``steps`` steps (after a warm-up), for accuracy (C=10), macro F1 (C=10 and C=1000) and
perplexity (``[B, T, V]`` logits). Also reports the state's bytes. The model is not included: the ratio is the
metric's own cost, an upper bound on the overhead in a real evaluation step.

Run: ``python -m benchmarks.bench_bootstrap [--quick]``.
"""

from __future__ import annotations

import os

if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import padded_eval as pe  # noqa: E402
from benchmarks.common import markdown_table  # noqa: E402


def classification_batch(batch: int, classes: int, rng) -> dict:
  return {
    "preds": rng.normal(size=(batch, classes)).astype(np.float32),
    "target": rng.integers(0, classes, batch),
    "mask": np.arange(batch) < batch - 3,
    "index": np.arange(batch, dtype=np.int32),
  }


def text_batch(batch: int, tokens: int, vocab: int, rng) -> dict:
  return {
    "preds": rng.normal(size=(batch, tokens, vocab)).astype(np.float32),
    "target": rng.integers(0, vocab, (batch, tokens)),
    "mask": rng.random((batch, tokens)) < 0.9,
    "index": np.arange(batch, dtype=np.int32),
  }


def step_seconds(metric, batch: dict, steps: int, rounds: int) -> float:
  """Median seconds per compiled step (``merge(batch_updates)``)."""
  step = jax.jit(lambda state, b: state.merge(metric.batch_updates(**b)))
  batch = jax.device_put(batch)
  state = jax.block_until_ready(step(metric.empty(), batch))
  times = []
  for _ in range(rounds):
    start = time.perf_counter()
    for _ in range(steps):
      state = step(state, batch)
    jax.block_until_ready(state)
    times.append((time.perf_counter() - start) / steps)
  return statistics.median(times)


def cases(quick: bool, rng):
  batch = 64 if quick else 256
  yield "accuracy C=10", pe.metrics.Accuracy(), classification_batch(batch, 10, rng)
  yield "macro F1 C=10", pe.metrics.F1Score(num_classes=10), classification_batch(batch, 10, rng)
  yield (
    "macro F1 C=1000",
    pe.metrics.F1Score(num_classes=1000),
    classification_batch(batch, 1000, rng),
  )
  tokens, vocab = (16, 256) if quick else (64, 1000)
  yield "perplexity", pe.metrics.Perplexity(), text_batch(batch // 8, tokens, vocab, rng)


def run(quick: bool = False) -> str:
  """The results table (Markdown)."""
  rng = np.random.default_rng(0)
  steps, rounds = (3, 3) if quick else (10, 5)
  replica_counts = (10, 100) if quick else (100, 1000)
  rows = []
  for label, metric, batch in cases(quick, rng):
    bare = step_seconds(metric, batch, steps, rounds)
    row = [label, f"{bare * 1e3:.2f}"]
    for r in replica_counts:
      wrapped = pe.metrics.Bootstrap(metric, num_replicas=r)
      seconds = step_seconds(wrapped, batch, steps, rounds)
      row += [f"{seconds * 1e3:.2f} ({seconds / bare:.1f}x)", f"{wrapped.state_nbytes():,}"]
    rows.append(row)
  header = ["metric", "bare ms/step"]
  for r in replica_counts:
    header += [f"R={r} ms/step (/ bare)", f"R={r} state bytes"]
  return markdown_table(header, rows)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
  args = parser.parse_args()
  print(run(quick=args.quick))


if __name__ == "__main__":
  main()
