"""Fixed-size padded batches with a boolean mask of real rows, from any data source.

`pad_batches` turns a whole-dataset Mapping of arrays, an iterable of batches of any sizes, or a `tf.data.Dataset`
(tfds included) into batches of exactly `batch_size` rows plus `batch[mask_key]`, so that an eval step compiles once
and every real row counts exactly once. TensorFlow is imported only when a `tf.data.Dataset` is passed.

Each kind of source is one module of `padded_eval.data.sources`; `PaddedBatches` only sees the `Source` protocol.
"""

from __future__ import annotations

import collections.abc as cabc
from collections.abc import Generator, Iterator
from typing import Any

from padded_eval.data import sources
from padded_eval.data._batch_spec import BatchSpec, FlatBatch
from padded_eval.data._tree import unflatten
from padded_eval.data.sources import Padding, RowIds, check_index_key, row_ids
from padded_eval.data.sources.base import RaggedRowsError
from padded_eval.data.sources.shapes import ShapeFitter
from padded_eval.validation import check_divisible, check_int

__all__ = ["PaddedBatches", "bucket_axes", "pad_batches", "padding_fills", "skipped"]


def pad_batches(
  source: Any,
  batch_size: int | None,
  *,
  num_devices: int | None = None,
  mask_key: str = "mask",
  pad_value: Any = 0,
  num_batches: int | None = None,
  batched: bool | None = None,
  index_key: str | None = None,
  index_offset: int = 0,
  pad_shapes: Any = None,
  length_keys: Any = None,
  keys: Any = None,
) -> PaddedBatches:
  """Yields batches of exactly `batch_size` rows and a boolean mask of the real ones.

  Args:
    source: one of
      - a Mapping (nested dicts allowed) of arrays holding a whole dataset; every leaf is ``[N, ...]``. A tuple
        inside it is a group of arrays, as in a jax pytree: ``{"x": (a, b)}`` gives ``batch["x"]`` a tuple of
        the padded ``a`` and ``b`` (a list holds rows; a namedtuple raises ValueError: pass ``x._asdict()``
        or ``tuple(x)``);
      - an iterable of such Mappings with any, varying leading sizes; they are re-chunked in order. A batch that
        arrives aligned and already holds exactly `batch_size` rows is passed through without a copy;
      - a `tf.data.Dataset` (or a tfds dataset) of dicts, batched or unbatched. It is padded inside the tf.data
        graph and yields numpy arrays (strings as ``object`` arrays of ``bytes``);
      - a grain dataset or DataLoader, a Hugging Face dataset, a torch DataLoader (see `padded_eval.data.sources`);
      - a pandas DataFrame: a Mapping of its columns (``column.to_numpy()``, rows in order, the index not read;
        padded_eval never imports pandas itself). A column numpy holds no numbers for (strings, objects, dates, a
        nullable column with missing values) raises ValueError naming it, as do column names that are not
        strings (``pd.DataFrame(array)``'s ints: rename them, ``frame.columns = [str(c) for c in frame.columns]``).
      With `pad_shapes`, a Mapping may hold ragged rows (a list of token id arrays of different lengths); it is
      then read as a list of one batch.
      A pipeline that drops rows (``drop_remainder=True``; a torch DataLoader's ``drop_last=True`` with a
      short last batch), repeats them (a repeat other than ``.repeat(1)``; for tf.data, only in a pipeline
      of unknown cardinality: one of finite cardinality, ``ds.repeat(2)`` or ``ds.repeat().take(n)``, is
      read as it is) or never ends (infinite cardinality) is refused.
    batch_size: rows per yielded batch; must be divisible by `num_devices`. None, for an already batched
      source (an iterable of batches, a batched tf.data or grain pipeline, a torch DataLoader): the rows of the
      source's first batch (read now: a re-iterable source is read once more, a one-shot iterator is peeked at),
      rounded up to a multiple of `num_devices`. A short last batch is padded as always; a later batch that is
      larger is split over several batches (still exact, one more step). Read it back as ``.batch_size``.
    num_devices: device count the batch is later split over; default ``jax.local_device_count()``, read now.
    mask_key: top-level key of the mask in each yielded batch; no source key may equal it.
    pad_value: value of padded rows: a scalar for every leaf, or a dict (nested like the source, missing keys
      pad with 0, a tuple for a tuple's members) of per-key scalars. String/bytes leaves pad with empty strings unless given a string.
    num_batches: if given, yield exactly this many batches, appending all-padding ones (mask all False).
    batched: tf.data sources only: whether elements are batches. Default: inferred from the element spec (a
      scalar leaf means unbatched, an unknown leading size means batched, else the pipeline is searched for a
      batch op). Rows of varying length (a ``from_generator`` whose spec is ``[None]``, no scalar key) are
      thus taken as batches: pass ``batched=False`` (the shape errors this guess leads to say so).
    index_key: if given, every batch also carries ``batch[index_key]``: int32 ``[batch_size]``, each real row's
      0-based position in the source plus `index_offset`, and -1 on padding rows (all-padding batches included).
      Ids join per-row outputs (``masked_eval(..., outputs=True)``) with the data, and are the key of
      per-example resampling. For a tf.data source they are computed inside the graph.
    index_offset: added to every real row's id (>= 0). With several processes, pass the first row of this
      process's share (e.g. ``pe.process_slice(n).start``) so that ids are global.
    pad_shapes: variable lengths: a dict (nested like the source) of tuples, the fixed sizes of each named key's
      last axes, e.g. ``{"inputs": (60,)}`` pads ``inputs [rows, L]`` to ``[rows, 60]`` whatever ``L`` a batch
      has, so that every batch has one shape and the step compiles once (``None`` in a tuple keeps that axis;
      an int is one axis). Positions are padded with the key's `pad_value` (default 0); the token mask then
      follows from it, e.g. ``batch["inputs"] != 0`` (or ``> 0``), or from `length_keys`. In the batches of
      an iterable, a grain pipeline or a loader, a key may hold ragged rows (a list of sequences of different
      lengths); unbatched tf.data and grain rows of varying lengths are stacked with the pad value. Columns
      beyond a fixed size that hold only the pad value are dropped (a pipeline that padded to a longer row); a
      row with other values there raises. tf.data pipelines (``padded_batch`` to each batch's longest row) are
      then padded in numpy rather than in the graph.
      Length buckets: a list of sizes in place of one size, e.g. ``{"token_ids": ([16, 32, 60],)}``, pads each
      batch's axis to the smallest size that holds the batch's longest row (a row's length: a ragged row's
      size, else 1 + the last position holding a value other than the pad value), so that ``masked_eval``
      compiles once per bucket shape used, every row counts once and the results are those of one fixed size
      (only positions that hold the pad value are cut). A row longer than the last size raises; all-padding
      batches (`num_batches`) take the smallest. Not with ``masked_eval(..., checkpoint_dir=...)``, several
      processes, or per-row outputs whose shape follows the bucketed axis (each needs one shape).
    length_keys: with `pad_shapes`: ``{key in pad_shapes: new top-level key}``; each batch also gets
      ``batch[new key]``: int32 ``[batch_size]``, each row's length along the key's first fixed axis (a ragged
      row's length, else 1 + the last position that holds a value other than the pad value), and 0 on padding
      rows. E.g. ``length_keys={"inputs": "length"}`` and the token mask
      ``jnp.arange(60) < batch["length"][:, None]``.
    keys: the names of the fields of a source whose elements are tuples, in order: a torch `DataLoader` over a
      ``TensorDataset`` (batches ``[x, y]``), a tf.data or grain pipeline of tuples, an iterable of tuple
      batches; e.g. ``keys=("image", "label")`` makes each batch ``{"image": x, "label": y, "mask": ...}``. A
      value may be a dict (nested keys); with one key, an element that is a single array is named too.

  Returns:
    A `PaddedBatches`, re-iterable when the source is. Each batch is a dict with the source's structure whose array leaves are numpy
    ``[batch_size, ...]``, plus ``batch[mask_key]``: bool ``[batch_size]``, True for real rows (real rows first).
    ``len()`` works when the number of batches is known (a Mapping, a list of batches, a tf.data.Dataset of known
    cardinality, or `num_batches` given), else it raises TypeError like a generator.

  Raises:
    ValueError: `batch_size` not divisible by `num_devices`; `mask_key` not a non-empty string; an array or a
      list of non-dicts as `source` (refused at the call); `batch_size` None for a source that is not batched
      (a Mapping, an unbatched pipeline) or holds no batch; `pad_shapes` naming an unknown key, more axes than a
      key has, sizes that are not ints >= 1, or buckets that are not distinct sizes >= 1 in ascending order; a row longer than its fixed size (naming the key, the row and
      both lengths); bad `length_keys` (a new key a source key already takes included); `index_key` not a non-empty string, equal to `mask_key` or to
      a source key; `index_offset` negative, or given without `index_key`, or ids beyond int32; leading sizes that disagree within a batch; a source
      key equal to `mask_key`; keys, trailing shapes or dtypes that change between batches; a `pad_value` that does
      not fit a leaf's dtype (a finite float that would become inf included) or names an unknown key; a source holding more than `num_batches` batches (raised as
      soon as it is seen: at the call when the length is known, else during iteration); a pipeline that drops
      rows (``drop_remainder=True``: naming it and the rows lost), repeats them or never ends (refused at the
      call); ragged rows without `pad_shapes` (naming the key and the `pad_shapes` that pads them); `num_batches` with an
      empty source whose fields are unknown; iterating a second time over a one-shot iterator or generator
      source (pass a re-iterable: a list of batches, a dataset, or an object whose ``__iter__`` starts over); a
      leaf that is None or no array (a set, a dataclass), a numpy masked array with masked entries (numpy would
      read its data and drop its mask), a namedtuple (its fields would be read as rows).
    TypeError: `source` is none of the above (nor a kind added with `padded_eval.data.sources.register`).

  Examples:
    >>> import numpy as np
    >>> batches = list(pad_batches({"x": np.arange(5)}, 4, num_devices=2))
    >>> [b["x"].tolist() for b in batches], batches[1]["mask"].tolist()
    ([[0, 1, 2, 3], [4, 0, 0, 0]], [True, False, False, False])
    >>> sentences = [np.arange(1, n + 1) for n in (3, 1, 2, 7, 5)]  # ragged token ids
    >>> buckets = pad_batches([{"ids": sentences}], 2, num_devices=1, pad_shapes={"ids": ([4, 8],)})
    >>> [b["ids"].shape for b in buckets]  # longest rows 3, 7, 5
    [(2, 4), (2, 8), (2, 8)]
  """
  if not isinstance(mask_key, str) or not mask_key:
    raise ValueError(
      f"mask_key must be a non-empty string, the top-level key of the mask (default 'mask'); got {mask_key!r}"
    )
  if batch_size is not None:
    batch_size = check_int("batch_size", batch_size, minimum=1)
  if num_devices is None:
    import jax  # a no-op import; reading the count initialises the backend, so only here, at call time.

    num_devices = jax.local_device_count()
  num_devices = check_int("num_devices", num_devices, minimum=1)
  if batch_size is not None:
    check_divisible("batch_size", batch_size, num_devices)
  if num_batches is not None:
    num_batches = check_int("num_batches", num_batches, minimum=0)
  ids = _row_ids(index_key, index_offset, mask_key)
  reserved = (mask_key,) if ids is None else (mask_key, ids.key)
  fitter = ShapeFitter.create(pad_shapes, length_keys, pad_value, reserved)
  keys = _field_keys(keys, reserved)
  return PaddedBatches(
    source,
    batch_size=batch_size,
    mask_key=mask_key,
    pad_value=pad_value,
    num_batches=num_batches,
    batched=batched,
    ids=ids,
    fitter=fitter,
    num_devices=num_devices,
    keys=keys,
  )


