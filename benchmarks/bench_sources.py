"""Host overhead of pad_batches per source kind, and the tf.data path's throughput, as ratios to raw sources.

Run: ``python -m benchmarks sources [--quick]``; its first table is also part of ``python -m benchmarks`` (the
"Sources" table). Medians of interleaved repeats in one process; nothing is asserted.

Sources table: for each path, "raw" is the cheapest loop a user would write to get the same batches of ``BATCH``
rows from that library (grain's ``.batch``, the DataLoader's Batch operation, Hugging Face's numpy-formatted
``.iter``, the torch DataLoader), and "padded" is ``pe.pad_batches`` over the same source; both consume every
batch in the same trivial way. Ratio = padded time / raw time (1.00: no overhead). A library that is not
installed shows as "not installed". grain reads rows on one thread here (``ReadOptions(num_threads=0)``): its
default reader threads cost more than the rows on a machine of 2 shared cores, for raw and padded alike.

Standalone, also (formerly ``bench_data.py``):

(a) per-batch host overhead: iterating ``pad_batches`` over batches versus a plain loop over the same batches, in
    microseconds per batch, for aligned full batches (passed through), misaligned batches (re-chunked) and a
    whole-dataset Mapping (sliced).
(b) tf.data: examples/s of ``pad_batches(ds, B)`` over examples/s of the raw pipeline producing the same batches
    (``ds.batch(B)`` or ``ds.rebatch(B)``, prefetched, as numpy), unbatched and batched sources.
(c) a small eval split read once per evaluation: a new ``pad_batches`` over the same batched pipeline against
    iterating the pipeline, with the batch size given and with ``None`` (read from the pipeline's first batch);
    and a new pipeline per evaluation, as Flax's examples build theirs, padded against iterated.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

import padded_eval as pe  # noqa: E402
from benchmarks.common import interleaved  # noqa: E402

BATCH = 256


def make_data(rows: int) -> dict:
  rng = np.random.default_rng(0)
  return {
    "image": rng.random((rows, 32), dtype=np.float32),
    "label": rng.integers(0, 10, rows).astype(np.int32),
    "id": np.arange(rows, dtype=np.int64),
  }


def consume(batches) -> int:
  """A trivial consumer that touches each batch: counts rows."""
  rows = 0
  for batch in batches:
    rows += len(batch["label"])
  return rows


def median_seconds(fns: dict, repeats: int) -> dict:
  """Median seconds per named callable, after one warm-up call each, runs interleaved."""
  return {name: statistics.median(t) for name, t in interleaved(fns, repeats).items()}


def chunks(data: dict, size: int) -> list[dict]:
  return [{k: v[i : i + size] for k, v in data.items()} for i in range(0, len(data["id"]), size)]


def padded(source):
  return lambda: consume(pe.pad_batches(source, BATCH, num_devices=1))


def grain_cases(data: dict) -> dict:
  import grain

  rows = [{k: v[i] for k, v in data.items()} for i in range(len(data["id"]))]
  source = grain.MapDataset.source(rows)
  batched = source.batch(100)  # batches of another size: re-chunked
  # Row-by-row reads on one thread: grain's default 16 reader threads cost more than the rows on 2 shared cores.
  one_thread = grain.ReadOptions(num_threads=0)
  stream = source.to_iter_dataset(one_thread)
  loader = grain.DataLoader(
    data_source=rows,
    sampler=grain.samplers.IndexSampler(len(rows), num_epochs=1),
    operations=[grain.transforms.Batch(BATCH)],
    worker_count=0,
    read_options=one_thread,
  )
  return {
    "grain MapDataset (rows)": (lambda: consume(source.batch(BATCH)), padded(source)),
    "grain MapDataset.batch(100)": (lambda: consume(batched), padded(batched)),
    "grain IterDataset (rows)": (lambda: consume(stream.batch(BATCH)), padded(stream)),
    f"grain DataLoader + Batch({BATCH})": (lambda: consume(loader), padded(loader)),
  }


def hf_cases(data: dict) -> dict:
  import datasets

  dataset = datasets.Dataset.from_dict(data)
  stream = dataset.to_iterable_dataset(num_shards=4)
  return {
    "Hugging Face Dataset": (
      lambda: consume(dataset.with_format("numpy").iter(batch_size=BATCH)),
      padded(dataset),
    ),
    "Hugging Face IterableDataset": (
      lambda: consume(stream.with_format("numpy").iter(batch_size=BATCH)),
      padded(stream),
    ),
  }


def torch_cases(data: dict) -> dict:
  import torch

  class Rows(torch.utils.data.Dataset):
    def __len__(self):
      return len(data["id"])

    def __getitem__(self, i):
      return {k: torch.from_numpy(v[i : i + 1])[0] for k, v in data.items()}

  class Bf16Rows(Rows):
    def __getitem__(self, i):
      row = super().__getitem__(i)
      return dict(row, image=row["image"].to(torch.bfloat16))

  loader = torch.utils.data.DataLoader(Rows(), batch_size=BATCH)
  bf16 = torch.utils.data.DataLoader(Bf16Rows(), batch_size=BATCH)
  return {
    "torch DataLoader": (lambda: consume(loader), padded(loader)),
    "torch DataLoader, bf16 images": (lambda: consume(bf16), padded(bf16)),
  }


def measure(rows: int, repeats: int, log=print) -> list[tuple]:
  """``[(path, raw us/batch, padded us/batch, ratio)]``; a missing library gives ``(path, None, None, None)``."""
  data = make_data(rows)
  num_batches = -(-rows // BATCH)
  out = []
  for library, cases in (("grain", grain_cases), ("datasets", hf_cases), ("torch", torch_cases)):
    try:
      fns = cases(data)
    except ImportError:
      out.append((f"{library}", None, None, None))
      continue
    for name, (raw, pad) in fns.items():
      seconds = median_seconds({"raw": raw, "padded": pad}, repeats)
      per_batch = {k: v / num_batches * 1e6 for k, v in seconds.items()}
      out.append((name, per_batch["raw"], per_batch["padded"], seconds["padded"] / seconds["raw"]))
      log(f"sources: {name}: ratio {out[-1][3]:.2f}")
  return out


def run(quick: bool, log=print) -> tuple[str, list]:
  """The Markdown table for ``python -m benchmarks`` and its rows."""
  rows, repeats = (2048, 3) if quick else (32768, 7)
  measured = measure(rows, repeats, log)
  lines = [
    f"{rows} rows (`image` float32 [32], `label` int32, `id` int64), batches of {BATCH}, median of "
    f"{repeats}; ratio = `pe.pad_batches(source)` time / raw-source time.",
    "",
    "| source path | raw us/batch | pad_batches us/batch | ratio |",
    "| --- | --- | --- | --- |",
  ]
  for name, raw, pad, ratio in measured:
    if raw is None:
      lines.append(f"| {name} | not installed | not installed | |")
    else:
      lines.append(f"| {name} | {raw:.1f} | {pad:.1f} | {ratio:.2f} |")
  return "\n".join(lines) + "\n", measured


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
  seconds = {name: t / num_batches for name, t in median_seconds(fns, repeats).items()}
  title = f"(a) host overhead per batch, {num_batches} batches of {BATCH} rows, 3 leaves"
  print_against(f"{title} (median of {repeats})", seconds, "plain loop", 1e6, "us/batch")


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
  print(
    f"(c) a small eval split re-read per evaluation, {rows} rows, batch 128 (median of {repeats})"
  )
  names = ("iterate the pipeline", "pad_batches over it", "pad_batches(ds, None)")
  print_against("  the same pipeline (goal: within 1.2)", {n: seconds[n] for n in names}, names[0])
  names = ("a new pipeline iterated", "pad_batches over a new pipeline")
  print_against("  a new pipeline (goal: within 1.2)", {n: seconds[n] for n in names}, names[0])


def print_against(title: str, seconds: dict, base: str, scale: float = 1e3, unit: str = "ms"):
  """``title``, then each of ``seconds`` (times ``scale``, in ``unit``) and its ratio to ``base``."""
  print(title)
  for name, value in seconds.items():
    ratio = "" if name == base else f", ratio {value / seconds[base]:.2f}"
    print(f"    {name:32s} {value * scale:9.2f} {unit}{ratio}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
  args = parser.parse_args()
  print(run(args.quick, log=lambda message: print(message, file=sys.stderr))[0])
  host_overhead(num_batches=200 if args.quick else 2000, repeats=3 if args.quick else 7)
  tf_throughput(rows=4_000 if args.quick else 200_000, repeats=3 if args.quick else 5)
  small_eval_reads(rows=2003 if args.quick else 10_003, repeats=5 if args.quick else 15)


if __name__ == "__main__":
  main()
