"""Fixed-size padded batches with a boolean mask of real rows, from any data source.

`pad_batches` turns a whole-dataset Mapping of arrays, an iterable of batches of any sizes, or a `tf.data.Dataset`
(tfds included) into batches of exactly `batch_size` rows plus `batch[mask_key]`, so that an eval step compiles once
and every real row counts exactly once. TensorFlow is imported only when a `tf.data.Dataset` is passed.
"""

from __future__ import annotations

import collections.abc as cabc
from collections.abc import Iterator
from typing import Any

import numpy as np

from padded_eval import _data_tf
from padded_eval._data_tree import FlatBatch, Path, flatten, path_name, unflatten

__all__ = ["PaddedBatches", "pad_batches"]

_STRING_KINDS = "USO"  # unicode, bytes, object (tf.data yields bytes as object arrays)


def pad_batches(
  source: Any,
  batch_size: int,
  *,
  num_devices: int | None = None,
  mask_key: str = "mask",
  pad_value: Any = 0,
  num_batches: int | None = None,
  batched: bool | None = None,
) -> PaddedBatches:
  """Yields batches of exactly `batch_size` rows and a boolean mask of the real ones.

  Args:
    source: one of
      - a Mapping (nested dicts allowed) of arrays holding a whole dataset; every leaf is ``[N, ...]``;
      - an iterable of such Mappings with any, varying leading sizes; they are re-chunked in order. A batch that
        arrives aligned and already holds exactly `batch_size` rows is passed through without a copy;
      - a `tf.data.Dataset` (or a tfds dataset) of dicts, batched or unbatched. It is padded inside the tf.data
        graph and yields numpy arrays (strings as ``object`` arrays of ``bytes``).
    batch_size: rows per yielded batch; must be divisible by `num_devices`.
    num_devices: device count the batch is later split over; default ``jax.local_device_count()``, read now.
    mask_key: top-level key of the mask in each yielded batch; no source key may equal it.
    pad_value: value of padded rows: a scalar for every leaf, or a dict (nested like the source, missing keys
      pad with 0) of per-key scalars. String/bytes leaves pad with empty strings unless given a string.
    num_batches: if given, yield exactly this many batches, appending all-padding ones (mask all False).
    batched: tf.data sources only: whether elements are batches. Default: inferred from the element spec (a
      scalar leaf means unbatched, an unknown leading size means batched, else the pipeline is searched for a
      batch op).

  Returns:
    A re-iterable `PaddedBatches`. Each batch is a dict with the source's structure whose array leaves are numpy
    ``[batch_size, ...]``, plus ``batch[mask_key]``: bool ``[batch_size]``, True for real rows (real rows first).
    ``len()`` works when the number of batches is known (a Mapping, a list of batches, a tf.data.Dataset of known
    cardinality, or `num_batches` given), else it raises TypeError like a generator.

  Raises:
    ValueError: `batch_size` not divisible by `num_devices`; leading sizes that disagree within a batch; a source
      key equal to `mask_key`; keys, trailing shapes or dtypes that change between batches; a `pad_value` that does
      not fit a leaf's dtype or names an unknown key; a source holding more than `num_batches` batches (raised as
      soon as it is seen: at the call when the length is known, else during iteration); `num_batches` with an
      empty source whose fields are unknown.
    TypeError: `source` is none of the above.

  Example:
    >>> import numpy as np
    >>> batches = list(pad_batches({"x": np.arange(5)}, 4, num_devices=2))
    >>> [b["x"].tolist() for b in batches], batches[1]["mask"].tolist()
    ([[0, 1, 2, 3], [4, 0, 0, 0]], [True, False, False, False])
  """
  batch_size = _check_count("batch_size", batch_size, minimum=1)
  if num_devices is None:
    import jax  # a no-op import; reading the count initialises the backend, so only here, at call time.

    num_devices = jax.local_device_count()
  num_devices = _check_count("num_devices", num_devices, minimum=1)
  if batch_size % num_devices:
    lower = batch_size // num_devices * num_devices
    options = f"{lower} or {lower + num_devices}" if lower else f"{num_devices}"
    raise ValueError(
      f"batch_size {batch_size} is not divisible by {num_devices} devices; use {options}"
    )
  if num_batches is not None:
    num_batches = _check_count("num_batches", num_batches, minimum=0)
  return PaddedBatches(source, batch_size, mask_key, pad_value, num_batches, batched)


