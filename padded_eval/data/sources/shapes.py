"""``pad_batches(..., pad_shapes=...)``: variable-length axes padded to fixed sizes, so every batch has one shape.

A `ShapeFitter` pads the trailing axes of chosen keys of each source chunk to fixed sizes with the key's pad value
(the same ``pad_value`` that fills padded rows), before the chunk is checked against the first one. Ragged rows (a
list of sequences of different lengths) are stacked the same way. Columns beyond a fixed size that hold only the
pad value (a pipeline that padded further, e.g. tf.data's ``padded_batch`` to a longer row) are dropped; a row with
other values there raises. Optionally each padded key gets a lengths field: int32 ``[rows]``.

Length buckets: an axis given a list of sizes (``{"tokens": ([16, 32, 60],)}``) is padded to the largest in each
chunk, so that chunks join as before, and each chunk carries the rows' extents along it in a hidden leaf
(`EXTENT_KEY`); once a batch of ``batch_size`` rows is made, `ShapeFitter.bucketed` cuts the axis to the smallest
size that holds the batch's longest row and drops the hidden leaves. Only padding is cut, so every batch holds its
rows as without buckets, in one of a few shapes.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
from typing import Any

import numpy as np

from padded_eval.data._batch_spec import BatchSpec, FlatBatch, LeafSpec, Path
from padded_eval.data._tree import fill_value, flatten, path_name, unflatten
from padded_eval.data.sources.array_like import to_numpy

__all__ = ["EXTENT_KEY", "LENGTH_DTYPE", "ShapeFitter"]

LENGTH_DTYPE = np.int32
EXTENT_KEY = "__padded_eval_extents__"
"""Top-level key of the hidden per-row extents of bucketed axes (dropped before a batch is yielded)."""
Sizes = tuple[int | None, ...]  # the trailing axes of one key; None keeps an axis as it comes
Buckets = tuple[int, ...]  # the sizes one axis may take, ascending


@dataclasses.dataclass(frozen=True)
class BucketAxis:
  """One bucketed axis: the key, the axis's position among the key's `sizes`, and its sizes (ascending)."""

  path: Path
  position: int
  sizes: Buckets

  def smallest_holding(self, extent: int) -> int:
    """The smallest size that holds `extent` positions (`fit` refused longer rows)."""
    return next((size for size in self.sizes if size >= extent), self.sizes[-1])


@dataclasses.dataclass(frozen=True)
class ShapeFitter:
  """Pads (or trims padding from) trailing axes of some keys to fixed sizes.

  Attributes:
    sizes: ``{path: sizes of the last len(sizes) axes of a row}``; None keeps an axis.
    pad_value: what padded positions hold: a scalar, or a per-key dict (see `BatchSpec.fills`).
    length_keys: ``{path: top-level key}``: where each row's length along the key's first fixed axis goes.
    buckets: the bucketed axes, whose `sizes` entry is their largest size; each batch is cut to the smallest
      size that holds its longest row (`bucketed`).
  """

  sizes: dict[Path, Sizes]
  pad_value: Any = 0
  length_keys: dict[Path, str] = dataclasses.field(default_factory=dict)
  buckets: tuple[BucketAxis, ...] = ()

  @classmethod
  def create(
    cls, pad_shapes: Any, length_keys: Any, pad_value: Any, reserved: cabc.Collection[str]
  ) -> ShapeFitter | None:
    """Checks ``pad_batches``' `pad_shapes` and `length_keys`; None when there is nothing to pad.

    Args:
      pad_shapes: None, or a dict (nested like the source) of per-key tuples of trailing axis sizes; a size may
        be a list of sizes (length buckets).
      length_keys: None, or a dict ``{key in pad_shapes: new top-level key}``.
      pad_value: ``pad_batches``' `pad_value`.
      reserved: top-level keys taken by ``pad_batches`` (the mask, the row ids).

    Raises:
      ValueError: a `pad_shapes` that is not a dict of tuples of positive ints or lists of them (or None);
        `length_keys` that name a key not in `pad_shapes`, or a new key that is reserved, repeated or not a
        string.
    """
    if pad_shapes is None and not length_keys:
      return None
    if not isinstance(pad_shapes, cabc.Mapping):
      raise ValueError(
        f"pad_shapes must be a dict of trailing axis sizes, e.g. {{'inputs': (60,)}}; got {pad_shapes!r}"
      )
    sizes, buckets = {}, []
    for path, value in flatten(pad_shapes, False).items():
      sizes[path], axes = _checked_sizes(path, value)
      buckets.extend(BucketAxis(path, position, axis) for position, axis in axes.items())
    lengths = {}
    for path, key in flatten(length_keys or {}, False).items():
      if path not in sizes:
        raise ValueError(
          f"length_keys has key {path_name(path)}, which pad_shapes does not pad; expected keys among "
          f"{_names(sizes)}"
        )
      if not isinstance(key, str) or key in reserved or key in lengths.values():
        raise ValueError(
          f"length_keys[{path_name(path)}] is {key!r}; expected a new top-level key (a string other than "
          f"{sorted(reserved)} and the other length keys)"
        )
      if all(size is None for size in sizes[path]):
        raise ValueError(f"length_keys[{path_name(path)}]: pad_shapes fixes no axis of that key")
      lengths[path] = key
    return cls(sizes, pad_value, lengths, tuple(buckets))

  def check_spec(self, spec: BatchSpec) -> None:
    """Checks the keys and ranks against a source's row spec (sizes may be unknown).

    Raises:
      ValueError: a key the source does not have, a key with fewer axes than its sizes, or a lengths key the
        source already has.
    """
    for path, sizes in self.sizes.items():
      leaf = spec.leaves.get(path)
      if leaf is None:
        raise ValueError(
          f"pad_shapes has key {path_name(path)}, which the source does not have; expected keys among "
          f"{_names(spec.leaves)}"
        )
      if len(leaf.shape) < len(sizes):
        raise ValueError(_rank_message(path, leaf.shape, sizes))
    self.check_new_keys(spec.leaves)

  def check_new_keys(self, paths: cabc.Iterable[Path]) -> None:
    """Raises ValueError if a source key (`paths`) takes the top-level key of a lengths field."""
    paths = list(paths)
    for padded, key in self.length_keys.items():
      if any(path[0] == key for path in paths):
        raise ValueError(
          f"length_keys[{path_name(padded)}] is {key!r}, a key the source already has (its values would be "
          f"overwritten by the lengths); expected a new top-level key, e.g. '{padded[-1]}_length', or rename "
          "the source's key"
        )

  def fixed_spec(self, spec: BatchSpec) -> BatchSpec:
    """A source's row spec with the fixed sizes in place (a bucketed axis at its smallest size: the shape of
    all-padding batches), the lengths fields, and no hidden extents."""
    leaves = {path: leaf for path, leaf in spec.leaves.items() if path[0] != EXTENT_KEY}
    smallest = {(axis.path, axis.position): axis.sizes[0] for axis in self.buckets}
    for path, sizes in self.sizes.items():
      if path in leaves:
        leaf = leaves[path]
        head, tail = (
          leaf.shape[: len(leaf.shape) - len(sizes)],
          leaf.shape[len(leaf.shape) - len(sizes) :],
        )
        sizes = tuple(smallest.get((path, p), size) for p, size in enumerate(sizes))
        fixed = tuple(old if new is None else new for old, new in zip(tail, sizes))
        leaves[path] = LeafSpec(head + fixed, leaf.dtype)
    for key in self.length_keys.values():
      leaves[(key,)] = LeafSpec((), np.dtype(LENGTH_DTYPE))
    return dataclasses.replace(spec, leaves=leaves)

  def pad_values(self, spec: BatchSpec) -> dict:
    """Per-leaf pad values for batches of `spec` (a fitted row spec): `pad_value`'s, and 0 for lengths.

    Raises:
      ValueError: a `pad_value` that does not fit a leaf (see `BatchSpec.fills`).
    """
    lengths = {(key,) for key in self.length_keys.values()}
    lengths.update(path for path in spec.leaves if path[0] == EXTENT_KEY)  # hidden extents: 0 too
    source = BatchSpec({path: leaf for path, leaf in spec.leaves.items() if path not in lengths})
    fills = source.fills(self.pad_value)
    fills.update({path: LENGTH_DTYPE(0) for path in lengths})
    return unflatten(fills)

  def fit(self, flat: FlatBatch, first_row: int = 0) -> FlatBatch:
    """One chunk with the keys of `sizes` padded to their fixed sizes (and the lengths fields added).

    Args:
      flat: ``{path: leaf [rows, ...]}``: numpy arrays or array-likes; a padded key may also be ragged (a list
        or 1-D object array of per-row sequences).
      first_row: the chunk's first row in the source, for messages.

    Returns:
      The chunk with numpy leaves ``[rows, ..., *fixed sizes]`` for those keys (others unchanged).

    Raises:
      ValueError: a key the chunk does not have, too few axes, a row longer than a fixed size (naming the key,
        the row and both lengths), ragged rows whose other axes differ, or a lengths key the chunk already has.
    """
    if self.length_keys:
      self.check_new_keys(flat)
    out = dict(flat)
    for path, sizes in self.sizes.items():
      if path not in flat:
        raise ValueError(
          f"pad_shapes has key {path_name(path)}, which the source's batches do not have; expected keys "
          f"among {_names(flat)}"
        )
      rows = _ragged_rows(flat[path])
      if rows is None:
        out[path], lengths = self._padded(path, to_numpy(flat[path]), sizes, first_row)
      else:
        out[path], lengths = self._stacked(path, rows, sizes, first_row)
      if path in self.length_keys:
        out[(self.length_keys[path],)] = lengths
    for index, axis in enumerate(self.buckets):
      out[(EXTENT_KEY, str(index))] = self._extents(axis, flat[axis.path], out[axis.path])
    return out

  def _extents(self, axis: BucketAxis, given: Any, padded: np.ndarray) -> np.ndarray:
    """Per row of a chunk, its extent along bucketed `axis`: a ragged row's size, else 1 + the last position
    holding a value other than the pad value (as `length_keys` reads it)."""
    position = padded.ndim - len(self.sizes[axis.path]) + axis.position
    rows = _ragged_rows(given)
    if rows is not None:
      return np.array([row.shape[position - 1] for row in rows], np.int64)
    fill = fill_value(self.pad_value, axis.path, padded.dtype)
    return _extents(padded, position, fill)

  def bucketed(self, batch: FlatBatch) -> FlatBatch:
    """A padded batch with each bucketed axis cut to the smallest size holding its longest row, and the hidden
    extents dropped (a batch without buckets is returned as it is)."""
    if not self.buckets:
      return batch
    cuts: dict[Path, list] = {}
    for index, axis in enumerate(self.buckets):
      extents = batch.pop((EXTENT_KEY, str(index)))
      longest = int(extents.max()) if extents.size else 0
      leaf = batch[axis.path]
      cut = cuts.setdefault(axis.path, [slice(None)] * leaf.ndim)
      cut[leaf.ndim - len(self.sizes[axis.path]) + axis.position] = slice(
        0, axis.smallest_holding(longest)
      )
    for path, cut in cuts.items():
      batch[path] = batch[path][tuple(cut)]
    return batch

  def shown(self, path: Path) -> tuple:
    """The `pad_shapes` value of `path` as given (a bucketed axis as its list of sizes), for messages."""
    shown: list = list(self.sizes[path])
    for axis in self.buckets:
      if axis.path == path:
        shown[axis.position] = list(axis.sizes)
    return tuple(shown)

  def bucket_axes(self) -> dict[Path, tuple[int, ...]]:
    """``{path: axes}`` whose sizes vary between batches (counted from the end of a row's shape: -1 the last)."""
    axes: dict[Path, tuple[int, ...]] = {}
    for axis in self.buckets:
      axes[axis.path] = axes.get(axis.path, ()) + (axis.position - len(self.sizes[axis.path]),)
    return axes

  def _padded(self, path: Path, leaf: np.ndarray, sizes: Sizes, first_row: int):
    """A rectangular leaf ``[rows, ...]`` padded or trimmed to `sizes`; and its lengths."""
    if leaf.ndim - 1 < len(sizes):
      raise ValueError(_rank_message(path, leaf.shape[1:], sizes))
    fill = fill_value(self.pad_value, path, leaf.dtype)
    first_axis = leaf.ndim - len(sizes)
    lengths = None
    if path in self.length_keys:
      lengths = _extents(leaf, _first_fixed_axis(sizes, first_axis), fill).astype(LENGTH_DTYPE)
    for axis, size in enumerate(sizes, start=first_axis):
      if size is None or leaf.shape[axis] <= size:
        continue
      extents = _extents(leaf, axis, fill)
      longer = np.flatnonzero(extents > size)
      if longer.size:
        row = int(longer[0])
        raise ValueError(
          _long_message(path, first_row + row, int(extents[row]), axis - 1, self.shown(path))
        )
      leaf = leaf[(slice(None),) * axis + (slice(0, size),)]  # only padding is cut
    target = leaf.shape[:first_axis] + tuple(
      leaf.shape[axis] if size is None else size for axis, size in enumerate(sizes, first_axis)
    )
    if target != leaf.shape:
      padded = np.full(target, fill, dtype=leaf.dtype)
      padded[tuple(slice(0, n) for n in leaf.shape)] = leaf
      leaf = padded
    return leaf, lengths

  def _stacked(self, path: Path, rows: list, sizes: Sizes, first_row: int):
    """Ragged rows (each an array ``[length, ...]``) stacked at `sizes`; and their lengths."""
    # the rows' values decide: an empty row (``[]`` reads as float64) holds none
    dtype = (
      np.result_type(*([row for row in rows if row.size] or rows)) if rows else np.dtype(np.float32)
    )
    fill = fill_value(self.pad_value, path, dtype)
    ranks = {row.ndim for row in rows}
    if len(ranks) > 1 or (rows and rows[0].ndim < len(sizes)):
      raise ValueError(
        f"key {path_name(path)} holds ragged rows of ranks {sorted(ranks)}; expected every row to have "
        f"the same rank, at least {len(sizes)} (pad_shapes {sizes}){_buckets_hint(sizes)}"
      )
    rank = rows[0].ndim if rows else len(sizes)
    first_axis = rank - len(sizes)
    row_shape = []
    for axis in range(rank):
      size = sizes[axis - first_axis] if axis >= first_axis else None
      if size is not None:
        row_shape.append(size)
        continue
      kept = {row.shape[axis] for row in rows}
      if len(kept) > 1:
        raise ValueError(
          f"key {path_name(path)}: ragged rows differ along axis {axis} ({sorted(kept)}), which pad_shapes "
          f"does not fix; expected one size, or a size in pad_shapes {sizes}"
        )
      row_shape.append(kept.pop() if kept else 0)
    stacked = np.full((len(rows), *row_shape), fill, dtype=dtype)
    for index, row in enumerate(rows):
      for axis, size in enumerate(row_shape):
        if row.shape[axis] > size:
          raise ValueError(
            _long_message(path, first_row + index, row.shape[axis], axis, self.shown(path))
          )
      stacked[(index, *(slice(0, n) for n in row.shape))] = row
    lengths = None
    if path in self.length_keys:
      axis = _first_fixed_axis(sizes, first_axis) - 1
      lengths = np.array([row.shape[axis] for row in rows], dtype=LENGTH_DTYPE)
    return stacked, lengths


def _names(paths: cabc.Iterable[Path]) -> str:
  return "[" + ", ".join(path_name(p) for p in paths) + "]"


def _is_size(size: Any) -> bool:
  """Whether `size` is an int >= 1 (a numpy integer too; not a bool)."""
  return isinstance(size, (int, np.integer)) and not isinstance(size, bool) and bool(size >= 1)


def _checked_sizes(path: Path, value: Any) -> tuple[Sizes, dict[int, Buckets]]:
  """``(sizes, {position: bucket sizes})`` of one key's `pad_shapes` value; a bucketed axis's size is its largest.

  Raises:
    ValueError: naming `pad_shapes` and the key, what came and what is expected.
  """
  if _is_size(value):
    value = (value,)
  ok = isinstance(value, (tuple, list)) and value
  ok = ok and all(size is None or _is_size(size) or isinstance(size, list) for size in value)
  if not ok:
    raise ValueError(
      f"pad_shapes[{path_name(path)}] is {value!r}; expected a tuple of sizes >= 1 (or None to keep an axis, or "
      "a list of sizes: length buckets) for the key's last axes, e.g. (60,) or ([16, 32, 60],)"
    )
  buckets = {}
  for position, size in enumerate(value):
    if not isinstance(size, list):
      continue
    if not size or not all(_is_size(s) for s in size) or sorted(set(size)) != list(size):
      raise ValueError(
        f"pad_shapes[{path_name(path)}] has buckets {size!r} for its axis {position}; expected a non-empty "
        "list of distinct sizes >= 1 in ascending order, e.g. [16, 32, 60]: each batch is padded to the "
        "smallest that holds its longest row"
      )
    buckets[position] = tuple(int(s) for s in size)
  sizes = tuple(
    None if size is None else buckets[p][-1] if p in buckets else int(size)
    for p, size in enumerate(value)
  )
  return sizes, buckets


def _ragged_rows(leaf: Any) -> list[np.ndarray] | None:
  """The rows of a ragged leaf (a list of sequences of different shapes, or a 1-D object array), else None."""
  if isinstance(leaf, np.ndarray):
    if leaf.dtype != object or leaf.ndim != 1 or not all(np.ndim(x) for x in leaf):
      return None
    return [np.asarray(x) for x in leaf]
  if not isinstance(leaf, (list, tuple)):
    return None
  rows = [to_numpy(x) for x in leaf]
  return rows if len({row.shape for row in rows}) > 1 else None


def _extents(leaf: np.ndarray, axis: int, fill: Any) -> np.ndarray:
  """Per row: 1 + the last position along `axis` whose values are not all `fill` (0 if none)."""
  if leaf.shape[axis] == 0 or leaf.shape[0] == 0:
    return np.zeros(leaf.shape[0], np.int64)
  if isinstance(fill, (float, np.floating)) and np.isnan(fill):
    real = ~np.isnan(leaf)
  else:
    real = leaf != fill
  flags = np.moveaxis(np.asarray(real), axis, 1).reshape(leaf.shape[0], leaf.shape[axis], -1)
  real = np.asarray(flags.any(axis=2))  # bool [rows, positions]
  last = leaf.shape[axis] - np.argmax(real[:, ::-1], axis=1)
  return np.where(real.any(axis=1), last, 0)


def _first_fixed_axis(sizes: Sizes, first_axis: int) -> int:
  return first_axis + next(i for i, size in enumerate(sizes) if size is not None)


def _rank_message(path: Path, row_shape: tuple, sizes: Sizes) -> str:
  return (
    f"pad_shapes[{path_name(path)}] = {sizes} names {len(sizes)} trailing axes, but the key's rows have shape "
    f"{tuple(row_shape)}; expected at most {len(row_shape)} sizes{_buckets_hint(sizes)}"
  )


def _buckets_hint(sizes: Sizes) -> str:
  """For several sizes given where a row has fewer axes: how length buckets of one axis are written."""
  if len(sizes) < 2 or None in sizes:
    return ""
  return f" (length buckets of one axis are a list inside the tuple: ({list(sizes)},))"


def _long_message(path: Path, row: int, length: int, axis: int, sizes: tuple) -> str:
  return (
    f"row {row} of the source has length {length} along axis {axis} of key {path_name(path)}, longer than "
    f"pad_shapes[{path_name(path)}] = {sizes}; pass a larger size (the longest row; with buckets, a larger last one), or filter or truncate "
    "such rows before pad_batches"
  )
