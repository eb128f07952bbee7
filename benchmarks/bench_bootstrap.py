"""Step cost of the wrapper metrics, ``pe.metrics.Bootstrap`` and ``pe.metrics.Sliced``, as ratios to the bare metric.

One compiled step ``state.merge(metric.batch_updates(**batch))`` on one CPU device; the bare metric and its
wrapped forms run ``steps`` steps each per round, rounds interleaved in one process
(``common.interleaved_seconds``); reported: ms per step and the median over rounds of the ratio to the bare
metric's time, and the state's bytes. The model is not included: the ratio is the metric's own cost, an
upper bound on the overhead in a real evaluation step.

* Bootstrap at 100 and 1,000 replicas: accuracy (C=10), macro F1 (C=10 and C=1000) and perplexity
  (``[B, T, V]`` logits).
* Sliced at 1, 100 and 10,000 slices (slice ids uniform over the slices, 256 rows): Accuracy and macro F1
  (C=10) by both methods, ``segments`` (per-row states segment-summed into the slices, the default) and
  ``vmap`` (the batch update once per slice); also the compiled step's temporary memory (XLA's
  ``memory_analysis``) and its ratio. (Formerly ``bench_sliced.py``.)

Run: ``python -m benchmarks bootstrap [--quick] [--only bootstrap|sliced]``.
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


def classification_batch(batch: int, classes: int, rng, num_slices: int = 1) -> dict:
  return {
    "preds": rng.normal(size=(batch, classes)).astype(np.float32),
    "target": rng.integers(0, classes, batch).astype(np.int32),
    "mask": np.arange(batch) < batch - 3,
    "index": np.arange(batch, dtype=np.int32),
    "slice": rng.integers(0, num_slices, batch).astype(np.int32),
  }


def text_batch(batch: int, tokens: int, vocab: int, rng) -> dict:
  return {
    "preds": rng.normal(size=(batch, tokens, vocab)).astype(np.float32),
    "target": rng.integers(0, vocab, (batch, tokens)),
    "mask": rng.random((batch, tokens)) < 0.9,
    "index": np.arange(batch, dtype=np.int32),
  }


def compiled_step(metric, batch: dict, steps: int):
  """``(run, temporary bytes)``: ``run()`` does ``steps`` compiled steps; XLA's temp size."""
  step = jax.jit(lambda state, b: state.merge(metric.batch_updates(**b)))
  batch = jax.device_put(batch)
  state = metric.empty()
  compiled = step.lower(state, batch).compile()
  analysis = compiled.memory_analysis()
  temp = getattr(analysis, "temp_size_in_bytes", 0) if analysis is not None else 0

  def run():
    current = state
    for _ in range(steps):
      current = compiled(current, batch)
    return jax.block_until_ready(current)

  return run, temp


def timed(bare, wrapped: dict, batch: dict, steps: int, rounds: int):
  """Seconds per step of the bare metric, and per wrapped name (ratio to bare, temp bytes)."""
  bare_batch = {k: v for k, v in batch.items() if k in bare.required_inputs() + ("mask",)}
  bare_run, bare_temp = compiled_step(bare, bare_batch, steps)
  runs, temps = {"bare": bare_run}, {}
  for name, metric in wrapped.items():
    runs[name], temps[name] = compiled_step(metric, batch, steps)
  timings = interleaved_seconds(runs, rounds)
  bare_s = statistics.median(t["bare"] for t in timings) / steps
  ratios = {n: statistics.median(t[n] / t["bare"] for t in timings) for n in wrapped}
  return bare_s, ratios, temps, bare_temp


def bootstrap_cases(quick: bool, rng):
  batch = 64 if quick else 256
  yield "accuracy C=10", pe.metrics.Accuracy(), classification_batch(batch, 10, rng)
  yield "macro F1 C=10", pe.metrics.F1Score(num_classes=10), classification_batch(batch, 10, rng)
  wide = 100 if quick else 1000
  yield (
    f"macro F1 C={wide}",
    pe.metrics.F1Score(num_classes=wide),
    classification_batch(batch, wide, rng),
  )
  tokens, vocab = (16, 256) if quick else (64, 1000)
  yield "perplexity", pe.metrics.Perplexity(), text_batch(batch // 8, tokens, vocab, rng)


def bootstrap_table(quick: bool = False) -> str:
  rng = np.random.default_rng(0)
  steps, rounds = (3, 3) if quick else (10, 5)
  replica_counts = (10,) if quick else (100, 1000)  # quick: one wrapped program per case
  rows = []
  for label, metric, batch in bootstrap_cases(quick, rng):
    wrapped = {r: pe.metrics.Bootstrap(metric, num_replicas=r) for r in replica_counts}
    bare_s, ratios, _, _ = timed(metric, wrapped, batch, steps, rounds)
    row = [label, f"{bare_s * 1e3:.2f}"]
    for r, boot in wrapped.items():
      row += [f"{bare_s * ratios[r] * 1e3:.2f} ({ratios[r]:.1f}x)", f"{boot.state_nbytes():,}"]
    rows.append(row)
  header = ["metric", "bare ms/step"]
  for r in replica_counts:
    header += [f"R={r} ms/step (/ bare)", f"R={r} state bytes"]
  return markdown_table(header, rows)


def sliced_table(quick: bool = False) -> str:
  rng = np.random.default_rng(0)
  rows, steps, rounds = (64, 2, 3) if quick else (256, 5, 5)
  table = []
  for label, metric in (
    ("Accuracy", pe.metrics.Accuracy()),
    ("macro F1 C=10", pe.metrics.F1Score(num_classes=10, average="macro")),
  ):
    bare_bytes = pe.metrics.Sliced(metric, 1).state_nbytes()  # one slice: the bare state + a count
    for num_slices in (1, 100) if quick else (1, 100, 10_000):
      batch = classification_batch(rows, 10, rng, num_slices)
      wrapped = {m: pe.metrics.Sliced(metric, num_slices, method=m) for m in ("segments", "vmap")}
      bare_s, ratios, temps, bare_temp = timed(metric, wrapped, batch, steps, rounds)
      for method, sliced in wrapped.items():
        state = sliced.state_nbytes()
        table.append(
          [
            label,
            f"{num_slices:,}",
            method,
            f"{bare_s * ratios[method] * 1e3:.2f} ({ratios[method]:.1f}x)",
            f"{state:,} ({state / bare_bytes:.0f}x)",
            f"{temps[method]:,} ({temps[method] / max(bare_temp, 1):.0f}x)",
          ]
        )
  header = ["metric", "slices", "method", "ms/step (/ bare)", "state bytes (/ 1 slice)"]
  return markdown_table(header + ["temp bytes (/ bare)"], table)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
  parser.add_argument("--only", choices=("bootstrap", "sliced"), default=None)
  args = parser.parse_args()
  if args.only in (None, "bootstrap"):
    print("### Bootstrap\n\n" + bootstrap_table(args.quick) + "\n")
  if args.only in (None, "sliced"):
    print("### Sliced\n\n" + sliced_table(args.quick))


if __name__ == "__main__":
  main()
