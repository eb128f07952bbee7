"""Source kind: a `tf.data.Dataset` of dicts (tfds included), batched or unbatched.

A pipeline whose batches already have the size asked (it ends in ``batch(n)`` or ``padded_batch(n)``) is read as
it is and its short last batch padded in numpy, as every source's. Otherwise padding happens inside the tf.data
graph: a batched source is re-chunked with `Dataset.rebatch`, an unbatched one with `Dataset.batch`; one `map` pads
the short last batch (`tf.pad`, which forwards a full batch uncopied) and builds the mask. Python touches each batch
once, to turn it into numpy. TensorFlow is imported only here, and only once a dataset has been passed.

A pipeline that would lose rows, repeat them or never end is refused when wrapped: infinite cardinality (a
``.repeat()``), a ``.repeat(n)`` with ``n`` other than 1 in a pipeline of unknown cardinality (after a ``filter``),
and a ``batch`` / ``padded_batch`` / ``rebatch`` with ``drop_remainder=True`` unless its input is known to fill
every batch (or is infinite). A pipeline of finite cardinality (``ds.repeat(2)``, ``ds.repeat().take(n)``) reads
exactly that many elements and is read as it is, repeats included. A ``batch`` with ``drop_remainder=True`` inside
the function of a ``flat_map``, ``interleave`` or ``group_by_window`` (``bucket_by_sequence_length``) is refused too:
each group's short batch would be lost. Whether elements are batches is read from such a function's output when no
batch op comes after it (``ds.batch(4).flat_map(from_tensor_slices)`` yields rows). The pipeline is read through
tf.data's private ``_inputs()`` and one level of its datasets' functions; a kind of dataset that hides its inputs,
or a function nested in such a function, is not searched.
"""

from __future__ import annotations

import collections.abc as cabc
import re
import sys
import threading
import weakref
from collections.abc import Generator, Iterator
from typing import Any

import numpy as np

from padded_eval.caches import registry
from padded_eval.data._batch_spec import BatchSpec, FlatBatch, LeafSpec, Path
from padded_eval.data._tree import (
  flatten,
  pad_shapes_literal,
  path_name,
  ragged_message,
  unflatten,
)
from padded_eval.data.sources import tf_pipeline
from padded_eval.data.sources.base import (
  ID_DTYPE,
  PADDING_ID,
  Chunk,
  Padding,
  RaggedRowsError,
  RowIds,
  Source,
  SourceOptions,
  check_index_key,
)
from padded_eval.data.sources.fields import name_fields

# What `pad_batches` built or read over a tf.data dataset the user passed (its padding pipelines,
# the rows of its first batch), kept between calls: weakly keyed by the dataset, so an entry goes
# with its dataset, and nothing is written onto it. A pipeline built over the dataset itself would
# hold it as its input and keep the weak key alive, so the pipelines are built over a detached view
# of it (`TfDataSource._detached`: the same tf.data graph, `tf.data.experimental.from_variant`),
# which does not hold the user's Python object. `clear_cache` (`pe.clear_caches()`) empties it.
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

__all__ = ["TfDataSource", "clear_cache"]


def clear_cache() -> None:
  """Drops the padding pipelines (and first-batch sizes) kept for the datasets still alive."""
  _BUILT.clear()


registry.kept(_BUILT, "padded_eval.data.sources.tf_data._BUILT", clear=clear_cache)


def _built_for(dataset: Any) -> dict:
  """What was built for `dataset` (a fresh dict, not kept, if it cannot be weakly referenced)."""
  try:
    return _BUILT.setdefault(dataset, {})
  except TypeError:
    return {}


CHUNK_ROWS = 1024  # rows per chunk when `chunks` reads an unbatched dataset


