"""Flat and tree views of batches: the helpers under `padded_eval.data._batch_spec` (which re-exports the public ones).

A dict batch has flat views keyed by path, ``{("features", "image"): leaf}`` (`flatten`, `unflatten`,
`path_name`; a tuple inside a batch is a node too, its positions `Index` keys: ``("x", Index(0))``); a pytree batch of ``masked_eval(mask_fn=...)`` is read with `tree_leaves`. Also: the scalar that pads
a leaf (`fill_value`), and the hint for batches whose trailing sizes vary (`pad_shapes_hint`).
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
from typing import Any, cast

import numpy as np

__all__ = [
  "STRING_KINDS",
  "FlatBatch",
  "Index",
  "Path",
  "check_key_kinds",
  "check_mask_fn_result",
  "check_not_strings",
  "fill_value",
  "flatten",
  "key_name",
  "leaf_dtype",
  "mapping_paths",
  "pad_shapes_hint",
  "pad_shapes_literal",
  "path_name",
  "ragged_message",
  "row_leaves",
  "tree_leaves",
  "unflatten",
]

Path = tuple[Any, ...]
FlatBatch = dict[Path, Any]
STRING_KINDS = "USO"  # unicode, bytes, object (tf.data yields bytes as object arrays)


@dataclasses.dataclass(frozen=True, order=True)
class Index:
  """A position in a tuple of a batch, as a key of a flat path (``("x", Index(1))``): unequal to a dict's int
  key, so that `unflatten` gives the tuple back. Printed as the bare position (``'x/1'`` in messages)."""

  position: int

  def __str__(self) -> str:
    return str(self.position)


def flatten(
  tree: cabc.Mapping | tuple, convert: bool = True, prefix: Path = (), tuples: bool = False
) -> FlatBatch:
  """Flattens nested Mappings into ``{path: leaf}`` in key order; leaves become numpy arrays if `convert`.

  With `tuples`, a plain tuple (not a list, which holds rows) is a node too, its members keyed by `Index` (a
  batch's ``{"x": (a, b)}``: two leaves, given back as a tuple by `unflatten`), and a namedtuple or other
  tuple subclass raises ValueError (read as an array, its fields would be rows); without, a tuple is a leaf
  (a ``pad_shapes`` value, a tf.data spec).
  """
  flat: FlatBatch = {}
  items = (
    ((Index(i), value) for i, value in enumerate(tree))
    if type(tree) is tuple
    else cast(cabc.Mapping, tree).items()
  )
  for key, value in items:
    path = prefix + (key,)
    if type(value) is np.ndarray:  # the common case, without the slower Mapping check
      flat[path] = value
    elif isinstance(value, cabc.Mapping) or (tuples and type(value) is tuple):
      flat.update(flatten(value, convert, path, tuples))
    elif tuples and isinstance(value, tuple):
      raise ValueError(_tuple_subclass_message(path, value))
    else:
      flat[path] = np.asarray(value) if convert else value
  return flat


def _tuple_subclass_message(path: Path, value: tuple) -> str:
  """Why a namedtuple (or another tuple subclass) in a batch is refused, and what to pass."""
  kind = "a namedtuple" if hasattr(type(value), "_fields") else "a tuple subclass"
  return (
    f"key {path_name(path)} holds a {type(value).__name__} ({kind}); a batch takes dicts, plain "
    "tuples (a group of per-row arrays) and arrays, and would read its fields as rows: pass "
    "value._asdict() (a dict of its fields) or tuple(value)"
  )


def unflatten(flat: FlatBatch) -> dict:
  """Inverse of `flatten`: nested plain dicts, and tuples where the keys are `Index` positions."""
  tree: dict = {}
  tuples = False
  for path, leaf in flat.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = leaf
    tuples = tuples or any(type(key) is Index for key in path)
  return _with_tuples(tree) if tuples else tree


def _with_tuples(node: Any) -> Any:
  """`node` (a dict of `unflatten`) with each dict keyed by `Index` positions made a tuple, in order."""
  if type(node) is not dict:
    return node
  if node and all(type(key) is Index for key in node):
    return tuple(_with_tuples(node[key]) for key in sorted(node))
  return {key: _with_tuples(value) for key, value in node.items()}


def path_name(path: Path) -> str:
  """A key path as users write it in messages: ``'image'`` or ``'features/image'``."""
  return repr("/".join(map(str, path)))


def leaf_dtype(leaf: Any) -> np.dtype:
  """A leaf's numpy dtype (of an array, a jax array, a scalar or a list)."""
  return np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.asarray(leaf).dtype


def tree_leaves(batch: Any, index: int, allow_strings: bool = False) -> tuple[dict, int, Any]:
  """The leaves of a pytree batch (``masked_eval(mask_fn=...)``), checked to share one leading size.

  Args:
    batch: any pytree of arrays ``[B, ...]`` (a jraph ``GraphsTuple``, a tuple, a dict).
    index: the batch's position, for messages.
    allow_strings: accept string/bytes leaves.

  Returns:
    ``({path: (row shape, dtype)}, B, structure)``; paths name dict keys, attributes and indices.

  Raises:
    ValueError: no leaf, a leaf without the first leaf's leading size, or a string leaf.
  """
  import jax  # deferred: the data layer is usable without touching JAX

  flat, structure = jax.tree_util.tree_flatten_with_path(batch)
  if not flat:
    raise ValueError(f"batch {index} ({type(batch).__name__}) has no array leaves")
  first_path = tuple(map(key_name, flat[0][0]))
  first_shape = np.shape(flat[0][1])
  batch_size = first_shape[0] if first_shape else None
  why = (
    f" like leaf {path_name(first_path)}: with mask_fn, every leaf's leading axis is the batch's rows "
    "(stack one padded graph per row, e.g. one per device, on a new leading axis)"
  )
  leaves = row_leaves(flat, key_name, batch_size, index, allow_strings, ("leaf", why))
  assert batch_size is not None  # row_leaves refused a first leaf without rows
  return leaves, batch_size, structure


def row_leaves(
  flat: list,
  key: Any,
  batch_size: int | None,
  index: int,
  allow_strings: bool,
  named: tuple[str, str],
) -> dict[Path, tuple[tuple, np.dtype]]:
  """``{path: (row shape, dtype)}`` of a batch's leaves, each checked to have `batch_size` rows.

  Args:
    flat: ``[(key path, leaf)]``, as ``jax.tree_util.tree_flatten_with_path`` gives them.
    key: one key of a key path as a path holds it (`key_name`, or a spec's).
    batch_size: the leading size of every leaf.
    index: the batch's position, for messages.
    allow_strings: accept string/bytes leaves.
    named: ``(noun, why)``: how a message names a leaf (``"key"``, ``"leaf"``) and what it adds after the
      expected leading size.

  Raises:
    ValueError: a leaf without `batch_size` rows, or (unless `allow_strings`) a string leaf.
  """
  noun, why = named
  leaves = {}
  for key_path, leaf in flat:
    path = tuple(map(key, key_path))
    shape, dtype = np.shape(leaf), leaf_dtype(leaf)
    if not shape or shape[0] != batch_size:
      raise ValueError(
        f"batch {index}: {noun} {path_name(path)} has shape {shape}; expected leading size "
        f"{batch_size}{why}"
      )
    check_not_strings(path, dtype, index, allow_strings, leaf)
    leaves[path] = (shape[1:], dtype)
  return leaves


def check_mask_fn_result(mask: Any, batch_size: int, index: int) -> None:
  """Raises ValueError unless `mask` (``mask_fn(batch index)``) is bool ``[batch_size, ...]``."""
  mask_shape, mask_dtype = np.shape(mask), leaf_dtype(mask)
  if not mask_shape or mask_shape[0] != batch_size or mask_dtype != np.bool_:
    raise ValueError(
      f"mask_fn(batch {index}) returned shape {mask_shape} and dtype {mask_dtype}; expected a bool array "
      f"[{batch_size}, ...] whose leading axis is the batch's rows (True: a real element)"
    )


def pad_shapes_hint(path: Path, got: tuple, want: tuple) -> str | None:
  """For trailing sizes that vary between batches (variable lengths): the `pad_shapes` that fixes them."""
  if len(got) != len(want) or None in got or None in want:
    return None
  first = next(axis for axis, (a, b) in enumerate(zip(got, want)) if a != b)
  sizes = tuple(max(a, b) if a != b else None for a, b in zip(got[first:], want[first:]))
  return (
    f". Its trailing sizes vary between batches (variable lengths?): pad them to fixed sizes, e.g. "
    f"pe.pad_batches(..., pad_shapes={pad_shapes_literal(path, sizes)}) with sizes of at least the longest row (None keeps an "
    "axis), so that every batch has one shape and the step compiles once"
  )


def ragged_message(path: Path, leaf: Any) -> str | None:
  """For a leaf whose rows differ in shape (a ragged list, or a 1-D object array of arrays as a Hugging Face
  column of lists gives): the problem and the `pad_shapes` that fixes it, naming the key; else None.

  Args:
    path: the leaf's key path.
    leaf: a list or tuple of rows, or a numpy array (only a 1-D object array of sequences is ragged).
  """
  if isinstance(leaf, np.ndarray):
    if leaf.dtype != object or leaf.ndim != 1 or not leaf.size:
      return None
    if not isinstance(leaf[0], (np.ndarray, list, tuple)):
      return None  # strings (or other objects)
  elif not isinstance(leaf, (list, tuple)) or not leaf:
    return None
  rows = list(leaf)
  try:
    shapes = [np.shape(row) for row in rows]
  except ValueError:  # a row that is ragged itself
    shapes = None
  name = path_name(path)
  if shapes is not None and len(set(shapes)) == 1:
    return None  # rows of one shape
  if not shapes or len({len(shape) for shape in shapes}) != 1 or not shapes[0]:
    return (
      f"key {name} holds rows of different shapes or ranks; expected rows of one shape. Ragged rows "
      f"(sequences of different lengths) are padded by pe.pad_batches(..., pad_shapes={pad_shapes_literal(path, 'L')}), "
      "L the longest row"
    )
  other = next(i for i, shape in enumerate(shapes) if shape != shapes[0])
  sizes = tuple(max(axis) for axis in zip(*shapes))
  return (
    f"key {name} holds ragged rows (row 0 has shape {shapes[0]}, row {other} has shape {shapes[other]}); "
    f"expected rows of one shape: pad them to fixed sizes with pe.pad_batches(..., "
    f"pad_shapes={pad_shapes_literal(path, sizes)}), sizes of at least the longest row (these rows' longest shown), "
    "so that every batch has one shape"
  )


def pad_shapes_literal(path: Path, sizes: Any) -> str:
  """The ``pad_shapes=`` value that pads leaf `path` to `sizes` (a tuple, or a name such as ``"L"``), as a
  user writes it: ``{'features': {'tokens': (60,)}}``."""
  literal = sizes if isinstance(sizes, str) else repr(sizes)
  literal = f"({literal},)" if isinstance(sizes, str) else literal
  for key in reversed(path):
    literal = f"{{{key!r}: {literal}}}"
  return literal


def key_name(key: Any) -> Any:
  """One key of a pytree batch's key path as users name it: a dict key, an attribute name or an index.

  (Dict batches keep their paths' non-dict keys as JAX's key objects, as checkpoints recorded them.)
  """
  for attribute in ("key", "name", "idx"):
    if hasattr(key, attribute):
      return getattr(key, attribute)
  return key


def _key_kind(key: Any) -> str:
  """The kind of a dict key as sorting sees it: strings, numbers, or another type by name."""
  if isinstance(key, str):
    return "strings"
  if isinstance(key, (int, float, np.integer, np.floating)):
    return "numbers"
  return type(key).__name__


def check_key_kinds(paths: Any, beside_mask: bool = False, index: int | None = None) -> None:
  """Raises ValueError when a dict of a batch mixes keys of kinds JAX cannot sort together.

  JAX sorts a dict's keys to flatten it, so ``{0: x, "y": y}`` is no pytree it can flatten
  ("Comparator raised exception while sorting pytree dictionary keys"). A batch's top level
  holds the mask under a string key, so its keys must be strings; a dict below it may use
  ints (or any one kind).

  Args:
    paths: the batch's key paths (tuples of keys; `Index` positions are a tuple's, not a dict's).
    beside_mask: the top level holds the mask under a string key beside ``paths``' keys.
    index: the batch's position, named in the error (None: not named).
  """
  children: dict = {}
  for path in paths:
    for depth, key in enumerate(path):
      if type(key) is not Index:
        children.setdefault(path[:depth], {})[key] = None
  for parent, keys in children.items():
    kinds = {_key_kind(key) for key in keys}
    if not parent and beside_mask:
      kinds.add("strings")
    if len(kinds) > 1:
      where = "at the top level" if not parent else f"under {path_name(parent)}"
      mask = ", beside the mask's string key" if not parent and beside_mask else ""
      shown = sorted(keys, key=lambda key: (_key_kind(key), str(key)))
      batch = "the batch's" if index is None else f"batch {index}: its"
      raise ValueError(
        f"{batch} dict keys {shown} {where}{mask} are of different kinds "
        f"({', '.join(sorted(kinds))}): JAX sorts a dict's keys, so one dict's keys must be of one kind; "
        "name them with strings (e.g. {str(key): value for key, value in batch.items()})"
      )


def mapping_paths(tree: Any, prefix: Path = ()) -> list[Path]:
  """The key paths of ``tree``'s nested Mappings (a tuple's members keyed by `Index`), leaves not read."""
  paths: list[Path] = []
  items = (
    ((Index(i), value) for i, value in enumerate(tree))
    if isinstance(tree, (tuple, list))
    else tree.items()
  )
  for key, value in items:
    path = prefix + (key,)
    if isinstance(value, cabc.Mapping) or type(value) in (tuple, list):
      paths.extend(mapping_paths(value, path) or [path])
    else:
      paths.append(path)
  return paths


def check_not_strings(
  path: Path, dtype: np.dtype, index: int, allow_strings: bool, leaf: Any = None
) -> None:
  """Raises ValueError for a string leaf of batch `index` (unless `allow_strings`): no device holds strings.

  An object `leaf` of ragged rows (a column of lists) is reported as ragged, with the `pad_shapes` that fixes it.
  """
  ragged = None if leaf is None or dtype.kind != "O" else ragged_message(path, leaf)
  if ragged is not None:
    raise ValueError(f"batch {index}: {ragged}")
  if dtype.kind in STRING_KINDS and not allow_strings:
    raise ValueError(
      f"batch {index}: key {path_name(path)} holds strings ({dtype}), which "
      "cannot be placed on a device; drop it from the batch"
    )


def fill_value(pad_value: Any, path: Path, dtype: np.dtype) -> Any:
  """The scalar that pads leaf `path` of `dtype`, checked to fit the dtype.

  Args:
    pad_value: a scalar, or a dict nested like the batch of per-key scalars (see `BatchSpec.fills`).
    path: the leaf's key path.
    dtype: the leaf's dtype.

  Returns:
    A numpy scalar of `dtype` (or str/bytes for a string leaf).

  Raises:
    ValueError: a dict or an array (a list) where a scalar belongs, a string for a number, or a value that does
      not fit `dtype` (a finite float that overflows to inf included).
  """
  value = pad_value
  for key in path:
    if type(key) is Index and type(value) is tuple:  # per-member pad values of a tuple in the batch
      value = value[key.position] if key.position < len(value) else 0
      continue
    if not isinstance(value, cabc.Mapping):
      break
    value = value.get(key, 0)
  if isinstance(value, cabc.Mapping):
    raise ValueError(f"pad_value for key {path_name(path)} is a dict; expected a scalar")
  if np.ndim(value):
    raise ValueError(
      f"pad_value {value!r} for key {path_name(path)} is not a scalar (shape {np.shape(value)}); "
      "expected a scalar, or a dict of per-key scalars"
    )
  if dtype.kind in STRING_KINDS:
    if isinstance(value, (str, bytes)):
      return value
    return "" if dtype.kind == "U" else b""
  where = f"pad_value {value!r} for key {path_name(path)}"
  if isinstance(value, (str, bytes)):
    raise ValueError(f"{where} is a string; expected a number for dtype {dtype}")
  try:
    with np.errstate(over="ignore"):  # an overflow to inf is reported below
      fill = np.array(value, dtype=dtype)
  except (ValueError, OverflowError, TypeError) as err:
    raise ValueError(f"{where} does not fit dtype {dtype} ({err}); pass a per-key dict") from None
  if dtype.kind in "biu" and fill != value:
    raise ValueError(f"{where} is not exactly representable in dtype {dtype}; pass a per-key dict")
  if dtype.kind not in "biuc" and _overflows(value, fill):
    raise ValueError(
      f"{where} overflows dtype {dtype} (largest finite {_largest(dtype)}) and would pad with inf; pass a "
      f"value within the dtype's range, e.g. a per-key dict pad_value={{{path_name(path)}: 0}} (inf itself "
      "is accepted if meant)"
    )
  return fill[()]


def _overflows(value: Any, fill: np.ndarray) -> bool:
  """Whether a finite pad value became inf (or NaN) in the leaf's float dtype."""
  try:
    return bool(np.isfinite(float(value))) and not np.isfinite(float(fill))
  except (TypeError, ValueError, OverflowError):
    return False


def _largest(dtype: np.dtype) -> str:
  try:
    return f"{float(np.finfo(dtype).max):g}"
  except ValueError:  # an ml_dtypes type numpy's finfo does not know
    import ml_dtypes  # a dependency of jax

    return f"{float(ml_dtypes.finfo(dtype).max):g}"
