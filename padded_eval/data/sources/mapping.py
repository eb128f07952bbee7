"""Source kind: a whole dataset held as a Mapping (nested dicts allowed) of arrays ``[N, ...]``."""

from __future__ import annotations

import collections.abc as cabc
from collections.abc import Iterator
from typing import Any

from padded_eval.data._batch_spec import BatchSpec
from padded_eval.data.sources.base import (
  Chunk,
  RaggedRowsError,
  Source,
  SourceOptions,
  flatten_rows,
)

__all__ = ["MappingSource"]


class MappingSource(Source):
  """One chunk: the whole dataset, checked once when wrapped; full batches come out as views of it."""

  description = "a Mapping of arrays"

  @classmethod
  def accepts(cls, obj: Any) -> bool:
    return isinstance(obj, cabc.Mapping)

  def __init__(self, obj: cabc.Mapping, options: SourceOptions):
    """Checks and flattens the dataset (leaves become numpy arrays).

    Raises:
      ValueError: see `flatten_rows` (leading sizes that disagree, a key equal to `mask_key`, no arrays, ragged
        rows, ...).
    """
    try:
      self._flat, self._rows = flatten_rows(obj, options.mask_key, where="the source")
    except (
      RaggedRowsError
    ) as err:  # pad_shapes pads the batches of an iterable, not a whole dataset
      raise RaggedRowsError(
        f"{err}. A whole-dataset Mapping is taken as arrays: pass it as a list of one batch, "
        "pe.pad_batches([data], ..., pad_shapes=...), for its ragged rows to be padded"
      ) from None
    self._spec = BatchSpec.of_rows(self._flat, unknown_rows=True)

  @property
  def spec(self) -> BatchSpec:
    return self._spec

  def num_rows(self) -> int:
    return self._rows

  def chunks(self) -> Iterator[Chunk]:
    return iter([(self._flat, self._rows)])

  def chunks_from(self, batch_size: int, start_row: int) -> Iterator[Chunk]:
    """Seeks: the rows from `start_row` on are views of the arrays (nothing before is touched)."""
    del batch_size
    start = min(start_row, self._rows)
    return iter([({path: leaf[start:] for path, leaf in self._flat.items()}, self._rows - start)])