class TfDataSource(Source):
  """Checks a dataset's element spec when wrapped and pads inside the tf.data graph."""

  description = "a tf.data.Dataset"
  names_fields = True

  library = ("tensorflow.python.data", None)

  def __init__(self, obj: Any, options: SourceOptions):
    """Reads the element spec.

    Args:
      obj: a `tf.data.Dataset` of dicts, or, with `keys`, of tuples (``(image, label)``: named by one ``map``
        in the graph, which keeps the cardinality and the pipeline's checks).
      options: the mask's key (no dataset key may equal it); `batched`, whether elements are batches (None: a
        scalar leaf means unbatched, an unknown leading size means batched, else the pipeline is searched for
        a batch op; the guess is named, with ``batched=False``, at the end of a shape error: `spec_hint`);
        `keys`, the names of the fields of tuple elements, in order (see `name_fields`).

    Raises:
      ValueError: elements that are not dicts (without `keys`), tuples that do not fit `keys`, a key equal to `mask_key`, no tensors, a leaf that is not a tensor (a tuple, a SparseTensor), a leaf of unknown rank
        (with `batched` None), static leading sizes that disagree (batched); a pipeline that never ends
        (infinite cardinality), repeats rows (``.repeat(n)``, n other than 1, with an unknown cardinality) or
        drops them (``drop_remainder=True``).
    """
    mask_key, batched, keys = options
    self._built, self._keys = _built_for(obj), keys
    self._passed = obj  # the user's dataset (the padding pipelines are built over a view of it)
    if keys is not None:
      obj = _named(obj, keys)
    self._dataset = obj
    element_spec = obj.element_spec
    if not isinstance(element_spec, cabc.Mapping):
      raise ValueError(
        f"expected a tf.data.Dataset of dicts, got elements of type {type(element_spec).__name__}; "
        "pass pe.pad_batches(ds, ..., keys=('image', 'label')) with one name per value, or map them to a "
        "dict first, e.g. ds.map(lambda x, y: {'image': x, 'label': y})"
      )
    if mask_key in element_spec:
      raise ValueError(
        f"the dataset has a key {mask_key!r} equal to mask_key; rename it or pass another mask_key="
      )
    tf_pipeline.check_rows_read_once(obj)
    self._tensor_specs = flatten(element_spec, convert=False)
    if not self._tensor_specs:
      raise ValueError("expected a dataset of dicts with at least one tensor, got no tensors")
    self._ragged = _check_tensor_specs(self._tensor_specs)
    self._batched = (
      tf_pipeline.infer_batched(obj, self._tensor_specs) if batched is None else bool(batched)
    )
    if self._batched:
      _check_batch_ranks(self._tensor_specs)
      _check_static_leading_sizes(self._tensor_specs)
    if batched is None and self._batched:
      self.spec_hint = _batched_guess(self._tensor_specs)
    skip = 1 if self._batched else 0
    self._spec = BatchSpec(
      {
        path: LeafSpec(tuple(spec.shape.as_list()[skip:]), np.dtype(spec.dtype.as_numpy_dtype))
        for path, spec in self._tensor_specs.items()
      }
    )

  @property
  def spec(self) -> BatchSpec:
    """The static row spec; sizes the element spec leaves open are None."""
    return self._spec

  def num_rows(self) -> int | None:
    """Number of examples, when the cardinality (and, if batched, a static batch size) tells it
    (`tf_pipeline.cardinality`: not after a ``.repeat()`` of an input of unknown cardinality)."""
    cardinality = tf_pipeline.cardinality(self._dataset)
    if cardinality < 0:
      return None
    if not self._batched:
      return cardinality
    leading = {spec.shape[0] for spec in self._tensor_specs.values()}
    size = leading.pop() if len(leading) == 1 else None
    return None if size is None else cardinality * size

  def batches_hint(self, batch_size: int) -> int | None:
    """See `tf_pipeline.batches_hint` (nothing is read)."""
    return tf_pipeline.batches_hint(self._dataset, self._batched, batch_size)

  def batch_rows(self) -> int | None:
    """The static batch size, else the rows of the first element; None if the dataset is not batched.

    The first element is read once per dataset (kept with its padding pipelines): opening a
    ``take(1)`` pipeline costs more than a short evaluation's whole pass over a warm one.
    """
    if not self._batched:
      return None
    leading = {spec.shape[0] for spec in self._tensor_specs.values()}
    if len(leading) == 1 and None not in leading:
      return leading.pop()
    if "first_rows" not in self._built:
      first = next(self._numpy(self._dataset.take(1)), None)
      self._built["first_rows"] = None if first is None else len(next(iter(first.values())))
    return self._built["first_rows"]

  def chunks(self) -> Iterator[Chunk]:
    """The elements as numpy chunks (an unbatched dataset in chunks of `CHUNK_ROWS`; with `shape_fitter`,
    unbatched rows of varying lengths are batched with ``padded_batch``, padded with the pad value, or, with a
    `tf.RaggedTensor` field, with ``ragged_batch``, for `shape_fitter` to pad).

    Raises:
      RaggedRowsError: without `shape_fitter`, a field of ragged rows (a `tf.RaggedTensor`'s, which numpy
        holds as an object array of rows), naming the key and the `pad_shapes` that pads them.
    """
    if self._batched:
      dataset = self._dataset
    elif self.shape_fitter is None:
      dataset = self._dataset.batch(CHUNK_ROWS)
    elif self._ragged:
      dataset = self._dataset.ragged_batch(CHUNK_ROWS)
    else:
      dataset = self._dataset.padded_batch(CHUNK_ROWS, padding_values=self._padding_values())
    first = None
    for index, flat in enumerate(self._numpy(dataset)):
      if self.shape_fitter is None and self._ragged:
        _check_not_ragged(flat)
      if first is None:
        first = BatchSpec.of_rows(flat)
      elif self.shape_fitter is None:  # trailing sizes the static spec leaves open may vary
        first.check_rows(flat, index)
      yield flat, _leading_rows(flat, self.spec_hint)

  def _padding_values(self) -> dict:
    """``padded_batch``'s padding values: each key's pad value (see `BatchSpec.fills`)."""
    import tensorflow as tf

    assert self.shape_fitter is not None  # padded_batch: only with a shape fitter
    fills = self._spec.fills(self.shape_fitter.pad_value)
    return unflatten(
      {
        path: tf.constant(fills[path], dtype=spec.dtype)
        for path, spec in self._tensor_specs.items()
      }
    )

  def check_row_order(self, index_key: str) -> None:
    """Refuses a pipeline whose shuffle gives another order on every pass (see
    `tf_pipeline.check_fixed_order`), where row ids are asked for."""
    tf_pipeline.check_fixed_order(self._dataset, index_key)

  def padded(
    self, padding: Padding, start_batch: int = 0
  ) -> Generator[FlatBatch, None, BatchSpec | None]:
    """Re-chunks and pads in the tf.data graph (the row ids too); see `Source.padded`. Batches before
    `start_batch` are skipped in the graph (``Dataset.skip``), before padding.

    With `shape_fitter` (``pad_shapes``), or batches whose static spec leaves a trailing size open, batches
    of varying shapes are re-chunked and padded in numpy (`Source.padded`), since ``Dataset.rebatch`` cannot
    join them (without `shape_fitter` a batch whose shapes differ from the first's raises ValueError).

    Returns:
      (as the generator's return value) the row spec of the first batch (real sizes), else the static one.
    """
    batch_size, mask_key, _, ids = padding
    # rebatch cannot join batches of two shapes, nor tf.pad pad a RaggedTensor
    varying = (self._batched and self._spec.has_unknown_sizes) or self._ragged
    if self.shape_fitter is not None or varying or self._fills_batches(batch_size):  # in numpy
      return (yield from super().padded(padding, start_batch))
    if ids is not None:
      check_index_key(self._tensor_specs, ids.key)
    dataset = self._padded_pipeline(padding, start_batch)
    first_spec, first_id = None, 0 if ids is None else ids.offset + start_batch * batch_size
    added = () if ids is None else ((ids.key,),)
    for index, flat in enumerate(self._numpy(dataset)):
      rows = {path: leaf for path, leaf in flat.items() if path not in ((mask_key,), *added)}
      if first_spec is None:  # real shapes replace the static spec's unknown sizes
        first_spec = BatchSpec.of_rows(rows, unknown_rows=True)
      else:  # rows of sizes the static spec leaves open may vary between batches
        first_spec.check_rows(rows, start_batch + index)
      if ids is not None:  # the last real row's id (padding rows hold -1)
        _check_id_range(first_id + int(np.count_nonzero(flat[(mask_key,)])) - 1)
        first_id += batch_size
      yield flat
    return self._spec if first_spec is None else first_spec

  def _fills_batches(self, batch_size: int) -> bool:
    """Whether the pipeline's batches already have `batch_size` rows but the last (it ends in a
    ``batch(batch_size)`` or ``padded_batch(batch_size)``): then they are padded in numpy, on the
    host, as every source's. The graph's ``rebatch`` and padding ``map`` would do nothing to the
    full batches and cost a map function's tracing, and its instantiation at every iteration,
    more than a short evaluation's whole pass over the pipeline."""
    return self._batched and tf_pipeline.nearest_batch_size(self._dataset) == batch_size

  def _padded_pipeline(self, padding: Padding, start_batch: int) -> Any:
    """The padding tf.data pipeline over the source's dataset, built once per dataset and
    arguments (kept in `_BUILT`, over `_detached`): tracing its map function was most of a short
    evaluation's data time, paid again at every ``pad_batches`` of the same eval dataset."""
    import tensorflow as tf

    batch_size, mask_key, pad_value, ids = padding
    fills = self._spec.fills(pad_value)
    row_ids = None if ids is None else (ids.key, ids.offset)
    specs = repr(sorted(self._tensor_specs.items()))
    key = (
      "padded",
      self._keys,
      self._batched,
      specs,
      batch_size,
      mask_key,
      repr(sorted(fills.items())),
      row_ids,
      start_batch,
    )
    built = self._built
    if key in built:
      return built[key]
    if self._batched:  # rebatch checks that a batch's leading sizes agree (see _explain)
      dataset = self._detached().rebatch(batch_size)
    else:
      dataset = self._detached().batch(batch_size)
    pad = _make_pad_fn(batch_size, mask_key, fills, ids)
    if ids is not None:  # every batch but the last is full, so batch b starts at row b * batch_size
      dataset = dataset.enumerate()
    if start_batch:
      dataset = dataset.skip(start_batch)
    # plain TF ops (tf.cond, no Python control flow on tensors): traced without autograph
    pad = tf.autograph.experimental.do_not_convert(pad)
    # a sequential map: the pad is a pass-through for full batches, and a parallel map's thread
    # pool and a prefetch cost more to start than they saved (once per pad_batches iteration)
    built[key] = dataset.map(pad)
    return built[key]

  def _detached(self) -> Any:
    """The dataset (its tuples named, with `keys`) over a view of the user's that does not hold the
    user's Python object: the same graph (``tf.data.experimental.from_variant``), read while the
    user's dataset is alive (this source holds it), so that what is kept in `_BUILT` does not keep
    it alive."""
    import tensorflow as tf

    passed = self._passed
    view = tf.data.experimental.from_variant(
      tf.data.experimental.to_variant(passed), passed.element_spec
    )
    return view if self._keys is None else _named(view, self._keys)

  def _numpy(self, dataset: Any) -> Iterator[FlatBatch]:
    """Iterates `dataset` as flat numpy batches, with tf.data's leading-size error in our words.

    The iterator is released on a thread of its own when the iteration ends (see
    `release_iterator`)."""
    import tensorflow as tf

    held = [dataset.as_numpy_iterator()]
    try:
      while True:
        try:
          batch = next(held[0])
        except StopIteration:
          return
        except tf.errors.InvalidArgumentError as err:
          raise ValueError(self._explain(err.message)) from None
        yield flatten(batch, convert=False)
    finally:
      release_iterator(held)

  def _explain(self, message: str) -> str:
    """tf.data's leading-size error in the words of `pad_batches` (keys named), or else its message."""
    import tensorflow as tf

    paths = list(self._tensor_specs)
    order = tf.nest.flatten(unflatten({path: i for i, path in enumerate(paths)}))  # tf.data's order
    paths = [paths[i] for i in order]
    ragged = re.search(
      r"different shapes in component (\d+)\. First element had shape (\[[\d, ]*\]) and element (\d+) had "
      r"shape (\[[\d, ]*\])",
      message,
    )
    if ragged:
      component, first_shape, other, other_shape = ragged.groups()
      path = paths[int(component)]
      sizes = tuple(
        max(a, b) for a, b in zip(_parsed_shape(first_shape), _parsed_shape(other_shape))
      )
      return (
        f"key {path_name(path)} holds ragged rows (rows 0 and {other} of a batch have shapes {first_shape} and "
        f"{other_shape}); expected rows of one shape: pad them to fixed sizes with pe.pad_batches(..., "
        f"pad_shapes={pad_shapes_literal(path, sizes)}), sizes of at least the longest row"
      )
    found = re.search(
      r"Component (\d+) had size (\d+) but component (\d+) had size,? (\d+)", message
    )
    if not found:
      return f"the tf.data source failed: {message.strip()}"
    first, first_rows, other, other_rows = (int(g) for g in found.groups())
    return _disagreeing_sizes(paths[first], first_rows, paths[other], other_rows) + self.spec_hint


