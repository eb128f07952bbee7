"""The `Source` protocol of `pad_batches`, and the numpy re-chunking and padding every source shares.

A source describes one row (a row `BatchSpec`: key paths, per-row shapes, dtypes), says how many rows it holds
when it knows, and yields flat column chunks ``({path: array [rows, ...]}, rows)`` of any sizes, in order. The
default `Source.padded` re-chunks those into ``batch_size`` rows and pads the last one in numpy; a source that can
pad faster in its own pipeline (tf.data) overrides it. See docs/architecture.md, "Adding a source".
"""

from __future__ import annotations

import abc
import collections.abc as cabc
import functools
import itertools
import numbers
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from padded_eval.data._batch_spec import BatchSpec, FlatBatch
from padded_eval.data._tree import Index, flatten, path_name, ragged_message
from padded_eval.data.sources.array_like import to_numpy

if TYPE_CHECKING:
  from padded_eval.data.sources.shapes import ShapeFitter

__all__ = [
  "ID_DTYPE",
  "PADDING_ID",
  "Chunk",
  "Padding",
  "RaggedRowsError",
  "RowIds",
  "Source",
  "SourceOptions",
  "check_index_key",
  "drop_rows",
  "flatten_rows",
  "library_class",
  "pad",
  "rechunk",
  "row_ids",
]

Chunk = tuple[FlatBatch, int]  # ({path: array [rows, ...]}, rows)
ID_DTYPE = np.int32
PADDING_ID = -1  # the id of a padding row


class SourceOptions(NamedTuple):
  """What ``pad_batches`` tells a kind when it wraps the user's object (`Source.__init__`).

  Attributes:
    mask_key: the key the mask will take; a source key equal to it raises ValueError.
    batched: whether elements are batches (None: inferred); read by the kinds whose elements may be either
      (tf.data, grain), ignored by the others.
    keys: the names of the fields of tuple elements, in order (``pad_batches(..., keys=...)``), for a kind
      that `names_fields`; None otherwise.
  """

  mask_key: str = "mask"
  batched: bool | None = None
  keys: tuple[str, ...] | None = None


