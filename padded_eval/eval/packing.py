"""A small carried state as one vector of 32-bit words: one transfer instead of one per leaf and shard.

A metric's carried state is a pytree of a dozen small leaves (an exact sum is three, a count
two). Copying it between host and devices costs per leaf and per device shard, not per byte:
fetching a per-shard state of 12 leaves from 8 CPU devices is 96 copies, most of a short
evaluation's fixed cost. `StatePacking` lays the leaves of one shard's state end to end as
``uint32`` words (bit for bit: `jax.lax.bitcast_convert_type`, so nothing is rounded), and the
compiled step carries that vector instead of the tree (`padded_eval.eval.step.merge_step`).

Words, not bytes: state leaves are 32-bit (float32 sums, int32 limbs), and a 32-bit leaf is
one word by a same-width bitcast, which XLA compiles to nothing. Through bytes, XLA's CPU
backend builds every word from four bytes with a shift-and-reduce kernel of its own on both
sides of the step (36 extra kernels for Flax mnist's accuracy and loss: the step compiled in
0.71 s instead of 0.29 s). A 64-bit leaf is two words; 8- and 16-bit leaves and bools take a
word per element (they are rare in states and small).

The layout is fixed by the empty state's structure, shapes and dtypes (it is hashable).
`masked_eval` packs only small states (`padded_eval.eval.placement.is_small_state`): a packed
state is not donated, so a large one would be copied whole on every step. A checkpoint saves the
tree's leaves (`unpack_host` on its writer thread) and restores them packed (`pack_host` of the
leaves of every shard), so the files are the same whichever carrier ran. Everything else is
carried as its tree (`TreeLayout`, the same interface, each conversion the identity).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.exact.accumulate import Accumulator, ExactCount, ExactSum
from padded_eval.metrics.base import Metric

__all__ = ["StatePacking", "TreeLayout"]


class StatePacking:
  """The byte layout of one shard's carried state.

  Attributes:
    treedef: the state's tree structure.
    specs: per leaf, ``(shape, numpy dtype, first word, word count)``.
    nwords: the length of the packed vector.
    empty: ``pack_host`` of the empty state it was made from (a host ``uint32`` array).
  """

  donated = False  # placed once per compiled step and handed to every call: never donated

  def __init__(self, empty: Any):
    """``empty``: the empty state of one shard, a pytree of host arrays."""
    parts, self._parts = jax.tree.flatten(empty, is_leaf=_is_part)
    self._part_structures = tuple(map(jax.tree.structure, parts))  # for `_unpack_part`
    leaves, self.treedef = jax.tree.flatten(empty)
    groups: dict = {kind: [] for kind in _GROUPED}  # kind -> [(part index, first leaf)]
    own, own_parts, first = [], [], 0  # the leaves and parts that are not in a group
    self._part_leaves = []
    for i, part in enumerate(parts):
      count = len(jax.tree.leaves(part))
      self._part_leaves.append((first, count))
      if _group_of(part) is not None:
        groups[_group_of(part)].append((i, first))
      else:
        own.extend(range(first, first + count))
        own_parts.append(i)
      first += count
    # word order: each group's fields, every part's field after the other; then the rest
    order = [
      leaf + field
      for kind, members in groups.items()
      for field in range(len(kind._fields))
      for _, leaf in members
    ] + own
    specs: list[Any] = [None] * len(leaves)  # every leaf's, in leaf order
    start = 0
    for index in order:
      leaf = np.asarray(leaves[index])
      size = leaf.size * _words_per_element(leaf.dtype)
      specs[index] = (leaf.shape, leaf.dtype, start, size)
      start += size
    self.specs: tuple[tuple[tuple[int, ...], np.dtype, int, int], ...] = tuple(specs)
    self.nwords, self._order = start, tuple(order)
    self._groups = tuple(
      (kind, tuple(i for i, _ in members)) for kind, members in groups.items() if members
    )
    self._own_parts = tuple(own_parts)
    self.empty = self.pack_host(empty)
    self._key = (self.treedef, self._parts, self.specs)

  def __hash__(self) -> int:
    return hash(self._key)

  def __eq__(self, other: object) -> bool:
    return isinstance(other, StatePacking) and other._key == self._key

  def pack(self, state: Any) -> jax.Array:
    """``state`` (traced leaves of the layout's shapes) -> ``uint32 [nwords]``, bit for bit."""
    leaves = self.treedef.flatten_up_to(state)
    return _concatenate([_words(jnp.asarray(leaves[i])).reshape(-1) for i in self._order])

  def merge(self, packed: jax.Array, batch: Any) -> jax.Array:
    """``packed`` (``uint32 [nwords]``) with one batch's state ``batch`` merged in, packed.

    The same as ``pack(unpack(packed).merge(batch))`` leaf for leaf, with the exact sums and
    counts of every metric merged together: each field of a group is one vector, in the words
    as in the merge. XLA's CPU backend compiles a kernel per array a program computes (a
    scalar exact sum merged alone is three kernels, each redoing the same chain); merged as
    vectors, a whole state is a handful (Flax mnist's step: 23 kernels before, 11 after).

    Args:
      packed: the carried state, packed by this layout (no leading axes).
      batch: one batch's state, of the empty state's structure; a part that is None is kept
        as it is.
    """
    parts = self._parts.flatten_up_to(batch)
    words: list = []
    for kind, members in self._groups:
      fields = range(len(kind._fields))
      mine = kind._make(*(self._field(packed, members, f) for f in fields))
      theirs = [kind.zeros(self._part_shape(i)) if parts[i] is None else parts[i] for i in members]
      merged = mine.merge(kind._make(*(_flat_field(theirs, f) for f in fields)))
      words.extend(_words(getattr(merged, name)) for name in kind._fields)  # flat already
    for i in self._own_parts:  # only these are read back as a tree (fewer ops to trace)
      total = self._unpack_part(packed, i)
      merged = total if parts[i] is None else total.merge(parts[i])
      words.extend(_words(jnp.asarray(leaf)).reshape(-1) for leaf in jax.tree.leaves(merged))
    return _concatenate(words)

  def last_part(self, packed: jax.Array) -> Any:
    """The state's last part (the row count of ``(metric, count)``), read from ``packed`` alone:
    the step reads its count without tracing a slice of every other leaf."""
    return self._unpack_part(packed, len(self._part_leaves) - 1)

  def _part_shape(self, part: int) -> tuple:
    """The shape of part ``part``'s first leaf (a group member's fields all have it)."""
    return self.specs[self._part_leaves[part][0]][0]

  def _unpack_part(self, packed: jax.Array, part: int) -> Any:
    """Part ``part`` of the state (a metric or accumulator), read from ``packed``."""
    first, count = self._part_leaves[part]
    leaves = [
      _from_words(packed[start : start + size], shape, dtype)
      for shape, dtype, start, size in self.specs[first : first + count]
    ]
    return self._part_structures[part].unflatten(leaves)

  def _field(self, packed: jax.Array, members: tuple, field: int) -> jax.Array:
    """Field ``field`` of the group parts ``members``, one flat vector read from ``packed``."""
    first_leaf, _ = self._part_leaves[members[0]]
    shape, dtype, start, _ = self.specs[first_leaf + field]
    size = sum(self.specs[self._part_leaves[i][0] + field][3] for i in members)
    return _from_words(packed[start : start + size], (size,), dtype)

  def unpack(self, packed: jax.Array) -> Any:
    """``uint32 [..., nwords]`` -> the state, every leaf with the same leading axes ``[...]``."""
    lead = packed.shape[:-1]
    leaves = [
      _from_words(packed[..., start : start + size], lead + shape, dtype)
      for shape, dtype, start, size in self.specs
    ]
    return self.treedef.unflatten(leaves)

  def pack_host(self, state: Any) -> np.ndarray:
    """``pack`` on the host: numpy leaves -> ``uint32 [..., nwords]``, every leaf with the same
    leading axes ``[...]`` (a checkpoint's leaves: one partial state per shard) or none."""
    leaves = self.treedef.flatten_up_to(state)
    first = np.shape(leaves[0]) if leaves else ()
    lead = first[: len(first) - len(self.specs[0][0])] if leaves else ()
    parts = [
      _host_words(np.ascontiguousarray(leaves[i], self.specs[i][1]).reshape(lead + (-1,)))
      for i in self._order
    ]
    return np.concatenate(parts, axis=-1) if parts else np.zeros(lead + (0,), np.uint32)

  def unpack_host(self, packed: np.ndarray) -> Any:
    """``unpack`` on the host: ``uint32 [..., nwords]`` -> the state with numpy leaves."""
    packed = np.asarray(packed)
    lead = packed.shape[:-1]
    leaves = [
      _host_from_words(np.ascontiguousarray(packed[..., start : start + size]), dtype).reshape(
        lead + shape
      )
      for shape, dtype, start, size in self.specs
    ]
    return self.treedef.unflatten(leaves)


_GROUPED = (ExactSum, ExactCount)  # merged as vectors, their fields each a run of words
_GROUP_DTYPES = {ExactSum: (np.float32, np.float32, np.int32), ExactCount: (np.int32, np.int32)}


def _is_part(x: Any) -> bool:
  """Whether ``x`` merges as a whole: an accumulator, or a metric with a merge of its own."""
  own_merge = isinstance(x, Metric) and type(x).merge is not Metric.merge
  return isinstance(x, Accumulator) or own_merge


def _group_of(part: Any) -> type | None:
  """The group ``part`` merges in (an exact sum or count of 32-bit fields), or None."""
  kind = type(part)
  if kind not in _GROUP_DTYPES:
    return None
  dtypes = tuple(np.dtype(getattr(part, name).dtype) for name in kind._fields)
  return kind if dtypes == tuple(map(np.dtype, _GROUP_DTYPES[kind])) else None


def _flat_field(parts: list, field: int) -> jax.Array:
  """Field ``field`` of every accumulator in ``parts``, flattened and end to end."""
  name = type(parts[0])._fields[field]
  return jnp.concatenate([jnp.reshape(getattr(p, name), (-1,)) for p in parts])


def _concatenate(parts: list) -> jax.Array:
  """``uint32`` word vectors end to end (an empty state: no words)."""
  return jnp.concatenate(parts) if parts else jnp.zeros((0,), jnp.uint32)


def _words_per_element(dtype: np.dtype) -> int:
  """32-bit words per element: 2 for 64-bit dtypes, else 1 (narrower ones are widened)."""
  return 2 if dtype.itemsize == 8 else 1


def _narrow_uint(dtype: np.dtype):
  """The unsigned integer type of a narrow (8- or 16-bit) dtype's width."""
  return np.uint8 if dtype.itemsize == 1 else np.uint16


def _words(x: jax.Array) -> jax.Array:
  """``x`` as ``uint32`` words: ``[..., 2]`` for 64-bit dtypes, else ``[...]``."""
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  if x.dtype.itemsize < 4:  # zero-extended: the bits, one element a word
    return jax.lax.bitcast_convert_type(x, _narrow_uint(x.dtype)).astype(jnp.uint32)
  return jax.lax.bitcast_convert_type(x, jnp.uint32)


def _from_words(words: jax.Array, shape: tuple, dtype: np.dtype) -> jax.Array:
  if dtype == np.bool_:
    return words.reshape(shape) != 0
  if dtype.itemsize < 4:
    return jax.lax.bitcast_convert_type(words.reshape(shape).astype(_narrow_uint(dtype)), dtype)
  if dtype.itemsize == 8:
    return jax.lax.bitcast_convert_type(words.reshape(shape + (2,)), dtype)
  return jax.lax.bitcast_convert_type(words.reshape(shape), dtype)


def _host_words(x: np.ndarray) -> np.ndarray:
  """`_words` on the host (a contiguous numpy array)."""
  if x.dtype.itemsize < 4:
    return x.view(_narrow_uint(x.dtype)).astype(np.uint32)
  return x.view(np.uint32)


def _host_from_words(words: np.ndarray, dtype: np.dtype) -> np.ndarray:
  """`_from_words` on the host, flat (the caller reshapes)."""
  if dtype.itemsize < 4:
    return words.astype(_narrow_uint(dtype)).view(dtype)
  return words.view(dtype)


class TreeLayout:
  """The carried state as its tree, merged metric by metric: `StatePacking`'s interface, each
  conversion the identity (the carrier of large states).

  Attributes:
    empty: the empty state of one shard it was made from (host arrays).
  """

  donated = True  # placed fresh for every call: donated from step to step

  def __init__(self, empty: Any = None):
    self.empty = empty

  def pack(self, state: Any) -> Any:
    return state

  def unpack(self, carried: Any) -> Any:
    return carried

  def pack_host(self, state: Any) -> Any:
    return state

  def unpack_host(self, carried: Any) -> Any:
    return carried

  def merge(self, carried: Any, batch: Any) -> Any:
    """``carried`` ``(metric, count)`` with one batch's ``(metric, count)`` merged in."""
    (metric, count), (batch_metric, batch_count) = carried, batch
    return metric.merge(batch_metric), count.merge(batch_count)

  def last_part(self, carried: Any) -> Any:
    return carried[-1]