def release_iterator(held: list) -> threading.Thread | None:
  """Drops the tf.data iterator in ``held`` (a one-item list, emptied) on a new thread.

  Deleting a tf.data iterator waits for the threads it started, and with autotuning on (the
  default) that wait sometimes lasts until the autotuning thread's next scheduled wake, which
  comes at 10, 30, 70, ..., 1270 ms after the iterator was made: measured on Flax mnist's
  pipeline, the exhausted iterator's deletion took 0.38-0.60 s in 3 or 4 of 8 short
  evaluations (two sets of 8), at the end of the last batch. The deletion runs TensorFlow ops, which release the GIL, so a
  thread of its own takes it off the evaluation's path. The thread is not a daemon: the
  interpreter waits for it at exit (what the deletion would have cost here) rather than
  tearing TensorFlow down under it.

  While the interpreter shuts down (a generator left open by an uncaught exception is closed
  then) no thread can start: Python 3.11 waits forever in ``Thread.start`` and 3.12 raises, so
  the iterator is dropped here.

  Returns:
    The thread (started), for tests; None when the iterator was dropped on this thread.
  """
  if sys.is_finalizing():
    held.clear()
    return None
  thread = threading.Thread(target=held.clear, name="padded_eval-release-tf-iterator")
  try:
    thread.start()
  except RuntimeError:  # "can't create new thread at interpreter shutdown" (Python 3.12+)
    held.clear()
    return None
  return thread


