"""The tf.data source adapter of `pad_batches` (private to data).

Padding happens inside the tf.data graph: a batched source is re-chunked with `Dataset.rebatch`, an unbatched one
with `Dataset.batch`; one `map` pads the short last batch and builds the mask. Python touches each batch once, to
turn it into numpy. TensorFlow is imported only here, and only once a dataset has been passed.
"""

from __future__ import annotations

import collections.abc as cabc
import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from padded_eval._data_tree import FlatBatch, Path, flatten, path_name, unflatten

_MAX_PIPELINE_DEPTH = 256


def is_tf_dataset(source: Any) -> bool:
  """Whether `source` is a tf.data.Dataset (tfds included), decided without importing TensorFlow."""
  return any(cls.__module__.startswith("tensorflow.python.data.") for cls in type(source).__mro__)


class TfAdapter:
  """Checks a dataset's element spec and builds the padded pipeline for it."""

  def __init__(self, dataset: Any, batch_size: int, mask_key: str, batched: bool | None):
    self.dataset = dataset
    self.batch_size = batch_size
    self.mask_key = mask_key
    spec = dataset.element_spec
    if not isinstance(spec, cabc.Mapping):
      raise ValueError(
        f"expected a tf.data.Dataset of dicts, got elements of type {type(spec).__name__}; map them "
        "to a dict first, e.g. ds.map(lambda x, y: {'image': x, 'label': y})"
      )
    if mask_key in spec:
      raise ValueError(
        f"the dataset has a key {mask_key!r} equal to mask_key; rename it or pass another mask_key="
      )
    self.specs = flatten(spec, convert=False)
    if not self.specs:
      raise ValueError("expected a dataset of dicts with at least one tensor, got no tensors")
    self.paths = list(self.specs)
    self.batched = _infer_batched(dataset, self.specs) if batched is None else bool(batched)
    if self.batched:
      _check_static_leading_sizes(self.specs)

  def static_spec(self) -> dict[Path, tuple[tuple, np.dtype]]:
    """``{path: (per-row shape, numpy dtype)}``; unknown sizes are None."""
    skip = 1 if self.batched else 0
    return {
      path: (tuple(spec.shape.as_list()[skip:]), np.dtype(spec.dtype.as_numpy_dtype))
      for path, spec in self.specs.items()
    }

  def num_rows(self) -> int | None:
    """Number of examples, when the cardinality (and, if batched, a static batch size) tells it."""
    cardinality = int(self.dataset.cardinality())
    if cardinality < 0:
      return None
    if not self.batched:
      return cardinality
    leading = {spec.shape[0] for spec in self.specs.values()}
    size = leading.pop() if len(leading) == 1 else None
    return None if size is None else cardinality * size

  def iterate(self, fill: Callable[[Path, np.dtype], Any]) -> Iterator[FlatBatch]:
    """Yields flat numpy batches of exactly `batch_size` rows, mask included."""
    import tensorflow as tf

    dataset = self.dataset
    if self.batched:  # rebatch checks that a batch's leading sizes agree (see _explain)
      dataset = dataset.rebatch(self.batch_size)
    else:
      dataset = dataset.batch(self.batch_size)
    fills = {path: fill(path, dtype) for path, (_, dtype) in self.static_spec().items()}
    pad = _make_pad_fn(self.batch_size, self.mask_key, fills)
    dataset = dataset.map(pad, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    iterator = dataset.prefetch(tf.data.AUTOTUNE).as_numpy_iterator()
    while True:
      try:
        batch = next(iterator)
      except StopIteration:
        return
      except tf.errors.InvalidArgumentError as err:
        raise ValueError(self._explain(err.message)) from None
      yield flatten(batch, convert=False)

  def _explain(self, message: str) -> str:
    """tf.data's leading-size error in the words of `pad_batches` (keys named), or else its message."""
    import tensorflow as tf

    found = re.search(
      r"Component (\d+) had size (\d+) but component (\d+) had size,? (\d+)", message
    )
    if not found:
      return f"the tf.data source failed: {message.strip()}"
    order = tf.nest.flatten(
      unflatten({path: i for i, path in enumerate(self.paths)})
    )  # tf.data's order
    paths = [self.paths[i] for i in order]
    first, first_rows, other, other_rows = (int(g) for g in found.groups())
    return (
      f"leading sizes disagree within a batch: key {path_name(paths[first])} has {first_rows} rows, key "
      f"{path_name(paths[other])} has {other_rows}; expected every key to have the same rows"
    )


def _infer_batched(dataset: Any, specs: dict) -> bool:
  """Whether elements are batches: a scalar leaf says no, an unknown leading size says yes, else a batch op does."""
  ranks = [spec.shape.rank for spec in specs.values()]
  if None in ranks:
    raise ValueError(
      f"key {path_name(next(p for p, s in specs.items() if s.shape.rank is None))} has unknown rank; "
      "pass batched=True or batched=False"
    )
  if 0 in ranks:
    return False
  leading = [spec.shape[0] for spec in specs.values()]
  if None in leading:
    return True
  if len(set(leading)) > 1:
    return False
  node = dataset
  for _ in range(_MAX_PIPELINE_DEPTH):
    name = type(node).__name__.lower()
    if "unbatch" in name:
      return False
    if "batch" in name:
      return True
    node = getattr(node, "_input_dataset", None)
    if node is None:
      return False
  return False


def _check_static_leading_sizes(specs: dict) -> None:
  sizes = {path: spec.shape[0] for path, spec in specs.items() if spec.shape[0] is not None}
  if len(set(sizes.values())) > 1:
    listed = ", ".join(f"{path_name(p)} has {s}" for p, s in sizes.items())
    raise ValueError(
      f"leading sizes disagree in the dataset's batches ({listed}); expected equal sizes"
    )


def _make_pad_fn(batch_size: int, mask_key: str, fills: dict[Path, Any]):
  import tensorflow as tf

  def pad(element):
    flat = flatten(element, convert=False)
    rows = tf.shape(next(iter(flat.values())))[0]
    padded = {}
    for path, leaf in flat.items():
      static = [batch_size] + leaf.shape.as_list()[1:]
      # Only a short batch is copied: a full one passes through unchanged.
      padded[path] = tf.ensure_shape(
        tf.cond(
          rows < batch_size,
          lambda leaf=leaf, path=path: _padded(leaf, rows, fills[path]),
          lambda leaf=leaf: leaf,
        ),
        static,
      )
    padded[(mask_key,)] = tf.range(batch_size) < rows
    return unflatten(padded)

  def _padded(leaf, rows, fill):
    shape = tf.concat([[batch_size - rows], tf.shape(leaf)[1:]], axis=0)
    return tf.concat([leaf, tf.fill(shape, tf.constant(fill, dtype=leaf.dtype))], axis=0)

  return pad
