"""The structure, per-row shapes and dtypes of batches: one spec for data, driver and multi-host code.

A batch is a dict (nested dicts allowed) of arrays with a leading row axis. Flat views key each leaf by its path,
``{("features", "image"): leaf}``. A `BatchSpec` records, for every leaf path, the shape of one row and the dtype;
the spec of a padded batch also records its size ``B`` and the key of its bool ``[B]`` mask. It checks batches
against the first one with the contract's ValueErrors, travels as JSON between processes, and builds all-padding
batches. With ``masked_eval(mask_fn=...)`` a padded batch may be any pytree (a jraph ``GraphsTuple``) whose
leaves share the leading size ``B``; its spec keeps the `mask_fn` instead of a mask key. The flat views and the
per-leaf helpers live in `padded_eval.data._tree`. See docs/architecture.md for where it sits in the data flow.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
from typing import Any, cast

import numpy as np

from padded_eval.data._tree import (
  FlatBatch,
  Index,
  Path,
  check_key_kinds,
  check_mask_fn_result,
  fill_value,
  flatten,
  leaf_dtype,
  mapping_paths,
  pad_shapes_hint,
  path_name,
  row_leaves,
  tree_leaves,
  unflatten,
)
from padded_eval.validation import check_divisible

__all__ = [
  "BatchSpec",
  "checked_batches",
  "FlatBatch",
  "LeafSpec",
  "Path",
]

_RECOMPILES = (
  "Every batch needs the same shapes (pad with pe.pad_batches), else the step recompiles."
)


def _names(paths: cabc.Iterable[Path]) -> str:
  return "[" + ", ".join(path_name(p) for p in paths) + "]"


# --- the spec ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LeafSpec:
  """One leaf: the shape of one row (None where unknown) and the dtype."""

  shape: tuple[int | None, ...]
  dtype: np.dtype


@dataclasses.dataclass(frozen=True)
class BatchSpec:
  """Leaf paths with per-row shapes and dtypes; for a padded batch also its size and mask key.

  Attributes:
    leaves: ``{path: LeafSpec}`` of every leaf but the mask (compared without regard to order).
    batch_size: rows per batch ``B``; None for the spec of a source's rows (any number of rows).
    mask_key: top-level key of the bool ``[B]`` mask; None for the spec of a source's rows.
    structure: the pytree structure (containers) of a padded batch from `from_batch`, else None; not compared.
    mask_fn: the ``masked_eval(mask_fn=...)`` of a padded pytree batch (then `mask_key` is None), else None;
      not compared.
    varying: ``{path: axes}`` (counted from the end of a row's shape) whose sizes may differ between batches:
      the length buckets of ``pe.pad_batches(..., pad_shapes=...)`` (see `varying_in`); their sizes read as
      None. Not compared.
  """

  leaves: dict[Path, LeafSpec]
  batch_size: int | None = None
  mask_key: str | None = None
  structure: Any = dataclasses.field(default=None, compare=False, repr=False)
  mask_fn: Any = dataclasses.field(default=None, compare=False, repr=False)
  varying: Any = dataclasses.field(default=None, compare=False, repr=False)

  @classmethod
  def of_rows(cls, flat: FlatBatch, unknown_rows: bool = False) -> BatchSpec:
    """The spec of a flat source batch (checked by `flatten_rows`); `batch_size` is its row count.

    Args:
      flat: ``{path: array [rows, ...]}``.
      unknown_rows: leave `batch_size` None (a spec for any number of rows).
    """
    check_key_kinds(flat, beside_mask=True)  # its batches hold the mask under a string key
    leaves = {
      path: LeafSpec(tuple(np.shape(leaf)[1:]), leaf_dtype(leaf)) for path, leaf in flat.items()
    }
    rows = None if unknown_rows or not flat else np.shape(next(iter(flat.values())))[0]
    return cls(leaves, rows)

  @classmethod
  def from_batch(
    cls,
    batch: Any,
    mask_key: str | None = "mask",
    index: int = 0,
    allow_strings: bool = False,
    mask_fn: Any = None,
  ) -> BatchSpec:
    """Checks a padded batch (the input contract of `masked_eval`) and returns its spec.

    Args:
      batch: a dict (any pytree below it) of arrays ``[B, ...]`` with ``batch[mask_key]``: bool ``[B]``; with
        `mask_fn`, any pytree (a jraph ``GraphsTuple``, a tuple, ...) whose every leaf is ``[B, ...]``.
      mask_key: top-level key of the mask (unused with `mask_fn`).
      index: the batch's position, for messages.
      allow_strings: accept string/bytes leaves (they cannot go to a device).
      mask_fn: ``mask_fn(batch) -> bool [B, ...]``, the real elements of a pytree batch; called here on the
        host, on batch 0 only (`check` does not call it).

    Returns:
      The spec, with ``batch_size = B`` and `mask_key` (with `mask_fn`: `mask_key` None, `mask_fn` kept).

    Raises:
      ValueError: not a Mapping, no `mask_key`, a mask that is not bool ``[B]``, a leaf whose leading size is
        not ``B``, or (unless `allow_strings`) a string leaf; with `mask_fn`: no leaf, leading sizes that
        disagree, or (batch 0) a `mask_fn` result that is not bool ``[B, ...]``.
    """
    import jax  # deferred: the data layer is usable without touching JAX

    if mask_fn is not None:
      leaves, batch_size, structure = tree_leaves(batch, index, allow_strings)
      if index == 0:
        check_mask_fn_result(mask_fn(batch), batch_size, index)
      leaves = {path: LeafSpec(shape, dtype) for path, (shape, dtype) in leaves.items()}
      return cls(leaves, batch_size, None, structure, mask_fn)
    if not isinstance(batch, cabc.Mapping):
      raise ValueError(
        f"batch {index} is a {type(batch).__name__}; expected a dict of arrays with a "
        f"{mask_key!r} entry (use pe.pad_batches), or, for another pytree (a jraph GraphsTuple), "
        "masked_eval(..., mask_fn=...) giving its real elements"
      )
    if mask_key not in batch:
      raise ValueError(
        f"batch {index} has no mask key {mask_key!r}; got keys {sorted(map(str, batch))}. "
        "Pad batches with pe.pad_batches, which adds the mask of real rows."
      )
    mask_shape, mask_dtype = np.shape(batch[mask_key]), leaf_dtype(batch[mask_key])
    if len(mask_shape) != 1 or mask_dtype != np.bool_:
      raise ValueError(
        f"batch {index}: {mask_key!r} has shape {mask_shape} and dtype {mask_dtype}; "
        "expected a bool array [batch_size]"
      )
    batch_size = mask_shape[0]
    if index == 0:  # later batches are compared with the first one's structure
      check_key_kinds(mapping_paths(batch), index=index)
    try:
      flat, structure = jax.tree_util.tree_flatten_with_path(batch)
    except ValueError:
      # a later batch's dict keys JAX cannot sort: named here, not as JAX's comparator error
      check_key_kinds(mapping_paths(batch), index=index)
      raise
    named = ("key", f", the size of {mask_key!r}")
    rows = row_leaves(flat, _spec_key, batch_size, index, allow_strings, named)
    leaves = {path: LeafSpec(*row) for path, row in rows.items() if path != (mask_key,)}
    return cls(leaves, batch_size, mask_key, structure)

  # --- comparing batches --------------------------------------------------------------------------------------

  def check(self, batch: Any, index: int) -> BatchSpec:
    """Checks padded batch `index` against this spec (the first batch's); returns the batch's spec.

    Raises:
      ValueError: any `from_batch` error, or a batch size, key, shape or dtype that differs (see `check_same`).
    """
    spec = BatchSpec.from_batch(batch, self.mask_key or "mask", index, mask_fn=self.mask_fn)
    self.check_same(spec.varying_in(self.varying), index)
    return spec

  def varying_in(self, axes: dict[Path, tuple[int, ...]] | None) -> BatchSpec:
    """This spec with the sizes of `axes` (``{path: axes counted from the end of a row}``, a length bucket's)
    read as None, so that batches of different buckets compare equal; the spec itself when `axes` is empty."""
    if not axes:
      return self
    leaves = dict(self.leaves)
    for path, free in axes.items():
      leaf = leaves.get(path)
      if leaf is not None:
        shape = list(leaf.shape)
        for axis in free:
          if -len(shape) <= axis < 0:
            shape[axis] = None
        leaves[path] = LeafSpec(tuple(shape), leaf.dtype)
    return dataclasses.replace(self, leaves=leaves, varying=axes)

  def check_same(self, other: BatchSpec, index: int) -> None:
    """Raises unless `other` (the spec of batch `index`) has this spec's keys, row shapes and dtypes.

    Row counts are compared only when this is a padded batch's spec (`is_padded`), containers only when both
    specs know their `structure`. String dtypes of one kind may differ in length.

    Raises:
      ValueError: naming the batch, the key, what came and what was expected.
    """
    if self.is_padded and other.batch_size != self.batch_size:
      raise ValueError(
        f"batch {index} has batch size {other.batch_size} (keys {_shapes(other)}); expected the first "
        f"batch's {self.batch_size} rows ({_shapes(self)}). {_RECOMPILES}"
      )
    if other.leaves.keys() != self.leaves.keys():
      missing = _names(p for p in self.leaves if p not in other.leaves)
      extra = _names(p for p in other.leaves if p not in self.leaves)
      raise ValueError(
        f"batch {index}: keys changed: missing {missing}, unexpected {extra}; "
        f"expected the keys of batch 0: {_names(self.leaves)}{self._hint()}"
      )
    for path, want in self.leaves.items():
      got = other.leaves[path]
      if got.shape != want.shape:
        rows = str(self.batch_size) if self.is_padded else "rows"
        raise ValueError(
          f"batch {index}: key {path_name(path)} has shape {other._full_shape(path)}; expected "
          f"[{', '.join(map(str, (rows, *want.shape)))}] like batch 0"
          + (pad_shapes_hint(path, got.shape, want.shape) or self._hint())
        )
      if got.dtype != want.dtype and not (
        got.dtype.kind in "US" and got.dtype.kind == want.dtype.kind
      ):
        raise ValueError(
          f"batch {index}: key {path_name(path)} has dtype {got.dtype}; expected {want.dtype} "
          f"like batch 0{self._hint()}"
        )
    known = self.structure is not None and other.structure is not None
    if known and other.structure != self.structure:
      raise ValueError(
        f"batch {index} has structure {other.structure}; expected the first batch's "
        f"{self.structure}{self._hint()}"
      )

  def check_rows(self, flat: FlatBatch, index: int) -> None:
    """`check_same` for flat source batch `index` (numpy leaves ``[rows, ...]``), fast when nothing changed.

    Raises:
      ValueError: as `check_same`.
    """
    leaves = self.leaves
    if len(flat) == len(leaves):
      for path, leaf in flat.items():
        want = leaves.get(path)
        if want is None or leaf.shape[1:] != want.shape or leaf.dtype != want.dtype:
          break
      else:
        return
    self.check_same(BatchSpec.of_rows(flat), index)

  def _hint(self) -> str:
    return ". " + _RECOMPILES if self.is_padded else ""

  def _full_shape(self, path: Path) -> tuple:
    return (self.batch_size, *self.leaves[path].shape)

  def check_divisible(self, num_shards: int, where: str | None = None) -> None:
    """Raises unless the batch size splits evenly into `num_shards` parts.

    Args:
      num_shards: how many parts the rows are split into (devices, or shards of a mesh axis).
      where: how the message names them; default ``"the {num_shards} devices"``.

    Raises:
      ValueError: ``batch size B is not divisible by ...``, with the nearest multiples and the
        ``pe.pad_batches`` call that gives one.
    """
    where = f"the {num_shards} devices" if where is None else where
    hint = f" (pe.pad_batches(..., num_devices={num_shards}))"
    assert self.batch_size is not None  # a checked batch's rows
    check_divisible("batch size", self.batch_size, num_shards, where, hint)

  @property
  def is_padded(self) -> bool:
    """Whether this is a padded batch's spec (a mask key, or a `mask_fn`), not a source's rows."""
    return self.mask_key is not None or self.mask_fn is not None

  def padded_to(self, batch_size: int, mask_key: str) -> BatchSpec:
    """The spec of batches of `batch_size` of these rows with a mask at `mask_key`."""
    return dataclasses.replace(self, batch_size=batch_size, mask_key=mask_key)

  @property
  def has_unknown_sizes(self) -> bool:
    """Whether some row shape is not fully known (a tf.data static spec)."""
    return any(None in leaf.shape for leaf in self.leaves.values())

  # --- JSON, for the multi-host pre-flight ---------------------------------------------------------------------

  def to_json(self) -> dict:
    """A JSON-ready dict (key paths as lists of strings, sorted; dtypes as ``np.dtype.str``)."""
    leaves = [
      [[_json_key(key) for key in path], list(leaf.shape), leaf.dtype.str]
      for path, leaf in self.leaves.items()
    ]
    leaves.sort(key=lambda item: [(type(key) is int, key) for key in item[0]])
    return {"batch_size": self.batch_size, "mask_key": self.mask_key, "leaves": leaves}

  @classmethod
  def from_json(cls, data: dict) -> BatchSpec:
    """Inverse of `to_json` (dict keys come back as strings, a tuple's positions as `Index` keys)."""
    leaves = {
      tuple(Index(key) if type(key) is int else key for key in path): LeafSpec(
        tuple(shape), np.dtype(dtype)
      )
      for path, shape, dtype in data["leaves"]
    }
    return cls(leaves, data["batch_size"], data["mask_key"])

  def difference(self, reference: BatchSpec) -> str | None:
    """The first difference from `reference` in words, or None if there is none."""
    if self.mask_key != reference.mask_key:
      return f"mask key {self.mask_key!r}, expected {reference.mask_key!r}"
    if self.batch_size != reference.batch_size:
      return f"batch size {self.batch_size}, expected {reference.batch_size}"
    missing = sorted(map(_plain, reference.leaves.keys() - self.leaves.keys()))
    extra = sorted(map(_plain, self.leaves.keys() - reference.leaves.keys()))
    if missing or extra:
      return f"keys differ: missing {missing}, unexpected {extra}"
    for path in self.leaves:
      got, want = self.leaves[path], reference.leaves[path]
      shape, ref_shape = self._full_shape(path), reference._full_shape(path)
      if (shape, got.dtype) != (ref_shape, want.dtype):
        return (
          f"leaf {_plain(path)!r} has shape {shape} dtype {got.dtype.name}, expected shape "
          f"{ref_shape} dtype {want.dtype.name}"
        )
    return None

  # --- padding ------------------------------------------------------------------------------------------------

  def check_pad_keys(self, pad_value: Any) -> None:
    """Rejects a per-key `pad_value` dict naming a key (or group of keys) this spec does not have.

    Raises:
      ValueError: naming the unknown key and the known ones.
    """
    if not isinstance(pad_value, cabc.Mapping):
      return
    known = set()
    for path in self.leaves:
      known.update(path[:i] for i in range(1, len(path) + 1))
    for path in flatten(pad_value, convert=False, tuples=True):
      if path not in known:
        raise ValueError(
          f"pad_value has key {path_name(path)}, which the source does not have; "
          f"expected keys among {_names(sorted(known, key=str))}"
        )

  def fills(self, pad_value: Any = 0) -> dict[Path, Any]:
    """The scalar each leaf's padded rows hold, checked to fit the leaf's dtype.

    Args:
      pad_value: a scalar for every leaf, or a dict nested like the batch of per-key scalars (a key names a leaf
        or a group; missing keys pad with 0). String/bytes leaves pad with empty strings unless given a string.

    Returns:
      ``{path: numpy scalar (or str/bytes)}``.

    Raises:
      ValueError: an unknown key, a dict where a scalar belongs, a string for a number, or a value that does not
        fit (or is not exactly representable in) the leaf's dtype.
    """
    self.check_pad_keys(pad_value)
    return {path: fill_value(pad_value, path, leaf.dtype) for path, leaf in self.leaves.items()}

  def padding_batch(self, pad_value: Any = 0, batch_size: int | None = None) -> dict:
    """An all-padding batch: every leaf ``[B, *row shape]`` filled per `fills`, and the mask all False.

    Args:
      pad_value: as in `fills`.
      batch_size: ``B``; default this spec's.

    Returns:
      A nested dict batch with ``batch[mask_key]`` (``"mask"`` when this spec has none) bool ``[B]`` all False.

    Raises:
      ValueError: no batch size, a row shape not fully known, or a bad `pad_value` (see `fills`).
    """
    size = self.batch_size if batch_size is None else batch_size
    if size is None or self.has_unknown_sizes:
      raise ValueError(
        f"an all-padding batch needs known sizes; got batch size {size} and row shapes {_shapes(self)}"
      )
    fills = self.fills(pad_value)
    flat = {
      path: np.full((size, *cast(tuple[int, ...], leaf.shape)), fills[path], dtype=leaf.dtype)
      for path, leaf in self.leaves.items()
    }
    flat[(self.mask_key or "mask",)] = np.zeros(size, dtype=bool)
    return unflatten(flat)


def _spec_key(key: Any) -> Any:
  """One key of a padded batch's JAX key path in a spec: a dict key as it is, a tuple's position as `Index`
  (so that `padding_batch` gives the tuple back, from JSON too), another key (an attribute) as JAX's."""
  if hasattr(key, "key"):
    return key.key
  if hasattr(key, "idx"):
    return Index(key.idx)
  return key


def _json_key(key: Any) -> Any:
  """A spec key in JSON: a tuple's position as an int (a dict key is written as a string)."""
  return key.position if type(key) is Index else str(key)


def _plain(path: Path) -> str:
  return "/".join(map(str, path))


def _shapes(spec: BatchSpec) -> str:
  return ", ".join(f"{path_name(p)}: {spec._full_shape(p)}" for p in spec.leaves)


def checked_batches(
  batches: Any,
  mask_key: str | None,
  num_shards: int,
  where: str | None = None,
  mask_fn: Any = None,
  varying: dict[Path, tuple[int, ...]] | None = None,
):
  """Yields ``batches``, each checked; the first fixes the `BatchSpec` every later one must match (but for the
  sizes of `varying` axes: length buckets, one compilation per bucket shape).

  The one place where `masked_eval`'s batches are checked: a batch that fails raises ValueError
  when it is read (batch 0 inside the multi-host pre-flight, which reports it to every process).

  Args:
    batches: an iterator of padded batches.
    mask_key: the batch key of the mask (None with ``mask_fn``).
    num_shards: how many parts the rows are split into; the batch size must divide.
    where: how messages name those parts (see `BatchSpec.check_divisible`).
    mask_fn: ``mask_fn(batch) -> bool [B, ...]`` for pytree batches, or None.
    varying: ``{path: axes counted from the end of a row}`` whose sizes may change from batch to batch (the
      length buckets of ``pe.pad_batches``), or None.
  """
  spec = None
  for index, batch in enumerate(batches):
    if spec is None:
      spec = BatchSpec.from_batch(batch, mask_key or "mask", index, mask_fn=mask_fn)
      spec.check_divisible(num_shards, where)
      spec = spec.varying_in(varying)
    else:
      spec.check(batch, index)
    if mask_key is not None and isinstance(batch, cabc.Mapping):
      check_no_wrapping_ints(batch, mask_key, index)
    yield batch


_INT32 = np.iinfo(np.int32)
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _check_float32_overflow(key: Any, seen: np.ndarray, index: int) -> None:
  """ValueError naming ``key`` when finite float64 values of its real rows overflow float32:
  JAX (without jax_enable_x64) makes them inf when the batch is placed on the devices, and a
  metric would read inf or NaN (e.g. "nan score") without the key that caused it."""
  with np.errstate(invalid="ignore", over="ignore"):
    over = np.isfinite(seen) & (np.abs(seen) > _FLOAT32_MAX)
  if np.any(over):
    largest = float(np.max(np.abs(seen[over])))
    raise ValueError(
      f"batch {index}, key {key!r} holds float64 values up to {largest:.3g} in magnitude, which "
      f"overflow float32 (largest {_FLOAT32_MAX:.3g}): JAX (without jax_enable_x64) makes them "
      "inf when the batch is placed on the devices. Rescale them on the host (e.g. divide by "
      "a constant, or take a log), or enable jax_enable_x64"
    )


def check_no_wrapping_ints(batch: cabc.Mapping, mask_key: str, index: int) -> None:
  """ValueError for a 64-bit integer leaf whose real rows hold values outside int32, or a
  float64 leaf whose real rows overflow float32 (`_check_float32_overflow`).

  Without ``jax_enable_x64`` JAX casts int64 to int32 by wrapping (``2**32`` becomes 0) when a
  batch is placed on the devices, before any metric sees it; so such a batch is refused here,
  naming the key. Only the rows the mask marks real are checked (padding may hold anything).
  """
  import jax  # deferred: the data layer is usable without touching JAX

  if jax.config.jax_enable_x64:  # pyrefly: ignore[missing-attribute]  # flags are set at runtime
    return
  mask = batch.get(mask_key)
  mask = np.asarray(mask) if mask is not None else None
  for key, value in batch.items():
    if key == mask_key or not isinstance(value, np.ndarray) or value.dtype.itemsize < 8:
      continue
    if value.dtype.kind not in "iuf":
      continue
    if (
      value.dtype.kind in "iu"
      and value.size
      and _INT32.min <= value.min() <= value.max() <= _INT32.max
    ):
      continue  # every row fits (padding too): no copy of the real rows to check
    seen = value
    if mask is not None and mask.dtype == np.bool_ and mask.shape == value.shape[: mask.ndim]:
      seen = value[mask]
    if value.dtype.kind == "f":
      _check_float32_overflow(key, seen, index)
      continue
    if seen.size and (seen.min() < _INT32.min or seen.max() > _INT32.max):
      raise ValueError(
        f"batch {index}, key {key!r} holds integers in [{seen.min()}, {seen.max()}] "
        f"(dtype {value.dtype}) outside int32, which JAX (without jax_enable_x64) wraps when "
        "the batch is placed on the devices; convert it on the host: to float32/float64 for "
        "values to average (e.g. timestamps: subtract an offset first), or remap ids below "
        "2**31"
      )
