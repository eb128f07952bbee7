"""Source kind: grain's `MapDataset`, `IterDataset` and `DataLoader`, of dict elements, batched or not.

Elements are rows (a dict of per-row values) or batches (after ``.batch(n)``, or a `DataLoader` with the
``grain.transforms.Batch`` operation): inferred from the pipeline, or given with ``batched=``. Unbatched datasets
are read with grain's own ``.batch`` (of the batch size, or a multiple of it for a `MapDataset`), so every padded
batch is a view of a chunk; an unbatched `DataLoader` yields single rows, stacked here (the Batch operation does it
in grain).

A `MapDataset` knows its length: `len()` of the padded batches is known unless the pipeline filters. A pipeline
that would lose or repeat rows is refused: ``drop_remainder=True``, a ``.repeat()`` other than ``.repeat(1)``, a
sampler that repeats (``num_epochs`` other than 1), or grain sharding whose shards drop the remainder (grain's sharded `IndexSampler` gives every shard
``num_records // shard_count`` records). For multi-host evaluation, take this process's rows with
``ds[pe.process_slice(len(ds))]`` (a `MapDataset` slice, before ``.batch`` or ``to_iter_dataset``, or as the
`DataLoader`'s data source): the union over processes is every row exactly once, as ``tfds.split_for_jax_process``.

grain is imported only once such a dataset is passed (it is already imported then: the object is grain's).
"""

from __future__ import annotations

import collections.abc as cabc
import copy
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from padded_eval.data._tree import flatten, ragged_message, unflatten
from padded_eval.data.sources.array_like import to_numpy
from padded_eval.data.sources.base import (
  Chunk,
  Source,
  SourceOptions,
  drop_rows,
)
from padded_eval.data.sources.fields import named

__all__ = ["CHUNK_ROWS", "GrainSource"]

CHUNK_ROWS = (
  1024  # rows read at a time from an unbatched source (rounded to a multiple of the batch size)
)
_MAX_PIPELINE_DEPTH = 256


