"""Host overhead of pad_batches per source kind: padded batches vs iterating the raw source, as ratios.

Run: ``python benchmarks/bench_sources.py [--quick]``, or as part of ``python -m benchmarks`` (its "Sources"
table). For each path, "raw" is the cheapest loop a user would write to get the same batches of ``BATCH`` rows
from that library (grain's ``.batch``, the DataLoader's Batch operation, Hugging Face's numpy-formatted
``.iter``, the torch DataLoader), and "padded" is ``pe.pad_batches`` over the same source; both consume every
batch in the same trivial way. Ratio = padded time / raw time (1.00: no overhead). Medians of interleaved repeats
in one process; nothing is asserted. A library that is not installed shows as "not installed". grain reads rows
on one thread here (``ReadOptions(num_threads=0)``): its default reader threads cost more than the rows on a
machine of 2 shared cores, for raw and padded alike.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import padded_eval as pe  # noqa: E402
from benchmarks.bench_data import median_seconds  # noqa: E402

BATCH = 256


def make_data(rows: int) -> dict:
  rng = np.random.default_rng(0)
  return {
    "image": rng.random((rows, 32), dtype=np.float32),
    "label": rng.integers(0, 10, rows).astype(np.int32),
    "id": np.arange(rows, dtype=np.int64),
  }


def consume(batches) -> int:
  rows = 0
  for batch in batches:
    rows += len(batch["label"])
  return rows


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


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
  args = parser.parse_args()
  print(run(args.quick, log=lambda message: print(message, file=sys.stderr))[0])


if __name__ == "__main__":
  main()
