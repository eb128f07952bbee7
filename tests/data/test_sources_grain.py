"""grain sources of pad_batches: MapDataset, IterDataset and DataLoader, batched or not, against the arrays.

Also: no source library (grain, datasets, torch, tensorflow) is imported unless such a source is passed.
"""

import subprocess
import sys

import grain
import numpy as np
import pytest
from _source_cases import check_exact, check_padded, make_data, numeric, rows_of

import padded_eval as pe
from padded_eval.data.sources.base import SourceOptions, library_class
from padded_eval.data.sources.grain import GrainSource

N = 37  # 2 full batches of 16 and 5 real rows in the last


def loader(rows, operations=(), **sampler_options):
  sampler_options.setdefault("num_epochs", 1)
  return grain.DataLoader(
    data_source=rows,
    sampler=grain.samplers.IndexSampler(len(rows), **sampler_options),
    operations=list(operations),
    worker_count=0,
  )


PIPELINES = {  # name: (build(rows), len() known)
  "MapDataset": (lambda rows: grain.MapDataset.source(rows), True),
  "MapDataset.batch(5)": (lambda rows: grain.MapDataset.source(rows).batch(5), True),
  "MapDataset.batch(16)": (lambda rows: grain.MapDataset.source(rows).batch(16), True),
  "MapDataset.batch(7).map": (
    lambda rows: grain.MapDataset.source(rows).batch(7).map(lambda b: dict(b)),
    True,
  ),
  "MapDataset.filter": (
    lambda rows: grain.MapDataset.source(rows).filter(lambda row: True),
    False,
  ),
  # gemma's eval pipeline calls .repeat(1): every row once (issue 26: it was refused)
  "MapDataset.repeat(1)": (lambda rows: grain.MapDataset.source(rows).repeat(1), True),
  "MapDataset.repeat(1).batch(5)": (
    lambda rows: grain.MapDataset.source(rows).repeat(1).batch(5),
    True,
  ),
  "IterDataset": (lambda rows: grain.MapDataset.source(rows).to_iter_dataset(), False),
  "IterDataset.batch(6)": (
    lambda rows: grain.MapDataset.source(rows).to_iter_dataset().batch(6),
    False,
  ),
  "DataLoader": (lambda rows: loader(rows), False),
  "DataLoader+Batch(5)": (lambda rows: loader(rows, [grain.transforms.Batch(5)]), False),
}


@pytest.mark.parametrize("name", PIPELINES)
def test_every_row_once_in_order_with_the_mask_and_len(name):
  data = make_data(N)
  build, known_len = PIPELINES[name]
  source = build(rows_of(data))
  assert library_class(source, *GrainSource.library) in ("MapDataset", "IterDataset", "DataLoader")
  check_padded(source, data, known_len=known_len)


def test_empty_and_single_row_map_datasets():
  data = make_data(1)
  check_padded(grain.MapDataset.source(rows_of(data)).batch(4), data, known_len=True)
  empty = pe.pad_batches(grain.MapDataset.source([]), 4, num_devices=1)
  assert len(empty) == 0 and list(empty) == []


def test_batched_can_be_given():
  data = make_data(N)
  rows = rows_of(data)
  # A map-style source of batches: grain sees no batch step, `batched=True` says so.
  # Their sizes vary, so the number of rows is unknown without reading them.
  bounds = [0, 3, 13, 30, N]
  batches = [{k: v[a:b] for k, v in data.items()} for a, b in zip(bounds[:-1], bounds[1:])]
  source = grain.MapDataset.source(batches)
  check_padded(source, data, known_len=False, batched=True)
  shuffled = (
    grain.MapDataset.source(rows).batch(5).shuffle(seed=1)
  )  # the short batch may come first
  assert GrainSource(shuffled, SourceOptions("mask")).num_rows() is None
  # And rows that happen to be vectors are rows when batched=False.
  source = GrainSource(grain.MapDataset.source(rows), SourceOptions("mask", batched=False))
  assert source.num_rows() == N


@pytest.mark.parametrize(
  "name", ["MapDataset.batch(5)", "IterDataset", "DataLoader", "DataLoader+Batch(5)"]
)
def test_masked_eval_is_exact(name):
  data = make_data(N, strings=False)
  check_exact(PIPELINES[name][0](rows_of(data)), data)


def test_pipelines_that_drop_or_repeat_rows_are_refused():
  rows = rows_of(make_data(N))
  source = grain.MapDataset.source(rows)
  cases = [
    (source.batch(5, drop_remainder=True), "batches with drop_remainder=True"),
    (source.repeat(2), r"repeats its rows 2 times \(.repeat\(2\)\)"),
    (source.repeat(), r"repeats its rows forever \(.repeat\(\)\)"),
    (source.repeat(2).batch(8), r"repeats its rows 2 times"),
    (source.to_iter_dataset().batch(5, drop_remainder=True), "drop_remainder=True"),
    (  # in a concatenation's second input: before, only the first parents were searched
      grain.MapDataset.concatenate([source.batch(3), source.batch(3, drop_remainder=True)]),
      "batches with drop_remainder=True",
    ),
    (grain.MapDataset.concatenate([source, source.repeat(2)]), r"repeats its rows 2 times"),
    (loader(rows, [grain.transforms.Batch(5, drop_remainder=True)]), "Batch operation has drop"),
    (loader(rows, num_epochs=None), "reads infinitely many records of a source of 37"),
    (loader(rows, num_epochs=2), "reads 74 records of a source of 37"),
    (
      loader(rows, shard_options=grain.sharding.ShardOptions(0, 2, drop_remainder=False)),
      r"sharded over 2 shards of a source of 37 records, and grain gives every shard 18: 1 row would",
    ),
  ]
  for dataset, message in cases:
    with pytest.raises(ValueError, match=message):
      pe.pad_batches(dataset, 8, num_devices=1)