def _field_keys(keys: Any, reserved: tuple[str, ...]) -> tuple[str, ...] | None:
  """The checked `keys` of `pad_batches`: a tuple of distinct non-empty strings, none reserved (or None)."""
  if keys is None:
    return None
  if isinstance(keys, str) or not isinstance(keys, cabc.Sequence) or not keys:
    raise ValueError(
      f"keys must be a non-empty tuple of strings, the names of a tuple element's fields in order "
      f"(e.g. keys=('image', 'label')); got {keys!r}"
    )
  keys = tuple(keys)
  bad = [key for key in keys if not isinstance(key, str) or not key]
  if bad:
    raise ValueError(f"keys must be non-empty strings; got {bad[0]!r} in keys={keys!r}")
  if len(set(keys)) < len(keys):
    twice = next(key for key in keys if keys.count(key) > 1)
    raise ValueError(f"keys must be distinct; {twice!r} appears twice in keys={keys!r}")
  taken = [key for key in keys if key in reserved]
  if taken:
    raise ValueError(
      f"keys={keys!r} names a field {taken[0]!r}, the key of the mask or the row ids; rename the field or "
      "pass another mask_key= / index_key="
    )
  return keys


def _row_ids(index_key: Any, index_offset: Any, mask_key: str) -> RowIds | None:
  """The checked `index_key` / `index_offset` of `pad_batches` (None: no ids)."""
  index_offset = check_int("index_offset", index_offset, minimum=0)
  if index_key is None:
    if index_offset:
      raise ValueError(
        f"index_offset={index_offset} without index_key: the offset shifts row ids that are not made; "
        "pass index_key= (e.g. index_key='index') to get them, or drop index_offset"
      )
    return None
  if not isinstance(index_key, str) or not index_key:
    raise ValueError(f"index_key must be a non-empty string or None; got {index_key!r}")
  if index_key == mask_key:
    raise ValueError(
      f"index_key {index_key!r} equals mask_key; expected two different keys (e.g. index_key='index')"
    )
  return RowIds(index_key, index_offset)