class Source(abc.ABC):
  """One kind of data source, wrapped for `pad_batches`.

  A subclass implements `accepts` (decided without importing the source's library: a kind of another library's
  objects names its classes in `library` instead), `__init__` (check the object and reject a key equal to
  ``options.mask_key``), `spec`, `num_rows` and `chunks`, and is registered with
  `padded_eval.data.sources.register`.

  A kind that reads batches of its own (an iterable, a loader) passes them through `checked_chunks`, which
  flattens them, applies `shape_fitter` and checks each against the first; `padded` applies `shape_fitter` to the
  chunks of a kind that does not (`fits_shapes` False).

  Attributes:
    description: how error messages name the kind, e.g. ``"a Mapping of arrays"``.
    shape_fitter: ``pad_batches(..., pad_shapes=...)``'s `padded_eval.data.sources.shapes.ShapeFitter`, set after
      the source is wrapped; None pads no axis.
    fits_shapes: whether `chunks` already applies `shape_fitter` (through `checked_chunks`).
    spec_hint: a sentence ending the messages about the rows' shapes ("" for none): how the kind guessed
      what a row is, when it guessed (a tf.data source whose `batched` was inferred).
    names_fields: whether the kind reads ``options.keys`` (``pad_batches(..., keys=...)``: the names of the
      fields of tuple elements, applied with `name_fields`); ``pad_batches`` refuses ``keys=`` for another.
    library: for a kind of another library's objects, ``(package, class names)`` of `library_class` (names
      None: any class of the package), which the default `accepts` reads; None for a kind that overrides it.
  """

  description: str = "a data source"
  shape_fitter: ShapeFitter | None = None
  spec_hint: str = (
    ""  # appended to messages about the rows' shapes (tf.data: why elements are batches)
  )
  fits_shapes: bool = False
  names_fields: bool = False
  library: tuple[str, cabc.Container[str] | None] | None = None

  @classmethod
  def accepts(cls, obj: Any) -> bool:
    """Whether `obj` is a source of this kind: the default, an object of one of `library`'s classes."""
    return cls._library_kind(obj) is not None

  @classmethod
  def _library_kind(cls, obj: Any) -> str | None:
    """`library_class` of `obj` among `library`'s classes (None: not one, or no `library`)."""
    return None if cls.library is None else library_class(obj, *cls.library)

  @abc.abstractmethod
  def __init__(self, obj: Any, options: SourceOptions):
    """Wraps `obj`.

    Args:
      obj: the user's source.
      options: the mask's key (a source key equal to it raises ValueError), and `batched` and `keys` for the
        kinds that read them (see `SourceOptions`).
    """

  @property
  @abc.abstractmethod
  def spec(self) -> BatchSpec | None:
    """The spec of one row (``batch_size`` None; None for sizes still unknown), or None before reading."""

  @abc.abstractmethod
  def num_rows(self) -> int | None:
    """The number of rows, or None when unknown without reading the data."""

  @abc.abstractmethod
  def chunks(self) -> Iterator[Chunk]:
    """Reads the source once more: flat column chunks of any sizes, in order, each checked against the first.

    Raises:
      ValueError: a chunk that breaks the contract (see `flatten_rows`, `BatchSpec.check_same`), or a one-shot
        source read a second time.
    """

  def batches_hint(self, batch_size: int) -> int | None:
    """An estimate of the padded batches of `batch_size` rows when `num_rows` is unknown (a progress bar's
    total; never used to size anything), or None. The default: None."""
    del batch_size
    return None

  def check_row_order(self, index_key: str) -> None:
    """Raises ValueError when the source reads its rows in another order on every pass, so row ids
    (``pad_batches(..., index_key=...)``, the key given) would name other rows in the next run. The
    default: nothing (the order is the source's own). tf.data checks for a reshuffling shuffle."""
    del index_key

  def batch_rows(self) -> int | None:
    """Rows of the source's first batch (``pad_batches(batch_size=None)``), or None if it is not batched.

    The default: None (a source of rows). A batched kind reads (or peeks at) its first batch.
    """
    return None

  def checked_chunks(self, batches: cabc.Iterable, mask_key: str, where: str) -> Iterator[Chunk]:
    """Flattens each batch (`flatten_rows`, with `shape_fitter` applied) and checks it against the first.

    Args:
      batches: the source's batches, Mappings of array-likes ``[rows, ...]``.
      mask_key: the mask's key (no batch may have it).
      where: how messages name batch ``i``: a format string with ``{index}``, e.g. ``"batch {index}"``.

    Yields:
      ``(flat, rows)`` chunks.

    Raises:
      ValueError: see `flatten_rows`, `BatchSpec.check_same` and `ShapeFitter.fit`.
    """
    first, row = None, 0
    for index, batch in enumerate(batches):
      fit = None
      if self.shape_fitter is not None:
        fit = functools.partial(self.shape_fitter.fit, first_row=row)
      flat, rows = flatten_rows(batch, mask_key, where.format(index=index), fit=fit)
      if first is None:
        first = BatchSpec.of_rows(flat)
      else:
        first.check_rows(flat, index)
      row += rows
      yield flat, rows

  def chunks_for(self, batch_size: int) -> Iterator[Chunk]:
    """Like `chunks`, in chunk sizes suited to `batch_size` where the source can choose them.

    A source that reads in chunks of its own choosing (grain, Hugging Face) reads a multiple of `batch_size`
    rows at a time, so that every padded batch is a view of a chunk; the default is `chunks()`.
    """
    del batch_size
    return self.chunks()

  def chunks_from(self, batch_size: int, start_row: int) -> Iterator[Chunk]:
    """Like `chunks_for`, from row `start_row` on (a resumed evaluation skips the rows before it).

    The default reads the chunks before `start_row` and drops them unpadded (a source that can seek, e.g. a
    Mapping or a grain `MapDataset`, overrides it). When every row is dropped it yields one empty chunk, so that
    the row spec stays known.
    """
    chunks = self.chunks_for(batch_size)
    return chunks if start_row == 0 else drop_rows(chunks, start_row)

  def padded(
    self, padding: Padding, start_batch: int = 0
  ) -> Generator[FlatBatch, None, BatchSpec | None]:
    """Flat batches of exactly ``padding.batch_size`` rows plus ``(mask_key,)``: bool ``[batch_size]``, real
    rows first (and the row ids).

    Args:
      padding: the batch size, the mask's key, the pad value and the row ids (see `Padding`).
      start_batch: the first batch to yield; the rows of the batches before it are skipped (see `chunks_from`).

    Yields:
      ``{path: array [batch_size, ...]}`` with the mask (and the ids); a full batch aligned with a chunk is not
      copied. With length buckets (`shape_fitter`), each bucketed axis is cut to the smallest size that holds
      the batch's longest row.

    Returns:
      (as the generator's return value) the row spec of what was read (the first chunk's, even one of 0 rows),
      else `spec`: what all-padding batches look like.

    Raises:
      ValueError: as `chunks`, a `pad_value` that does not fit (see `BatchSpec.fills`), a source key equal to
        ``ids.key``, or more rows than int32 ids can number.
    """
    batch_size, mask_key, pad_value, ids = padding
    start = start_batch * batch_size
    chunks = self.chunks_from(batch_size, start)
    if self.shape_fitter is not None and not self.fits_shapes:
      chunks = _fitted(chunks, self.shape_fitter, start)
    first = next(chunks, None)
    if first is None:
      return self.spec
    if ids is not None:
      check_index_key(first[0], ids.key)
    row_spec = BatchSpec.of_rows(first[0], unknown_rows=True)
    if self.shape_fitter is not None:  # lengths fields pad with 0
      pad_value = self.shape_fitter.pad_values(row_spec)
    fills = row_spec.fills(pad_value)
    for flat, rows in rechunk(itertools.chain([first], chunks), batch_size):
      batch = pad(flat, rows, batch_size, mask_key, fills)
      if (
        self.shape_fitter is not None
      ):  # length buckets: each batch cut to the smallest that holds it
        batch = self.shape_fitter.bucketed(batch)
      if ids is not None:
        batch[(ids.key,)] = row_ids(ids.offset + start, rows, batch_size)
      start += rows
      yield batch
    return row_spec