def test_grain_sharding_loses_the_remainder_and_process_slice_does_not():
  """Why the documented multi-host choice is `ds[pe.process_slice(len(ds))]`, not grain's shard options."""
  n, count = 11, 3
  rows = [{"id": np.int64(i)} for i in range(n)]
  grain_shares = [
    [int(r["id"]) for r in loader(rows, shard_options=grain.sharding.ShardOptions(p, count))]
    for p in range(count)
  ]
  assert sum(map(len, grain_shares)) == count * (n // count) < n  # what GrainSource refuses
  ours = []
  for p in range(count):
    share = pe.process_slice(n, process_index=p, process_count=count)
    ours += [int(r["id"]) for r in grain.MapDataset.source(rows)[share]]
  assert ours == list(range(n))
  # With a count that divides the records, grain's shards cover every row once: accepted.
  shares = [
    loader(rows[:9], shard_options=grain.sharding.ShardOptions(p, count)) for p in range(count)
  ]
  ids = [
    int(b["id"][i])
    for s in shares
    for b in pe.pad_batches(s, 2, num_devices=1)
    for i in range(2)
    if b["mask"][i]
  ]
  assert sorted(ids) == list(range(9))


def test_ragged_rows_name_the_key_and_suggest_pad_shapes():  # issue 26: grain's message named no key
  rows = [{"y": np.int32(i), "tokens": np.arange(i % 3 + 1, dtype=np.int32)} for i in range(10)]
  source = grain.MapDataset.source(rows)
  match = r"key 'tokens' holds ragged rows \(row 0 has shape \(1,\), row 1 has shape \(2,\)\).*pad_shapes=\{'tokens': \(3,\)\}"
  for dataset in (source, source.to_iter_dataset(), loader(rows)):
    with pytest.raises(ValueError, match=match):
      list(pe.pad_batches(dataset, 4, num_devices=1))
  padded = pe.pad_batches(source, 4, num_devices=1, pad_shapes={"tokens": (3,)}, pad_value=-1)
  tokens = np.concatenate([b["tokens"][b["mask"]] for b in padded])
  np.testing.assert_array_equal(tokens, [[0, -1, -1], [0, 1, -1], [0, 1, 2]] * 3 + [[0, -1, -1]])


def test_ragged_rows_past_the_first_batch_name_the_key():
  # the rows were searched only up to batch_size, so a longer row later in the failing chunk left
  # grain's (or numpy's) message, which names no key
  rows = [{"tokens": np.arange(length, dtype=np.int32)} for length in (1, 1, 1, 3)]
  source = grain.MapDataset.source(rows)
  match = r"key 'tokens' holds ragged rows \(row 0 has shape \(1,\), row 3 has shape \(3,\)\).*pad_shapes=\{'tokens': \(3,\)\}"
  for dataset in (source, source.to_iter_dataset(), loader(rows)):
    with pytest.raises(ValueError, match=match):
      list(pe.pad_batches(dataset, 2, num_devices=1))


def test_rows_that_are_not_dicts_say_how_to_name_the_fields():
  data = make_data(5)
  tuples = [(row["x"], row["label"]) for row in rows_of(data)]
  for source in (grain.MapDataset.source(tuples), loader(tuples)):
    with pytest.raises(ValueError, match=r"is a tuple of 2 values; expected a dict .*ds.map\("):
      list(pe.pad_batches(source, 4, num_devices=1))


def test_mask_key_in_the_rows_is_refused():
  rows = [{"mask": np.float32(i)} for i in range(3)]
  with pytest.raises(ValueError, match="has a key 'mask' equal to mask_key"):
    list(pe.pad_batches(grain.MapDataset.source(rows), 4, num_devices=1))


def test_numeric_pipeline_keeps_dtypes():
  data = numeric(make_data(N))
  batch = next(iter(pe.pad_batches(grain.MapDataset.source(rows_of(data)), 16, num_devices=1)))
  assert {k: v.dtype for k, v in batch.items() if k != "mask"} == {
    k: v.dtype for k, v in data.items()
  }


def test_no_source_library_is_imported_for_numpy_sources():
  code = (
    "import sys, numpy as np, padded_eval as pe\n"
    "batches = list(pe.pad_batches({'x': np.arange(5)}, 4, num_devices=1))\n"
    "batches += list(pe.pad_batches([{'x': np.arange(5)}], 4, num_devices=1))\n"
    "loaded = [m for m in ('grain', 'datasets', 'torch', 'tensorflow', 'pandas') if m in sys.modules]\n"
    "assert len(batches) == 4 and not loaded, loaded\n"
  )
  subprocess.run([sys.executable, "-c", code], check=True)