class GrainSource(Source):
  """Reads a grain dataset or DataLoader; re-iterating starts a new pass (grain datasets are re-iterable)."""

  description = "a grain dataset or DataLoader"
  fits_shapes = True
  names_fields = True

  library = ("grain", ("MapDataset", "IterDataset", "DataLoader"))

  def __init__(self, obj: Any, options: SourceOptions):
    """Inspects the pipeline.

    Args:
      obj: a grain `MapDataset`, `IterDataset` or `DataLoader` whose elements are dicts, or, with `keys`, tuples
        (rows ``(x, y)``, or grain's batches of them).
      options: the mask's key (no element key may equal it: checked on reading); `batched`, whether elements
        are batches (None: a batch step in the pipeline, ``.batch`` or the Batch operation, says so); `keys`,
        the names of the fields of tuple elements, in order (see `name_fields`).

    Raises:
      ValueError: a pipeline that drops rows (``drop_remainder=True``, sharding with a remainder), repeats
        them (``repeat(n)`` with n other than 1, ``num_epochs`` other than 1), or a `MapDataset` that repeats
        forever.
    """
    self._data = obj
    kind = self._library_kind(obj)  # "MapDataset", "IterDataset" or "DataLoader"
    assert kind is not None  # accepts(obj)
    self._kind = kind
    self._mask_key, batched, self._keys = options
    if self._kind == "DataLoader":
      batch_ops = _check_loader(obj)
      self._lineage: list = []
    else:
      self._lineage = _lineage(obj)
      batch_ops = [node for node in self._lineage if type(node).__name__.startswith("Batch")]
      _check_dataset(obj, _ancestors(obj), self._kind)
    self._batched = bool(batch_ops) if batched is None else bool(batched)
    self._filtered = any("Filter" in type(node).__name__ for node in self._lineage)

  @property
  def spec(self) -> None:
    return None  # known once the first element is read

  def num_rows(self) -> int | None:
    """Rows of a `MapDataset` without a filter, read from grain's lengths (nothing is read).

    Unbatched: its length. Batched: the length of what grain's ``.batch`` batches, when only maps follow it
    (a shuffle or slice of batches, or ``batched=True`` on batches grain did not make, leaves it unknown).
    """
    if self._kind != "MapDataset" or self._filtered:
      return None
    if not self._batched:
      return len(self._data)
    for node in self._lineage:
      name = type(node).__name__
      if name.startswith("Batch"):
        return len(node.parents[0])
      if not name.startswith("Map"):
        return None
    return None

  def chunks(self) -> Iterator[Chunk]:
    return self.chunks_for(CHUNK_ROWS)

  def chunks_for(self, batch_size: int) -> Iterator[Chunk]:
    """Starts a new pass: batches as they come, or rows stacked `batch_size` at a time (a multiple of it for a
    `MapDataset`, whose reader threads each build one chunk). With `shape_fitter` (``pad_shapes``), unbatched
    rows are stacked here (the keys to pad as ragged lists), not by grain's ``.batch``."""
    keys = self._keys
    chunk_rows = batch_size
    if self._batched:
      elements = iter(self._data)
    elif self._kind == "DataLoader" or self.shape_fitter is not None:
      # rows of varying lengths (pad_shapes) are stacked here, as ragged lists for the fitter
      ragged = () if self.shape_fitter is None else tuple(self.shape_fitter.sizes)
      elements, keys = _stacked(iter(self._data), batch_size, ragged, keys), None  # rows named
    elif self._kind == "MapDataset" and not self._filtered:
      chunk_rows = batch_size * max(1, CHUNK_ROWS // batch_size)
      elements = iter(self._data.batch(chunk_rows))
    else:  # grain batches a filtered MapDataset only as an IterDataset
      data = self._data.to_iter_dataset() if self._kind == "MapDataset" else self._data
      elements = iter(data.batch(batch_size))
    if not self._batched:
      elements = self._ragged_named(elements, chunk_rows)
    return self._checked(elements, keys)

  def _ragged_named(self, elements: Iterator[Any], chunk_rows: int) -> Iterator[Any]:
    """`elements` (grain's batches of `chunk_rows` rows); grain's error for rows of different shapes becomes
    ours, naming the key (the rows up to the failing chunk's end are read again, unbatched, to find it:
    those of the chunks before it have the first row's shapes, or `checked_chunks` had raised)."""
    read = 0
    try:
      for element in elements:
        yield element
        read += chunk_rows
    except ValueError:
      rows = [
        flatten(_named(row, i, self._keys), convert=False, tuples=True)
        for i, row in zip(range(read + chunk_rows), self._data)
      ]
      for path in rows[0] if rows else ():
        message = ragged_message(path, [to_numpy(row[path]) for row in rows if path in row])
        if message is not None:
          raise ValueError(f"the grain {self._kind}: {message}") from None
      raise

  def chunks_from(self, batch_size: int, start_row: int) -> Iterator[Chunk]:
    """Seeks in an unbatched, unfiltered `MapDataset`; else reads and drops rows.

    The seek reads one row before `start_row` (``dataset[start_row - 1:]``, that row dropped), so that the
    row spec is known even when no row is left.
    """
    if start_row == 0 or self._kind != "MapDataset" or self._batched or self._filtered:
      return super().chunks_from(batch_size, start_row)
    seeked = copy.copy(self)
    seeked._data = self._data[min(start_row, len(self._data)) - 1 :]
    return drop_rows(seeked.chunks_for(batch_size), 1)

  def batch_rows(self) -> int | None:
    """Rows of the first batch of a batched pipeline (read once), else None."""
    if not self._batched:
      return None
    first = next(self.chunks(), None)
    return None if first is None else first[1]

  def _checked(self, elements: Iterator[Any], keys: tuple[str, ...] | None) -> Iterator[Chunk]:
    named = (_named(element, index, keys) for index, element in enumerate(elements))
    return self.checked_chunks(named, self._mask_key, "batch {index}")


def _named(element: Any, index: int, keys: tuple[str, ...] | None = None) -> cabc.Mapping:
  """`element` as a Mapping (see `fields.named`)."""
  return named(
    element,
    keys,
    f"element {index} of the grain source",
    expected="a dict of arrays",
    passed="ds",
    how="map the rows to dicts first, e.g. ds.map(lambda row: {'image': row[0], 'label': row[1]})",
  )


def _lineage(dataset: Any) -> list:
  """The dataset and its first parents up to the source (grain's public ``parents``)."""
  nodes = [dataset]
  for _ in range(_MAX_PIPELINE_DEPTH):
    parents = getattr(nodes[-1], "parents", ())
    if not parents:
      break
    nodes.append(parents[0])
  return nodes


def _ancestors(dataset: Any) -> list:
  """The dataset and every dataset it reads from, all parents of each (``concatenate``, ``mix``)."""
  nodes, pending, seen = [], [dataset], set()
  while pending and len(nodes) < _MAX_PIPELINE_DEPTH:
    node = pending.pop()
    if id(node) in seen:
      continue
    seen.add(id(node))
    nodes.append(node)
    pending.extend(getattr(node, "parents", ()) or ())
  return nodes


def _check_dataset(dataset: Any, nodes: list, kind: str) -> None:
  """Refuses a dataset pipeline (``nodes``: every dataset in it) that drops or repeats rows."""
  for node in nodes:
    name = type(node).__name__
    if name.startswith("Batch") and getattr(
      node, "_drop_remainder", False
    ):  # grain keeps it private
      raise ValueError(
        f"the grain {kind} batches with drop_remainder=True, which drops the last rows; use "
        "drop_remainder=False (pad_batches pads the last batch and masks the padding)"
      )
    if name.startswith("Repeat") and not _reads_once(node):
      raise ValueError(
        f"the grain {kind} repeats its rows{_times(node)}, so rows would count more than once; evaluate "
        "a pipeline without repeat (or with .repeat(1))"
      )
  if kind == "MapDataset" and len(dataset) >= sys.maxsize:
    raise ValueError("the grain MapDataset is infinite; evaluate a pipeline of finite length")


def _reads_once(repeat: Any) -> bool:
  """Whether a repeat step reads each row once (``.repeat(1)``, as gemma's pipeline has): a `MapDataset` of
  its parent's length."""
  parents = getattr(repeat, "parents", ())
  try:
    return len(parents) == 1 and len(repeat) == len(parents[0])
  except TypeError:  # an IterDataset has no length
    return False


def _times(repeat: Any) -> str:
  """How often a repeat step reads its rows, in words."""
  try:
    length, parent = len(repeat), len(repeat.parents[0])
  except (TypeError, AttributeError, IndexError):
    return " (.repeat())"
  if length >= sys.maxsize:
    return " forever (.repeat())"
  times = length // parent if parent else 0
  return f" {times} times (.repeat({times}))"


def _check_loader(loader: Any) -> list:
  """Refuses a DataLoader whose sampler or sharding drops or repeats rows; returns its Batch operations."""
  import grain

  sampler = getattr(
    loader, "_sampler", None
  )  # grain keeps the loader's parts private: checked when present
  records = getattr(sampler, "_num_records", None)
  for options in (
    getattr(loader, "_shard_options", None),
    getattr(sampler, "_shard_options", None),
  ):
    count = getattr(options, "shard_count", 1)
    if records is not None and count > 1 and records % count:
      lost = records % count
      raise ValueError(
        f"the grain DataLoader is sharded over {count} shards of a source of {records} records, and grain "
        f"gives every shard {records // count}: {lost} row{'s' * (lost > 1)} would never be evaluated; give "
        "each process its rows instead, data_source=grain.MapDataset.source(source)"
        "[pe.process_slice(len(source))], with no shard_options"
      )
  if sampler is not None and records is not None and len(sampler) > records:
    raise ValueError(
      f"the grain DataLoader's sampler reads {_count(len(sampler))} records of a source of {records}, so "
      "rows would count more than once; pass grain.samplers.IndexSampler(num_records, num_epochs=1)"
    )
  batch_ops = [
    op for op in getattr(loader, "_operations", ()) if isinstance(op, grain.transforms.Batch)
  ]
  if any(op.drop_remainder for op in batch_ops):
    raise ValueError(
      "the grain DataLoader's Batch operation has drop_remainder=True, which drops the last rows; use "
      "grain.transforms.Batch(batch_size, drop_remainder=False)"
    )
  return batch_ops


def _count(records: int) -> str:
  return "infinitely many" if records >= sys.maxsize else str(records)


def _stacked(
  rows: Iterator[Any], chunk_rows: int, ragged: tuple = (), keys: tuple[str, ...] | None = None
) -> Iterator[dict]:
  """Stacks single-row dicts (tuples named by `keys`) into chunks of `chunk_rows` rows (the last may be
  short); the keys in `ragged` become lists of rows."""
  pending: list = []
  for index, row in enumerate(rows):
    pending.append(flatten(_named(row, index, keys), convert=False, tuples=True))
    if len(pending) == chunk_rows:
      yield _stack(pending, ragged)
      pending = []
  if pending:
    yield _stack(pending, ragged)


def _stack(rows: list, ragged: tuple = ()) -> dict:
  stack = lambda path, leaves: leaves if path in ragged else np.stack(leaves)
  return unflatten({path: stack(path, [to_numpy(row[path]) for row in rows]) for path in rows[0]})
