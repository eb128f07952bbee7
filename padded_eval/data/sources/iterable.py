"""Source kind: an iterable of batch Mappings of any, varying leading sizes (re-chunked, order kept)."""

from __future__ import annotations

import collections.abc as cabc
import functools
import inspect
import itertools
import operator
from collections.abc import Iterator
from typing import Any

import numpy as np

from padded_eval.data.sources.base import Chunk, Source, SourceOptions, flatten_rows
from padded_eval.data.sources.fields import kind_of, name_fields

__all__ = ["IterableSource"]


class IterableSource(Source):
  """Each batch is checked against the first one; a list of batches is re-read, a one-shot iterator read once.

  The number of rows is known for a Sequence (read from the shapes); otherwise it is unknown. With `keys`, the
  batches are tuples (``(x, y)``), named in order. A Sequence's full batches pass through uncopied; the batches of
  any other iterable (a generator, a loader that may refill one buffer) are copied as they are read.
  """

  description = "an iterable of Mappings"
  fits_shapes = True
  names_fields = True

  @classmethod
  def accepts(cls, obj: Any) -> bool:
    return isinstance(obj, cabc.Iterable) and not isinstance(obj, (str, bytes, cabc.Mapping))

  def __init__(self, obj: cabc.Iterable, options: SourceOptions):
    """Wraps the batches (a Sequence's first element is checked now, nothing else is read).

    Args:
      obj: the batches: Mappings of arrays ``[rows, ...]``, or, with `keys`, tuples of them.
      options: the mask's key (no batch key may equal it) and `keys`, the names of the fields of tuple
        batches, in order (see `name_fields`); `batched` is ignored (tf.data and grain only).

    Raises:
      ValueError: `obj` is an array (its rows would be read as batches), or a Sequence whose first element is
        not a Mapping (without `keys`) or does not fit `keys`.
    """
    self._mask_key, _, self._keys = options
    _check_not_rows(obj, self._keys)
    self._batches = obj
    self._one_shot = isinstance(
      obj, cabc.Iterator
    )  # a generator or iterator: iter() returns itself
    self._read = False
    if isinstance(obj, cabc.Iterator) and _already_consumed(obj):  # self._one_shot
      raise ValueError(
        f"source is a one-shot iterator ({type(obj).__name__}) that is already consumed (or empty): it yields no "
        "batch (a loop, list() or an earlier pad_batches read it to the end). Pass a fresh iterator, or a "
        "re-iterable source: a list of batches, a tf.data.Dataset, or an object whose __iter__ calls your "
        "generator function again"
      )

  @property
  def spec(self) -> None:
    return None  # known once the first batch is read

  def num_rows(self) -> int | None:
    if not isinstance(self._batches, cabc.Sequence):
      return None
    total = 0
    for index, batch in enumerate(self._batches):
      fit = self._fit(total)
      batch = self._named(batch, index)
      total += flatten_rows(batch, self._mask_key, f"batch {index}", convert=False, fit=fit)[1]
    return total

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

  def batch_rows(self) -> int | None:
    """Rows of the first batch (a one-shot iterator is peeked at: its first batch is kept for the read)."""
    if self._one_shot and not self._read:
      assert isinstance(self._batches, cabc.Iterator)  # one-shot: an iterator
      first = next(self._batches, None)
      if first is None:
        return None
      self._batches = itertools.chain([first], self._batches)
    else:
      first = next(iter(self._batches), None)
    if first is None:
      return None
    first = self._named(first, 0)
    return flatten_rows(first, self._mask_key, "batch 0", convert=False, fit=self._fit(0))[1]

  def _fit(self, first_row: int):
    return (
      None
      if self.shape_fitter is None
      else functools.partial(self.shape_fitter.fit, first_row=first_row)
    )

  def _named(self, batch: Any, index: int) -> Any:
    return batch if self._keys is None else name_fields(batch, self._keys, f"batch {index}")

  def _checked(self, batches: Iterator) -> Iterator[Chunk]:
    named = (self._named(batch, index) for index, batch in enumerate(batches))
    chunks = self.checked_chunks(named, self._mask_key, "batch {index}")
    if isinstance(self._batches, cabc.Sequence):  # a list's arrays are its own: read in place
      return chunks
    return (_copied(chunk) for chunk in chunks)


def _copied(chunk: Chunk) -> Chunk:
  """``chunk`` with its arrays copied, for a source that is not a Sequence (a generator, a loader):
  it may refill the arrays it yielded once asked for the next batch, while JAX on CPU may read a
  placed numpy array in place (the device buffer aliases it) until the step that reads it has run."""
  flat, rows = chunk
  return {path: np.array(leaf) for path, leaf in flat.items()}, rows


def _already_consumed(iterator: cabc.Iterator) -> bool:
  """Whether a one-shot iterator was read to its end: a finished generator, or an iterator over a sized
  container whose length hint is now 0 (nothing is read)."""
  if inspect.isgenerator(iterator):
    return inspect.getgeneratorstate(iterator) == inspect.GEN_CLOSED
  hint = operator.length_hint(iterator, -1)
  return hint == 0 and type(iterator).__name__.endswith("iterator")


def _check_not_rows(obj: Any, keys: tuple[str, ...] | None = None) -> None:
  """Refuses at the call what would fail at the first batch: an array, or a Sequence of non-Mappings."""
  expected = (
    "expected a dict of arrays holding the whole dataset (e.g. pe.pad_batches({'x': x, 'label': y}, ...)) or "
    "an iterable of dict batches"
  )
  if hasattr(obj, "shape") and hasattr(obj, "dtype"):  # numpy, jax, torch or tf arrays
    raise ValueError(
      f"source is an array ({type(obj).__name__} of shape {tuple(obj.shape)}), not named fields; {expected}"
    )
  if isinstance(obj, cabc.Sequence) and len(obj) and keys is not None:
    name_fields(obj[0], keys, "batch 0")
  elif isinstance(obj, cabc.Sequence) and len(obj) and not isinstance(obj[0], cabc.Mapping):
    raise ValueError(
      f"source is a {type(obj).__name__} whose element 0 is {kind_of(obj[0])}; {expected}, so that each field has a "
      "name (e.g. [{'image': x, 'label': y}, ...]), or tuple batches with pe.pad_batches(..., "
      "keys=('image', 'label'))"
    )