class PaddedBatches(cabc.Iterable):
  """The iterable returned by `pad_batches`; each ``iter()`` re-reads the source (a one-shot one raises).

  Attributes:
    batch_size: rows per batch (with ``batch_size=None``: the source's, rounded up to the device count).
    mask_key: top-level key of the bool ``[batch_size]`` mask.
    pad_value: the scalar or per-key dict padded rows hold.
    num_batches: the fixed number of batches, or None.
    index_key: top-level key of the int32 ``[batch_size]`` row ids, or None.
    index_offset: the id of the source's first row.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> batches = pe.pad_batches({"x": np.arange(5)}, 4, num_devices=2)
    >>> isinstance(batches, pe.PaddedBatches), batches.batch_size
    (True, 4)
    >>> [batch["mask"].tolist() for batch in batches]  # each iteration re-reads the source
    [[True, True, True, True], [True, False, False, False]]
  """

  def __init__(
    self,
    source,
    *,
    batch_size: int | None,
    mask_key: str = "mask",
    pad_value: Any = 0,
    num_batches: int | None = None,
    batched: bool | None = None,
    ids: RowIds | None = None,
    fitter: ShapeFitter | None = None,
    num_devices: int = 1,
    keys: tuple[str, ...] | None = None,
  ):
    """Use `pad_batches`, which checks the arguments; the keywords are those of its result."""
    self.mask_key = mask_key
    self.pad_value = pad_value
    self.num_batches = num_batches
    self.index_key = None if ids is None else ids.key
    self.index_offset = 0 if ids is None else ids.offset
    self._ids = ids
    self._source_type = type(source).__name__
    self._source = _opened(source, fitter, mask_key=mask_key, batched=batched, keys=keys)
    self._fitter = fitter
    self._source.shape_fitter = fitter
    if ids is not None:
      self._source.check_row_order(ids.key)
    if self._source.spec is not None:
      self._source.spec.check_pad_keys(pad_value)
      if ids is not None:
        check_index_key(self._source.spec.leaves, ids.key)
      if fitter is not None:
        try:
          fitter.check_spec(self._source.spec)
        except ValueError as err:
          raise ValueError(f"{err}{self._source.spec_hint}") from None
    self.batch_size = batch_size if batch_size is not None else self._source_batch_size(num_devices)
    real = None if num_batches is None else self._num_real_batches()
    if real is not None and num_batches is not None and real > num_batches:
      raise ValueError(
        f"num_batches={num_batches} but the source holds {real} batches of batch_size {self.batch_size}; "
        f"pass num_batches >= {real}"
      )

  def __iter__(self) -> Iterator[dict]:
    return self._counted(self._padded())

  def skip(self, num_batches: int) -> Iterator[dict]:
    """Like ``iter(self)``, from batch `num_batches` on (a resumed `masked_eval` skips what it consumed).

    Sources that can seek do not read the skipped rows: a Mapping (views), a tf.data.Dataset
    (``Dataset.skip`` in the graph), an unbatched grain `MapDataset` (sliced); others read them
    and drop them unpadded. Row ids (`index_key`) are those of an uninterrupted pass.

    Raises:
      ValueError: `num_batches` negative or more than a fixed `num_batches`.
    """
    num_batches = check_int("num_batches", num_batches, minimum=0)
    if self.num_batches is not None and num_batches > self.num_batches:
      raise ValueError(f"cannot skip {num_batches} batches of num_batches={self.num_batches}")
    return self._counted(self._padded(num_batches), start=num_batches)

  @property
  def num_rows(self) -> int | None:
    """The source's real rows when known without reading it (arrays, a list of batches, a tf.data
    pipeline of known cardinality, a grain `MapDataset`, a Hugging Face `Dataset`), else None."""
    return self._source.num_rows()

  def __len__(self) -> int:
    if self.num_batches is not None:
      return self.num_batches
    real = self._num_real_batches()
    if real is None:
      raise TypeError(
        f"the number of batches of this {self._source_type} source is unknown; "
        "pass num_batches= to fix it"
      )
    return real

  def __length_hint__(self) -> int:
    """``len()`` when known, else an estimate of the batches (0: none), as `operator.length_hint` reads it.

    A batched tf.data pipeline of known cardinality whose batch size is not static (``ds.batch(n)``)
    estimates ``cardinality * ceil(n / batch_size)``, exact when every batch but the last has ``n`` rows;
    the progress bar of `masked_eval` takes its total from it.
    """
    if self.num_batches is not None:
      return self.num_batches
    real = self._num_real_batches()
    if real is None:
      real = self._source.batches_hint(self.batch_size)
    return real or 0

  def __repr__(self) -> str:
    return (
      f"PaddedBatches({self._source_type}, batch_size={self.batch_size}, "
      f"mask_key={self.mask_key!r}, num_batches={self.num_batches}"
      + (
        ""
        if self._ids is None
        else f", index_key={self.index_key!r}, index_offset={self.index_offset}"
      )
      + ")"
    )

  def _source_batch_size(self, num_devices: int) -> int:
    """``batch_size=None``: the rows of the source's first batch, rounded up to a multiple of `num_devices`."""
    rows = self._source.batch_rows()
    if not rows:
      found = "is not batched, or holds no batch" if rows is None else "has a first batch of 0 rows"
      raise ValueError(
        f"batch_size=None takes the batch size of an already batched source, but this {self._source_type} "
        f"({self._source.description}) {found}; pass batch_size= (a multiple of the device count)"
      )
    return -(-rows // num_devices) * num_devices

  def _padded(self, start_batch: int = 0) -> Generator[FlatBatch, None, BatchSpec | None]:
    padding = Padding(self.batch_size, self.mask_key, self.pad_value, self._ids)
    return self._source.padded(padding, start_batch)

  def _num_real_batches(self) -> int | None:
    """Number of batches the source fills, or None when unknown without reading it."""
    rows = self._source.num_rows()
    return None if rows is None else -(-rows // self.batch_size)

  def _counted(
    self, padded: Generator[FlatBatch, None, BatchSpec | None], start: int = 0
  ) -> Iterator[dict]:
    """Yields the real batches (at most `num_batches`), then all-padding ones up to `num_batches`;
    `start`: batches already skipped."""
    count = start
    while True:
      try:
        flat = next(padded)
      except StopIteration as end:
        row_spec = end.value  # what the source's rows look like, for all-padding batches
        break
      if count == self.num_batches:
        raise ValueError(
          f"the source holds more than num_batches={self.num_batches} batches of batch_size "
          f"{self.batch_size}; pass a larger num_batches"
        )
      count += 1
      yield unflatten(flat)
    if self.num_batches is None or count == self.num_batches:
      return
    if row_spec is not None and self._fitter is not None:
      row_spec = self._fitter.fixed_spec(row_spec)
    if row_spec is None or row_spec.has_unknown_sizes:
      raise ValueError(
        f"num_batches={self.num_batches} needs all-padding batches, but the source was empty and its "
        "fields are unknown; pass a Mapping or a tf.data.Dataset with static shapes, or num_batches=None"
      )
    padded_spec = row_spec.padded_to(self.batch_size, self.mask_key)
    pad_value = self.pad_value if self._fitter is None else self._fitter.pad_values(row_spec)
    for _ in range(self.num_batches - count):
      batch = padded_spec.padding_batch(pad_value)
      if self._ids is not None:  # no real row: every id is -1
        batch[self._ids.key] = row_ids(0, 0, self.batch_size)
      yield batch


def _opened(source: Any, fitter: ShapeFitter | None, **options: Any) -> Any:
  """`sources.open_source`; a whole-dataset Mapping with ragged rows (lists of token ids of different lengths)
  is read as one batch when `pad_shapes` pads them (a Mapping is otherwise taken as arrays)."""
  try:
    return sources.open_source(source, **options)
  except RaggedRowsError:
    if fitter is None or not isinstance(source, cabc.Mapping):
      raise
    return sources.open_source([source], **options)


def skipped(batches: cabc.Iterable, count: int) -> Iterator:
  """``batches`` after the first ``count``: `PaddedBatches.skip` seeks (sources that can seek are
  not read); other iterables are read and dropped, when the first batch is asked for (so that a
  failure surfaces where the multi-host pre-flight reports it to every process).

  Raises:
    ValueError: ``batches`` holds fewer than ``count`` batches (the data changed): read, or for a
      `PaddedBatches` that seeks, known from its ``len()``, or (of unknown length) from batch
      ``count - 1``, which it seeks to and drops (every batch it yields then holds a real row).
  """
  if isinstance(batches, PaddedBatches):
    return _sought(batches, count)
  return _dropped(iter(batches), count)


def _sought(batches: PaddedBatches, count: int) -> Iterator:
  try:
    held = len(batches)
  except TypeError:  # unknown without reading the source: seek to the last batch consumed
    held = None
  if held is not None and held < count:
    raise ValueError(_changed(count, held))
  if held is not None or not count:
    yield from batches.skip(count)
    return
  rest = batches.skip(count - 1)
  if next(rest, None) is None:
    raise ValueError(_changed(count, None))
  yield from rest


def _dropped(batches: Iterator, count: int) -> Iterator:
  for index in range(count):
    if next(batches, None) is None:
      raise ValueError(_changed(count, index))
  yield from batches


def _changed(count: int, held: int | None) -> str:
  holds = "fewer" if held is None else f"only {held}"
  return (
    f"the checkpoint consumed {count} batches but batches holds {holds}: the data "
    "changed since the checkpoint was saved; a checkpoint_dir identifies one evaluation"
  )


def bucket_axes(batches: Any) -> dict:
  """``{path: axes}`` whose sizes vary between the batches of ``pe.pad_batches(..., pad_shapes=...)``
  with length buckets (axes counted from the end of a row's shape); ``{}`` for any other batches."""
  if isinstance(batches, PaddedBatches) and batches._fitter is not None:
    return batches._fitter.bucket_axes()
  return {}


def padding_fills(batches: Any) -> dict:
  """What all-padding batches made for ``batches`` hold beyond the mask (the multi-host lockstep's):
  the row ids of ``pe.pad_batches(..., index_key=...)`` are -1 on padding, as in every padded batch."""
  if isinstance(batches, PaddedBatches) and batches.index_key is not None:
    return {batches.index_key: -1}
  return {}