def _fitted(chunks: Iterator[Chunk], fitter: ShapeFitter, first_row: int) -> Iterator[Chunk]:
  """`chunks` with `fitter` applied (row numbers from `first_row`, for messages)."""
  for flat, rows in chunks:
    yield fitter.fit(flat, first_row), rows
    first_row += rows


def library_class(obj: Any, module: str, names: cabc.Container[str] | None = None) -> str | None:
  """The name of the class of `obj` (or of a base class) that a library defines, decided without importing it.

  Args:
    obj: any object.
    module: the library's package (or one of its subpackages), e.g. ``"grain"`` or ``"torch.utils.data"``: a
      class of it or of a module below it counts.
    names: the class names to look for (None: any class of `module`).

  Returns:
    The first such class's name in ``type(obj).__mro__``, or None.
  """
  for cls in type(obj).__mro__:
    inside = cls.__module__ == module or cls.__module__.startswith(module + ".")
    if inside and (names is None or cls.__name__ in names):
      return cls.__name__
  return None


class RaggedRowsError(ValueError):
  """A source key holds ragged rows (rows of different shapes) that no `pad_shapes` pads."""


class Padding(NamedTuple):
  """How `Source.padded` pads (``pad_batches``' arguments).

  Attributes:
    batch_size: rows per batch.
    mask_key: top-level key of the bool ``[batch_size]`` mask.
    pad_value: what padded rows hold (see `BatchSpec.fills`).
    ids: if given, each batch also gets ``(ids.key,)``: int32 ``[batch_size]``, each real row's position in the
      source plus ``ids.offset``, and -1 on padding rows.
  """

  batch_size: int
  mask_key: str
  pad_value: Any = 0
  ids: RowIds | None = None


class RowIds(NamedTuple):
  """``pad_batches(..., index_key=key, index_offset=offset)``: where the row ids go and where they start."""

  key: str
  offset: int = 0


def row_ids(first: int, rows: int, batch_size: int) -> np.ndarray:
  """The ids of one padded batch: ``first, first + 1, ...`` on its `rows` real rows, then -1.

  Args:
    first: the id of the batch's first row (its position in the source plus the offset).
    rows: real rows in the batch (the first `rows`).
    batch_size: rows per batch.

  Returns:
    int32 ``[batch_size]``.

  Raises:
    ValueError: an id beyond int32's range.
  """
  if first + rows - 1 > np.iinfo(ID_DTYPE).max:
    raise ValueError(
      f"row id {first + rows - 1} does not fit in int32; expected index_offset plus the number of rows "
      f"to stay below {np.iinfo(ID_DTYPE).max + 1}"
    )
  ids = np.full(batch_size, PADDING_ID, ID_DTYPE)
  ids[:rows] = np.arange(first, first + rows, dtype=ID_DTYPE)
  return ids


