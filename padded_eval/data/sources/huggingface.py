"""Source kind: Hugging Face `datasets.Dataset` and `datasets.IterableDataset`, one key per column.

Columns are read in chunks through the dataset's own batched reader (``.iter(batch_size=...)``, a multiple of the
padded batch size), so they reach numpy column by column from Arrow, never row by row in Python. The dataset's
format is respected: its selected columns, and what a ``with_format("torch" | "jax" | "numpy" ...)`` or
``with_transform(...)`` yields (leaves are then turned into numpy arrays). A dataset without a format (or with
"arrow", "pandas" or "polars", containers of the same columns) is read with the "numpy" format of the same
columns: features such as images are decoded, integer columns come as int64 and floating ones as float32 (that
format's choice), strings as unicode arrays, which pad with empty strings. A struct column (rows of dicts, which the
numpy format gives row by row) is a nested dict of its fields' columns.

A `Dataset` knows its length (`len()` of the padded batches is known); an `IterableDataset` does not, and one
that repeats its rows (``.repeat(None)`` never ends) is refused. For
multi-host evaluation, give each process its rows: ``ds.select(np.arange(len(ds))[pe.process_slice(len(ds))])``
(``ds.shard(jax.process_count(), jax.process_index(), contiguous=True)`` takes the same rows, but refuses a
dataset with fewer rows than processes).

`datasets` is imported only once such a dataset is passed (it is already imported then: the object is its).
"""

from __future__ import annotations

import collections.abc as cabc
from collections.abc import Iterator
from typing import Any

import numpy as np

from padded_eval.data.sources.base import Chunk, Source, SourceOptions

__all__ = ["CHUNK_ROWS", "HuggingFaceSource"]

CHUNK_ROWS = 1024  # rows read at a time (rounded to a multiple of the batch size)
_CONTAINER_FORMATS = (None, "python", "arrow", "pandas", "polars")  # read as "numpy" instead
_MAX_PIPELINE_DEPTH = 256


class HuggingFaceSource(Source):
  """Reads a `datasets.Dataset` or `IterableDataset` column by column; every pass re-reads it."""

  description = "a Hugging Face dataset"
  fits_shapes = True

  library = ("datasets", ("Dataset", "IterableDataset", "DatasetDict", "IterableDatasetDict"))

  def __init__(self, obj: Any, options: SourceOptions):
    """Picks the format to read with.

    Args:
      obj: a `datasets.Dataset` or `datasets.IterableDataset` (rows are examples).
      options: the mask's key (no column may equal it); `batched` is ignored (rows are always examples).

    Raises:
      ValueError: a `DatasetDict` (a dict of splits: pick one), a column named `mask_key`, or an
        `IterableDataset` that repeats its rows (``.repeat(n)`` with n other than 1; None repeats forever).
    """
    mask_key = options.mask_key
    kind = self._library_kind(obj)
    assert kind is not None  # accepts(obj)
    if kind.endswith("Dict"):
      raise ValueError(
        f"source is a Hugging Face {kind} of splits {sorted(obj)}; pass one split, e.g. ds[{sorted(obj)[0]!r}]"
      )
    self._kind = kind
    self._mask_key = mask_key
    _check_read_once(obj)
    self._dataset = _numpy_formatted(obj, kind)
    if mask_key in (obj.column_names or ()):
      raise ValueError(
        f"the dataset has a column {mask_key!r} equal to mask_key; rename it or pass another mask_key="
      )

  @property
  def spec(self) -> None:
    return None  # known once the first chunk is read

  def num_rows(self) -> int | None:
    return len(self._dataset) if self._kind == "Dataset" else None

  def chunks(self) -> Iterator[Chunk]:
    return self.chunks_for(CHUNK_ROWS)

  def chunks_for(self, batch_size: int) -> Iterator[Chunk]:
    """Starts a new pass, reading a multiple of `batch_size` rows at a time."""
    chunk_rows = batch_size * max(1, CHUNK_ROWS // batch_size)
    return self._checked(self._dataset.iter(batch_size=chunk_rows))

  def _checked(self, batches: Iterator[Any]) -> Iterator[Chunk]:
    return self.checked_chunks(_mappings(batches), self._mask_key, "chunk {index} of the dataset")


def _check_read_once(dataset: Any) -> None:
  """Refuses an `IterableDataset` with a repeat step other than ``.repeat(1)`` (None: forever).

  Its steps are read through the private ``_ex_iterable`` chain (every input of a concatenation or an
  interleave: ``ex_iterables``); a `Dataset`'s ``.repeat(n)`` is a concatenation
  of ``n`` copies, indistinguishable from its rows.
  """
  pending, seen = [getattr(dataset, "_ex_iterable", None)], 0
  while pending and seen < _MAX_PIPELINE_DEPTH:
    step, seen = pending.pop(), seen + 1
    if step is None:
      continue
    if type(step).__name__.startswith("Repeat") and getattr(step, "num_times", 1) != 1:
      times = step.num_times
      how = (
        "forever (.repeat(None)), so the evaluation would never end"
        if times is None
        else (f"{times} times (.repeat({times})), so rows would count more than once")
      )
      raise ValueError(
        f"the Hugging Face IterableDataset repeats its rows {how}; evaluate a dataset without repeat "
        "(or with .repeat(1))"
      )
    pending.append(getattr(step, "ex_iterable", None))
    pending.extend(getattr(step, "ex_iterables", None) or ())  # concatenate_datasets, interleave


def _mappings(batches: Iterator[Any]) -> Iterator[cabc.Mapping]:
  """The chunks, each checked to be a Mapping of columns; struct columns become nested dicts of columns."""
  for index, batch in enumerate(batches):
    if not isinstance(batch, cabc.Mapping):
      raise ValueError(
        f"chunk {index} of the Hugging Face dataset is a {type(batch).__name__}; expected a dict of columns "
        "(a format or transform that returns one)"
      )
    yield _structs_nested(batch)


def _structs_nested(columns: cabc.Mapping) -> cabc.Mapping:
  """`columns` with each struct column (a list or 1-D object array of dicts, as the numpy format gives it) as a
  dict of its fields' columns, nested like the struct (lists of the rows' values, turned into arrays later)."""
  if not any(_is_struct(column) for column in columns.values()):
    return columns
  return {
    key: _structs_nested({field: [row[field] for row in column] for field in column[0]})
    if _is_struct(column)
    else column
    for key, column in columns.items()
  }


def _is_struct(column: Any) -> bool:
  if isinstance(column, np.ndarray):
    if column.dtype != object or column.ndim != 1:
      return False
  elif not isinstance(column, list):
    return False
  return len(column) > 0 and all(isinstance(row, cabc.Mapping) for row in column)


def _numpy_formatted(dataset: Any, kind: str) -> Any:
  """`dataset` with the "numpy" format (same columns) if it has none or a container format, else as is."""
  if kind == "Dataset":
    form = dataset.format
    if form["type"] not in _CONTAINER_FORMATS:
      return dataset
    return dataset.with_format(
      "numpy", columns=form["columns"], output_all_columns=form["output_all_columns"]
    )
  formatting = getattr(dataset, "_formatting", None)  # an IterableDataset keeps its format private
  if getattr(formatting, "format_type", None) not in _CONTAINER_FORMATS:
    return dataset
  return dataset.with_format("numpy")