class PaddedBatches(cabc.Iterable):
  """The iterable returned by `pad_batches`; each ``iter()`` re-reads the source.

  Attributes:
    batch_size: rows per batch.
    mask_key: top-level key of the bool ``[batch_size]`` mask.
    pad_value: the scalar or per-key dict padded rows hold.
    num_batches: the fixed number of batches, or None.
  """

  def __init__(self, source, batch_size, mask_key, pad_value, num_batches, batched):
    self.batch_size = batch_size
    self.mask_key = mask_key
    self.pad_value = pad_value
    self.num_batches = num_batches
    self._source = source
    self._fills: dict[Path, Any] = {}
    if _data_tf.is_tf_dataset(source):
      self._kind = "tf"
      self._tf = _data_tf.TfAdapter(source, batch_size, mask_key, batched)
      self._spec = self._tf.static_spec()
      _check_pad_keys(pad_value, self._tf.paths)
    elif isinstance(source, cabc.Mapping):
      self._kind = "mapping"
      self._whole = _validate(source, mask_key, where="the source")
      self._spec = _spec_of(self._whole[0])
      _check_pad_keys(pad_value, self._spec)
    elif isinstance(source, (str, bytes)) or not isinstance(source, cabc.Iterable):
      raise TypeError(
        "source must be a Mapping of arrays, an iterable of Mappings or a tf.data.Dataset; "
        f"got {type(source).__name__}"
      )
    else:
      self._kind = "iterable"
      self._spec = None
    real = None if num_batches is None else self._num_real_batches()
    if real is not None and real > num_batches:
      raise ValueError(
        f"num_batches={num_batches} but the source holds {real} batches of batch_size {batch_size}; "
        f"pass num_batches >= {real}"
      )

  def __iter__(self) -> Iterator[dict]:
    if self._kind == "tf":
      padded = self._tf.iterate(self._fill)
    else:
      flat_batches = (
        iter([self._whole]) if self._kind == "mapping" else self._validated(iter(self._source))
      )
      padded = (self._pad(flat, n) for flat, n in _rechunk(flat_batches, self.batch_size))
    return self._finish(padded)

  def __len__(self) -> int:
    if self.num_batches is not None:
      return self.num_batches
    real = self._num_real_batches()
    if real is None:
      raise TypeError(
        f"the number of batches of this {type(self._source).__name__} source is unknown; "
        "pass num_batches= to fix it"
      )
    return real

  def __repr__(self) -> str:
    return (
      f"PaddedBatches({type(self._source).__name__}, batch_size={self.batch_size}, "
      f"mask_key={self.mask_key!r}, num_batches={self.num_batches})"
    )

  def _num_real_batches(self) -> int | None:
    """Number of batches the source fills, or None when unknown without reading it."""
    if self._kind == "tf":
      rows = self._tf.num_rows()
    elif self._kind == "mapping":
      rows = self._whole[1]
    elif isinstance(self._source, cabc.Sequence):
      rows = sum(n for _, n in self._validated(iter(self._source), spec_only=True))
    else:
      rows = None
    return None if rows is None else -(-rows // self.batch_size)

  def _validated(
    self, batches: Iterator, spec_only: bool = False
  ) -> Iterator[tuple[FlatBatch, int]]:
    """Flattens and checks each batch against the first one; records the first one's spec."""
    spec = None
    for index, batch in enumerate(batches):
      flat, n = _validate(batch, self.mask_key, where=f"batch {index}", shapes_only=spec_only)
      if spec_only:
        yield flat, n
        continue
      if spec is None:
        spec = _spec_of(flat)
        if self._spec is None:
          _check_pad_keys(self.pad_value, spec)
          self._spec = spec
      else:
        _check_same_spec(spec, flat, index)
      yield flat, n

  def _fill(self, path: Path, dtype: np.dtype) -> Any:
    if path not in self._fills:
      self._fills[path] = _fill_value(self.pad_value, path, dtype)
    return self._fills[path]

  def _pad(self, flat: FlatBatch, n: int) -> FlatBatch:
    size = self.batch_size
    out = dict(flat)
    if n < size:
      for path, leaf in flat.items():
        rows = np.full((size - n,) + leaf.shape[1:], self._fill(path, leaf.dtype), dtype=leaf.dtype)
        out[path] = np.concatenate([leaf, rows])
    out[(self.mask_key,)] = np.arange(size) < n
    return out

  def _finish(self, padded: Iterator[FlatBatch]) -> Iterator[dict]:
    """Yields the real batches, then all-padding ones up to `num_batches`."""
    count, spec = 0, self._spec
    for flat in padded:
      if count == 0 and self._kind == "tf":  # real shapes replace the static spec's unknown sizes
        spec = _spec_of({p: leaf for p, leaf in flat.items() if p != (self.mask_key,)})
      if self.num_batches is not None and count == self.num_batches:
        raise ValueError(
          f"the source holds more than num_batches={self.num_batches} batches of batch_size "
          f"{self.batch_size}; pass a larger num_batches"
        )
      count += 1
      yield unflatten(flat)
    if self.num_batches is None or count == self.num_batches:
      return
    spec = (
      self._spec if spec is None else spec
    )  # an iterable's spec is known once its first batch is read
    if spec is None or any(None in shape for shape, _ in spec.values()):
      raise ValueError(
        f"num_batches={self.num_batches} needs all-padding batches, but the source was empty and its "
        "fields are unknown; pass a Mapping or a tf.data.Dataset with static shapes, or num_batches=None"
      )
    for _ in range(self.num_batches - count):
      flat = {
        path: np.full((self.batch_size,) + shape, self._fill(path, dtype), dtype=dtype)
        for path, (shape, dtype) in spec.items()
      }
      flat[(self.mask_key,)] = np.zeros(self.batch_size, dtype=bool)
      yield unflatten(flat)


def _check_count(name: str, value: Any, minimum: int) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
    raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
  return int(value)


def _validate(
  batch: Any, mask_key: str, where: str, shapes_only: bool = False
) -> tuple[FlatBatch, int]:
  """Flattens one batch to numpy leaves and returns it with its leading size."""
  if type(batch) is not dict and not isinstance(batch, cabc.Mapping):
    raise ValueError(f"{where}: expected a Mapping of arrays, got {type(batch).__name__}")
  if mask_key in batch:
    raise ValueError(
      f"{where} has a key {mask_key!r} equal to mask_key; rename it or pass another mask_key="
    )
  flat = flatten(batch, convert=not shapes_only)
  if not flat:
    raise ValueError(f"{where}: expected a Mapping with at least one array, got no arrays")
  sizes = {}
  for path, leaf in flat.items():
    shape = np.shape(leaf)
    if not shape:
      raise ValueError(
        f"{where}: key {path_name(path)} is a scalar; expected an array with a leading row dimension"
      )
    sizes[path] = shape[0]
  if len(set(sizes.values())) > 1:
    listed = ", ".join(f"{path_name(p)} has {s}" for p, s in sizes.items())
    raise ValueError(
      f"{where}: leading sizes disagree ({listed}); expected every key to have the same rows"
    )
  return flat, next(iter(sizes.values()))


def _spec_of(flat: FlatBatch) -> dict[Path, tuple[tuple, np.dtype]]:
  return {path: (leaf.shape[1:], leaf.dtype) for path, leaf in flat.items()}


def _check_same_spec(spec: dict, flat: FlatBatch, index: int) -> None:
  if flat.keys() != spec.keys():
    missing = _names(p for p in spec if p not in flat)
    extra = _names(p for p in flat if p not in spec)
    raise ValueError(
      f"batch {index}: keys changed: missing {missing}, unexpected {extra}; "
      f"expected the keys of batch 0: {_names(spec)}"
    )
  for path, (shape, dtype) in spec.items():
    leaf = flat[path]
    if tuple(np.shape(leaf)[1:]) != shape:
      raise ValueError(
        f"batch {index}: key {path_name(path)} has shape {tuple(np.shape(leaf))}; expected [rows, "
        f"{', '.join(map(str, shape))}] like batch 0"
      )
    got = leaf.dtype
    if got != dtype and not (got.kind in "US" and got.kind == dtype.kind):
      raise ValueError(
        f"batch {index}: key {path_name(path)} has dtype {got}; expected {dtype} like batch 0"
      )


def _names(paths: cabc.Iterable[Path]) -> str:
  return "[" + ", ".join(path_name(p) for p in paths) + "]"


def _rechunk(
  flat_batches: Iterator[tuple[FlatBatch, int]], size: int
) -> Iterator[tuple[FlatBatch, int]]:
  """Re-chunks batches into `size` rows, order kept; only the last may be short. Aligned full slices are views."""
  pending: list[FlatBatch] = []
  pending_rows = 0
  for flat, n in flat_batches:
    start = 0
    if pending_rows and pending_rows + n >= size:
      start = size - pending_rows
      pending.append({p: leaf[:start] for p, leaf in flat.items()})
      yield {p: np.concatenate([part[p] for part in pending]) for p in flat}, size
      pending, pending_rows = [], 0
    if start == 0 and n == size:
      yield flat, size  # passthrough: the caller's arrays, not copied
      continue
    while n - start >= size:
      yield {p: leaf[start : start + size] for p, leaf in flat.items()}, size
      start += size
    if start < n:  # copied: a source may reuse its buffers once the next batch is requested
      pending.append({p: np.array(leaf[start:]) for p, leaf in flat.items()})
      pending_rows += n - start
  if pending_rows:
    yield {p: np.concatenate([part[p] for part in pending]) for p in pending[0]}, pending_rows


def _check_pad_keys(pad_value: Any, leaf_paths: cabc.Iterable[Path]) -> None:
  """Rejects per-key pad values for keys the source does not have."""
  if not isinstance(pad_value, cabc.Mapping):
    return
  known = set()
  for path in leaf_paths:
    known.update(path[:i] for i in range(1, len(path) + 1))
  for path in flatten(pad_value, convert=False):
    if path not in known:
      raise ValueError(
        f"pad_value has key {path_name(path)}, which the source does not have; "
        f"expected keys among {_names(sorted(known))}"
      )


def _fill_value(pad_value: Any, path: Path, dtype: np.dtype) -> Any:
  """The scalar that pads leaf `path` of `dtype`, checked to fit the dtype."""
  value = pad_value
  for key in path:
    if not isinstance(value, cabc.Mapping):
      break
    value = value.get(key, 0)
  if isinstance(value, cabc.Mapping):
    raise ValueError(f"pad_value for key {path_name(path)} is a dict; expected a scalar")
  if dtype.kind in _STRING_KINDS:
    if isinstance(value, (str, bytes)):
      return value
    return "" if dtype.kind == "U" else b""
  where = f"pad_value {value!r} for key {path_name(path)}"
  if isinstance(value, (str, bytes)):
    raise ValueError(f"{where} is a string; expected a number for dtype {dtype}")
  try:
    fill = np.array(value, dtype=dtype)
  except (ValueError, OverflowError, TypeError) as err:
    raise ValueError(f"{where} does not fit dtype {dtype} ({err}); pass a per-key dict") from None
  if dtype.kind in "biu" and fill != value:
    raise ValueError(f"{where} is not exactly representable in dtype {dtype}; pass a per-key dict")
  return fill[()]
