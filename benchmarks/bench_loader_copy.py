"""What the copy of a loader's batches costs: `pe.pad_batches` over a generator, with its copy and without.

`pad_batches` copies each batch a non-Sequence source yields (a loader may refill the arrays it yielded once asked
for the next batch, while JAX on CPU may read a placed numpy array in place; see
`padded_eval.data.sources.iterable`). Measured: one pass of `pad_batches` over a generator of 64-row batches of
``[3, 32, 32]`` float32 images, 200 batches and a short last one, as it is and with the copy switched off (the
module's `_copied` replaced by the identity), interleaved in one process; and a plain pass of the generator.
Reported: the medians and the ratio (with copy) / (without).

Usage: ``python -m benchmarks.bench_loader_copy [--rounds R]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import padded_eval as pe
from padded_eval.data.sources import iterable

BATCH, BATCHES = 64, 200


def _data(seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  rows = BATCH * BATCHES + 17
  return {
    "image": rng.normal(size=(rows, 3, 32, 32)).astype(np.float32),
    "label": rng.integers(0, 10, rows),
  }


class Loader:
  """A re-iterable loader yielding views of in-memory arrays, 64 rows at a time."""

  def __init__(self, data: dict):
    self.data = data

  def __iter__(self):
    rows = len(self.data["label"])
    for start in range(0, rows, BATCH):
      yield {key: value[start : start + BATCH] for key, value in self.data.items()}


def measure(rounds: int) -> dict[str, float]:
  """Median seconds of one pass: ``plain`` (the generator), ``copy`` and ``no copy`` (pad_batches)."""
  loader, copied = Loader(_data()), iterable._copied
  passes = {
    "plain": lambda: sum(len(b["label"]) for b in loader),
    "copy": lambda: sum(int(b["mask"].sum()) for b in pe.pad_batches(loader, BATCH)),
    "no copy": lambda: sum(int(b["mask"].sum()) for b in pe.pad_batches(loader, BATCH)),
  }
  times: dict[str, list[float]] = {name: [] for name in passes}
  try:
    for _ in range(rounds):
      for name, one_pass in passes.items():
        iterable._copied = (lambda chunk: chunk) if name == "no copy" else copied
        start = time.perf_counter()
        one_pass()
        times[name].append(time.perf_counter() - start)
  finally:
    iterable._copied = copied
  return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=9)
  medians = measure(parser.parse_args().rounds)
  print(" ".join(f"{name}: {seconds * 1e3:.2f} ms" for name, seconds in medians.items()))
  print(f"pad_batches with copy / without: {medians['copy'] / medians['no copy']:.2f}")


if __name__ == "__main__":
  main()