def _named(dataset: Any, keys: tuple[str, ...]) -> Any:
  """`dataset` with its tuple elements as dicts of `keys` (one ``map``: cardinality and lineage are kept)."""
  name_fields(
    dataset.element_spec, keys, "an element of the tf.data.Dataset"
  )  # the check, on the spec
  if isinstance(dataset.element_spec, (tuple, list)):
    return dataset.map(lambda *fields: dict(zip(keys, fields)))
  return dataset.map(lambda field: {keys[0]: field})


def _parsed_shape(text: str) -> tuple[int, ...]:
  """A shape as tf.data's messages print it, ``"[3, 2]"``, as a tuple."""
  return tuple(int(size) for size in text.strip("[]").split(",") if size.strip())


def _leading_rows(flat: FlatBatch, hint: str = "") -> int:
  """The rows of a numpy batch; ValueError naming two keys whose leading sizes disagree (`hint` appended)."""
  sizes = {path: len(leaf) for path, leaf in flat.items()}
  first, rows = next(iter(sizes.items()))
  for path, size in sizes.items():
    if size != rows:
      (a, a_rows), (b, b_rows) = sorted([(first, rows), (path, size)])
      raise ValueError(_disagreeing_sizes(a, a_rows, b, b_rows) + hint)
  return rows


