"""Source kind: an iterable of batch Mappings of any, varying leading sizes (re-chunked, order kept)."""

from __future__ import annotations

import collections.abc as cabc
from collections.abc import Iterator
from typing import Any

from padded_eval.batch_spec import BatchSpec
from padded_eval.sources.base import Chunk, Source, flatten_rows

__all__ = ["IterableSource"]


class IterableSource(Source):
  """Each batch is checked against the first one; a list of batches is re-read, a one-shot iterator read once.

  The number of rows is known for a Sequence (read from the shapes); otherwise it is unknown.
  """

  description = "an iterable of Mappings"

  @classmethod
  def accepts(cls, obj: Any) -> bool:
    return isinstance(obj, cabc.Iterable) and not isinstance(obj, (str, bytes, cabc.Mapping))

  def __init__(self, obj: cabc.Iterable, *, mask_key: str, batched: bool | None = None):
    del batched  # tf.data only
    self._batches = obj
    self._mask_key = mask_key
    self._one_shot = isinstance(
      obj, cabc.Iterator
    )  # a generator or iterator: iter() returns itself
    self._read = False

  @property
  def spec(self) -> None:
    return None  # known once the first batch is read

  def num_rows(self) -> int | None:
    if not isinstance(self._batches, cabc.Sequence):
      return None
    return sum(
      flatten_rows(batch, self._mask_key, f"batch {index}", convert=False)[1]
      for index, batch in enumerate(self._batches)
    )

  def chunks(self) -> Iterator[Chunk]:
    """Starts a new read of the batches.

    Raises:
      ValueError: (at once) the source is a one-shot iterator that was already read; (while reading) a batch
        that breaks the contract.
    """
    if self._one_shot:
      if self._read:
        raise ValueError(
          f"source is a one-shot iterator ({type(self._batches).__name__}) and was already read, so "
          "iterating the padded batches again would yield nothing; pass a re-iterable source instead, "
          "e.g. a list of batches, a tf.data.Dataset, or an object whose __iter__ calls your generator "
          "function again"
        )
      self._read = True
    return self._checked(iter(self._batches))

  def _checked(self, batches: Iterator) -> Iterator[Chunk]:
    first = None
    for index, batch in enumerate(batches):
      flat, rows = flatten_rows(batch, self._mask_key, f"batch {index}")
      if first is None:
        first = BatchSpec.of_rows(flat)
      else:
        first.check_rows(flat, index)
      yield flat, rows