def check_index_key(flat: FlatBatch | cabc.Iterable, index_key: str) -> None:
  """Raises ValueError if a source key (a flat batch's or a spec's paths) takes the top-level `index_key`."""
  for path in flat:
    if path[0] == index_key:
      raise ValueError(
        f"the source has a key {path_name(path)} in the place of index_key={index_key!r}; rename it or "
        "pass another index_key="
      )


def flatten_rows(
  batch: Any,
  mask_key: str,
  where: str,
  convert: bool = True,
  fit: cabc.Callable[[FlatBatch], FlatBatch] | None = None,
) -> tuple[FlatBatch, int]:
  """Checks one batch of a source (any number of rows, no mask yet) and flattens it.

  Args:
    batch: a Mapping (nested dicts allowed) of arrays or array-likes ``[rows, ...]`` (torch tensors included).
    mask_key: the key the mask will take; the batch may not have it.
    where: how messages name the batch, e.g. ``"batch 3"`` or ``"the source"``.
    convert: turn leaves into numpy arrays with `to_numpy` (else only their shapes are read).
    fit: applied to the flat batch before anything else is read (`ShapeFitter.fit`: ragged keys become arrays).

  Returns:
    ``(flat, rows)``: the flat batch and its leading size.

  Raises:
    ValueError: not a Mapping, a key equal to `mask_key`, no arrays, a scalar leaf, ragged rows (a list of rows
      of different lengths, or an object array of them: naming the key and the `pad_shapes` that pads them),
      or leading sizes that disagree (every key named with its size).
  """
  if type(batch) is not dict and not isinstance(batch, cabc.Mapping):
    raise ValueError(f"{where}: expected a Mapping of arrays, got {type(batch).__name__}")
  if mask_key in batch:
    raise ValueError(
      f"{where} has a key {mask_key!r} equal to mask_key; rename it or pass another mask_key="
    )
  flat = flatten(batch, convert=False, tuples=True)
  if fit is not None:
    flat = fit(flat)
  for path, leaf in flat.items():  # before numpy reads them: it drops a mask, wraps an object
    if isinstance(leaf, np.ma.MaskedArray) and np.ma.count_masked(leaf):
      raise ValueError(_masked_message(path, leaf, where))
    if _not_an_array(leaf):
      raise ValueError(
        f"{where}: key {path_name(path)} holds {_what(leaf)}, not an array; expected an array "
        "with a leading row dimension"
      )
  if convert:
    flat = {path: _converted(path, leaf, where) for path, leaf in flat.items()}
  if not flat:
    raise ValueError(f"{where}: expected a Mapping with at least one array, got no arrays")
  sizes = {}
  for path, leaf in flat.items():
    shape = _shape(path, leaf, where)
    if not shape:
      in_tuple = any(type(key) is Index for key in path)
      raise ValueError(
        f"{where}: key {path_name(path)} is a scalar; expected an array with a leading row dimension"
        + (
          " (a tuple in a batch is a group of arrays, as in a jax pytree: pass its rows as a list or an array)"
          if in_tuple
          else ""
        )
      )
    sizes[path] = shape[0]
  if len(set(sizes.values())) > 1:
    listed = ", ".join(f"{path_name(p)} has {s}" for p, s in sizes.items())
    raise ValueError(
      f"{where}: leading sizes disagree ({listed}); expected every key to have the same rows"
    )
  return flat, next(iter(sizes.values()))


def _masked_message(path: tuple, leaf: np.ma.MaskedArray, where: str) -> str:
  """Why a masked array with masked entries is refused: numpy reads its data, not its mask."""
  name = "/".join(map(str, path))
  return (
    f"{where}: key {path_name(path)} is a numpy masked array with {np.ma.count_masked(leaf)} "
    "masked entries; its data would be read and its mask dropped (the masked entries counted as "
    f"real values): pass {name}.filled(value) with a value you mean, and leave those rows out or "
    "weigh them yourself"
  )


