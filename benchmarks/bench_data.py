"""Cost of pad_batches: host overhead per batch, and the tf.data path's throughput against raw tf.data.

Run: ``python benchmarks/bench_data.py [--quick]``. Prints figures measured in this one process (medians of
interleaved repeats); nothing is asserted.

(a) per-batch host overhead: iterating ``pad_batches`` over batches versus a plain loop over the same batches, in
    microseconds per batch, for aligned full batches (passed through), misaligned batches (re-chunked) and a
    whole-dataset Mapping (sliced).
(b) tf.data: examples/s of ``pad_batches(ds, B)`` over examples/s of the raw pipeline producing the same batches
    (``ds.batch(B)`` or ``ds.rebatch(B)``, prefetched, as numpy), unbatched and batched sources.
(c) a small eval split read once per evaluation: a new ``pad_batches`` over the same batched pipeline against
    iterating the pipeline (the padding pipeline is built once per dataset, so later reads cost little more),
    with the batch size given and with ``None`` (read from the pipeline's first batch, once per dataset); and a
    new pipeline per evaluation, as Flax's examples build theirs, padded against iterated.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import padded_eval as pe  # noqa: E402

BATCH = 256


def make_data(rows: int) -> dict:
  rng = np.random.default_rng(0)
  return {
    "image": rng.random((rows, 32), dtype=np.float32),
    "label": rng.integers(0, 10, rows).astype(np.int32),
    "meta": {"id": np.arange(rows, dtype=np.int64)},
  }


def chunks(data: dict, size: int) -> list[dict]:
  rows = len(data["label"])
  return [
    {
      "image": data["image"][i : i + size],
      "label": data["label"][i : i + size],
      "meta": {"id": data["meta"]["id"][i : i + size]},
    }
    for i in range(0, rows, size)
  ]


def consume(batches) -> int:
  """A trivial consumer that touches each batch: counts rows."""
  rows = 0
  for batch in batches:
    rows += batch["label"].shape[0]
  return rows


def median_seconds(fns: dict, repeats: int) -> dict:
  """Median seconds per named callable, runs interleaved so drift hits all alike."""
  times = {name: [] for name in fns}
  for fn in fns.values():  # warm-up
    fn()
  for _ in range(repeats):
    for name, fn in fns.items():
      start = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}


def host_overhead(num_batches: int, repeats: int) -> None:
  data = make_data(num_batches * BATCH)
  aligned = chunks(data, BATCH)
  misaligned = chunks(data, 200)
  fns = {
    "plain loop": lambda: consume(aligned),
    "aligned": lambda: consume(pe.pad_batches(aligned, BATCH, num_devices=1)),
    "misaligned (200-row inputs)": lambda: consume(
      pe.pad_batches(misaligned, BATCH, num_devices=1)
    ),
    "whole-dataset Mapping": lambda: consume(pe.pad_batches(data, BATCH, num_devices=1)),
  }
  seconds = median_seconds(fns, repeats)
  base = seconds["plain loop"]
  print(
    f"(a) host overhead per batch, {num_batches} batches of {BATCH} rows, 3 leaves (median of {repeats})"
  )
  print(f"    plain loop over the same full batches: {base / num_batches * 1e6:8.2f} us/batch")
  for name in list(fns)[1:]:
    extra = (seconds[name] - base) / num_batches * 1e6
    print(
      f"    pad_batches, {name:28s}: {seconds[name] / num_batches * 1e6:8.2f} us/batch "
      f"(+{extra:.2f} us over the plain loop)"
    )


def tf_throughput(rows: int, repeats: int) -> None:
  import tensorflow as tf

  data = make_data(rows)
  base = tf.data.Dataset.from_tensor_slices(data)
  batched = base.batch(100)

  def raw(ds):
    return lambda: consume(ds.prefetch(tf.data.AUTOTUNE).as_numpy_iterator())

  fns = {
    "raw unbatched": raw(base.batch(BATCH)),
    "padded unbatched": lambda: consume(pe.pad_batches(base, BATCH, num_devices=1)),
    "raw batched": raw(batched.rebatch(BATCH)),
    "padded batched": lambda: consume(pe.pad_batches(batched, BATCH, num_devices=1)),
  }
  seconds = median_seconds(fns, repeats)
  print(f"(b) tf.data, {rows} examples, batch {BATCH} (median of {repeats})")
  for kind, source in (
    ("unbatched", "from_tensor_slices"),
    ("batched", "from_tensor_slices.batch(100)"),
  ):
    raw_rate, padded_rate = rows / seconds[f"raw {kind}"], rows / seconds[f"padded {kind}"]
    print(
      f"    {kind:9s} source ({source}): raw {raw_rate:10.0f} ex/s, pad_batches {padded_rate:10.0f} ex/s, "
      f"ratio {padded_rate / raw_rate:.2f}"
    )


def small_eval_reads(rows: int, repeats: int) -> None:
  """(c) one eval's read of a small batched test split (mnist's: 10,000 rows at batch 128 in Flax;
  here `rows`), the way a converted loop reads it every epoch: a new ``pad_batches`` over the same
  pipeline, against iterating that pipeline as the example's loop does."""
  import tensorflow as tf

  data = make_data(rows)
  pipeline = tf.data.Dataset.from_tensor_slices(data).batch(128).prefetch(1)
  new = lambda: tf.data.Dataset.from_tensor_slices(data).batch(128).prefetch(1)  # noqa: E731
  fns = {
    # Flax's examples build the eval pipeline anew at each evaluation (get_batches / get_datasets)
    "a new pipeline iterated": lambda: consume(new().as_numpy_iterator()),
    "pad_batches over a new pipeline": lambda: consume(pe.pad_batches(new(), 128, num_devices=1)),
    "iterate the pipeline": lambda: consume(pipeline.as_numpy_iterator()),
    "pad_batches over it": lambda: consume(pe.pad_batches(pipeline, 128, num_devices=1)),
    # the HOWTO's form: the batch size read from the pipeline (its first batch, once per dataset)
    "pad_batches(ds, None)": lambda: consume(pe.pad_batches(pipeline, None, num_devices=1)),
  }
  seconds = median_seconds(fns, repeats)
  base = seconds["iterate the pipeline"]
  print(
    f"(c) a small eval split re-read per evaluation, {rows} rows, batch 128 (median of {repeats})"
  )
  print(f"    iterate the pipeline {base * 1e3:8.2f} ms")
  for name in ("pad_batches over it", "pad_batches(ds, None)"):
    print(
      f"    a new {name:22s} {seconds[name] * 1e3:8.2f} ms, ratio {seconds[name] / base:.2f} "
      "(goal: within 1.2)"
    )
  fresh, padded = seconds["a new pipeline iterated"], seconds["pad_batches over a new pipeline"]
  print(f"    a new pipeline iterated          {fresh * 1e3:8.2f} ms")
  print(
    f"    pad_batches over a new pipeline  {padded * 1e3:8.2f} ms, ratio {padded / fresh:.2f} "
    "(goal: within 1.2)"
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
  args = parser.parse_args()
  host_overhead(num_batches=200 if args.quick else 2000, repeats=3 if args.quick else 7)
  tf_throughput(rows=20_000 if args.quick else 200_000, repeats=3 if args.quick else 5)
  small_eval_reads(rows=2003 if args.quick else 10_003, repeats=5 if args.quick else 15)


if __name__ == "__main__":
  main()