def _batched_guess(specs: dict) -> str:
  """The end of a message about rows' shapes when ``batched`` was inferred as True: why, and the switch."""
  unknown = next((path for path, spec in specs.items() if spec.shape[0] is None), None)
  why = (
    "the pipeline has a batch op"
    if unknown is None
    else f"key {path_name(unknown)} has an unknown leading size"
  )
  return (
    f". The dataset's elements were taken as batches ({why}); if each element is one row (e.g. a "
    "from_generator of rows of varying length, spec [None]), pass pe.pad_batches(..., batched=False)"
  )


def _disagreeing_sizes(a: tuple, a_rows: int, b: tuple, b_rows: int) -> str:
  """The message for keys ``a`` and ``b`` of one batch whose leading sizes differ."""
  return (
    f"leading sizes disagree within a batch: key {path_name(a)} has {a_rows} rows, "
    f"key {path_name(b)} has {b_rows}; expected every key to have the same rows"
  )


def _check_tensor_specs(specs: dict) -> bool:
  """Raises ValueError naming a leaf that is not a (dense or ragged) tensor: a tuple, a SparseTensor.

  Returns:
    Whether a leaf is a `tf.RaggedTensor`.
  """
  import tensorflow as tf

  for path, spec in specs.items():
    if not isinstance(spec, (tf.TensorSpec, tf.RaggedTensorSpec)):
      raise ValueError(
        f"key {path_name(path)} holds a {type(spec).__name__}; expected a tensor: map the elements to dicts "
        "of dense tensors first (nested dicts allowed, not tuples; tf.sparse.to_dense for a SparseTensor)"
      )
  return any(isinstance(spec, tf.RaggedTensorSpec) for spec in specs.values())