def _not_an_array(leaf: Any) -> bool:
  """Whether ``leaf`` is None or an object numpy would wrap as a 0-d object array (a set, a
  dataclass, a module): not an array, a list of rows, a number or a string."""
  if leaf is None:
    return True
  if hasattr(leaf, "shape") or isinstance(leaf, (list, str, bytes, numbers.Number, np.generic)):
    return False
  try:
    return np.ndim(leaf) == 0 and np.asarray(leaf).dtype == object
  except Exception:  # noqa: BLE001 - numpy cannot read it: the checks after this one say so
    return False


def _what(leaf: Any) -> str:
  """``None``, or the type of ``leaf`` with its article (``a set``, ``an object``)."""
  if leaf is None:
    return "None"
  name = type(leaf).__name__
  return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _converted(path: tuple, leaf: Any, where: str) -> np.ndarray:
  """`to_numpy(leaf)`; ragged rows raise a ValueError naming the key (not numpy's "inhomogeneous shape")."""
  if type(leaf) is not np.ndarray or leaf.dtype == object:
    message = ragged_message(path, leaf) if type(leaf) is np.ndarray else None
    if message is None:
      try:
        return to_numpy(leaf)
      except ValueError:
        message = ragged_message(path, leaf)
        if message is None:
          raise
    raise RaggedRowsError(f"{where}: {message}") from None
  return leaf


def _shape(path: tuple, leaf: Any, where: str) -> tuple:
  """`np.shape(leaf)`; ragged rows raise as in `_converted`."""
  try:
    return np.shape(leaf)
  except ValueError:
    message = ragged_message(path, leaf)
    if message is None:
      raise
    raise RaggedRowsError(f"{where}: {message}") from None


def pad(flat: FlatBatch, rows: int, batch_size: int, mask_key: str, fills: dict) -> FlatBatch:
  """Appends ``batch_size - rows`` rows of `fills` to every leaf and adds the mask (a full batch is not copied)."""
  out = dict(flat)
  if rows < batch_size:
    for path, leaf in flat.items():
      padded = np.empty((batch_size, *leaf.shape[1:]), dtype=leaf.dtype)
      padded[:rows] = leaf  # the one copy of the real rows
      padded[rows:] = _empty_string_like(leaf, fills[path])
      out[path] = padded
  out[(mask_key,)] = np.arange(batch_size) < rows
  return out


def _empty_string_like(leaf: np.ndarray, fill: Any) -> Any:
  """``fill``, or for an object leaf of Python ``str`` an empty ``str`` where ``fill`` is the empty
  bytes an object dtype pads with (tf.data's strings are bytes; a list of texts is str)."""
  if leaf.dtype == object and isinstance(fill, bytes) and not fill and leaf.size:
    if isinstance(leaf.flat[0], str):
      return ""
  return fill


def drop_rows(chunks: Iterator[Chunk], count: int) -> Iterator[Chunk]:
  """`chunks` without their first `count` rows (read, not copied); an empty chunk if nothing is left."""
  last = None
  for flat, rows in chunks:
    if rows <= count:
      count -= rows
      last = flat
      continue
    yield {p: leaf[count:] for p, leaf in flat.items()}, rows - count
    count = 0
    yield from chunks
    return
  if last is not None:
    yield {p: leaf[:0] for p, leaf in last.items()}, 0


def rechunk(chunks: Iterator[Chunk], size: int) -> Iterator[Chunk]:
  """Re-chunks into `size` rows, order kept; only the last may be short. Aligned full slices are views."""
  pending: list[FlatBatch] = []
  pending_rows = 0
  for flat, rows in chunks:
    start = 0
    if pending_rows and pending_rows + rows >= size:
      start = size - pending_rows
      pending.append({p: leaf[:start] for p, leaf in flat.items()})
      yield {p: np.concatenate([part[p] for part in pending]) for p in flat}, size
      pending, pending_rows = [], 0
    if start == 0 and rows == size:
      yield flat, size  # passthrough: the caller's arrays, not copied
      continue
    while rows - start >= size:
      yield {p: leaf[start : start + size] for p, leaf in flat.items()}, size
      start += size
    if start < rows:  # copied: a source may reuse its buffers once the next chunk is requested
      pending.append({p: np.array(leaf[start:]) for p, leaf in flat.items()})
      pending_rows += rows - start
  if len(pending) == 1:  # the short last batch: copied once already
    yield pending[0], pending_rows
  elif pending_rows:
    yield {p: np.concatenate([part[p] for part in pending]) for p in pending[0]}, pending_rows