def _check_not_ragged(flat: FlatBatch) -> None:
  """Raises RaggedRowsError naming a leaf of ragged rows (an object array of rows of different shapes)."""
  for path, leaf in flat.items():
    message = ragged_message(path, leaf)
    if message is not None:
      raise RaggedRowsError(f"the tf.data.Dataset: {message}")


def _check_batch_ranks(specs: dict) -> None:
  """Raises ValueError if a leaf of batched elements (``batched=True``) is a scalar: it has no rows."""
  for path, spec in specs.items():
    if spec.shape.rank == 0:
      raise ValueError(
        f"batched=True takes each element as a batch, but key {path_name(path)} is a scalar; expected a "
        "leading row dimension on every key, or batched=False (elements are rows)"
      )


def _check_static_leading_sizes(specs: dict) -> None:
  sizes = {path: spec.shape[0] for path, spec in specs.items() if spec.shape[0] is not None}
  if len(set(sizes.values())) > 1:
    listed = ", ".join(f"{path_name(p)} has {s}" for p, s in sizes.items())
    raise ValueError(
      f"leading sizes disagree in the dataset's batches ({listed}); expected equal sizes"
    )


def _check_id_range(last_id: int) -> None:
  if last_id > np.iinfo(ID_DTYPE).max:
    raise ValueError(
      f"row id {last_id} does not fit in int32; expected index_offset plus the number of rows to stay "
      f"below {np.iinfo(ID_DTYPE).max + 1}"
    )


def _make_pad_fn(batch_size: int, mask_key: str, fills: dict[Path, Any], ids: RowIds | None):
  """The tf.data map function: pads a short batch with `fills` and adds the mask (and the row ids).

  With `ids` it maps ``(batch number, batch)`` (from ``Dataset.enumerate``), else ``batch``.
  """
  import tensorflow as tf

  def pad_with_ids(number, element):
    assert ids is not None  # the map function with ids
    padded = pad(element)
    positions = tf.range(batch_size, dtype=tf.int64)
    first = tf.cast(ids.offset, tf.int64) + number * batch_size
    real = padded[mask_key]
    padded[ids.key] = tf.cast(tf.where(real, first + positions, PADDING_ID), ID_DTYPE)
    return padded

  def pad(element):
    flat = flatten(element, convert=False)
    rows = tf.shape(next(iter(flat.values())))[0]
    padded = {}
    for path, leaf in flat.items():
      # No tf.cond: its branch functions are instantiated again for every iterator (most of a short
      # evaluation's data time); tf.pad forwards a full batch's buffer (all paddings 0) uncopied.
      paddings = [[0, batch_size - rows]] + [[0, 0]] * (leaf.shape.rank - 1)
      fill = tf.constant(fills[path], dtype=leaf.dtype)
      padded[path] = tf.ensure_shape(
        tf.pad(leaf, paddings, constant_values=fill), [batch_size] + leaf.shape.as_list()[1:]
      )
    padded[(mask_key,)] = tf.range(batch_size) < rows
    return unflatten(padded)

  return pad if ids is None else pad_with_ids
