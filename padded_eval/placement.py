"""Placing what does not change between `masked_eval` calls without copying it on every call.

A short evaluation (one or a few batches) spends most of its time placing things, not
computing. Two of them are the same on every call of a training loop's validation:

* the params, when they are ``jax.Array``s that must be replicated (e.g. uncommitted arrays
  on one device): `place_reusing` keeps the replicated copy of each such array while the
  array itself lives and hands it out again. A ``jax.Array`` cannot change in place (donating
  it deletes it, which is checked), so the copy stays equal to it. numpy arrays and Python
  scalars can change, and are placed on every call.
* the empty carried state: `place_empty` makes it on the devices with one cached compiled
  program (constant fills, no host-to-device copy) instead of copying host arrays.

Both are for one process; with several processes the callers place as before.
"""

from __future__ import annotations

import collections
import functools
import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["PLACED_CACHE_SIZE", "anchor", "place_empty", "place_reusing", "stacked"]

PLACED_CACHE_SIZE = 4096
"""The most replicated copies of params leaves kept (least recently used dropped first)."""

# (id(source), sharding) -> (weak reference to source, placed copy)
_placed: collections.OrderedDict = collections.OrderedDict()


def _forget(key: tuple) -> None:
  _placed.pop(key, None)


def place_reusing(leaves: list, sharding: jax.sharding.Sharding) -> list:
  """``jax.device_put(leaves, sharding)``, reusing the copies of ``jax.Array`` leaves placed before.

  A ``jax.Array`` leaf placed earlier with the same sharding, still alive and not deleted
  (donated), gets the same placed copy back; every other leaf is placed, in one
  ``jax.device_put``. A copy is dropped when its source array is garbage collected, and the
  cache keeps at most `PLACED_CACHE_SIZE` copies.

  Args:
    leaves: a list of leaves (jax or numpy arrays, Python scalars).
    sharding: where to place them.

  Returns:
    The placed leaves, in order.
  """
  placed: list = [None] * len(leaves)
  missing = []
  for i, leaf in enumerate(leaves):
    found = _cached_copy(leaf, sharding)
    if found is None:
      missing.append(i)
    else:
      placed[i] = found
  if missing:
    for i, copy in zip(missing, jax.device_put([leaves[i] for i in missing], sharding)):
      placed[i] = copy
      _remember(leaves[i], sharding, copy)
  return placed


def _cached_copy(leaf: Any, sharding) -> jax.Array | None:
  if not isinstance(leaf, jax.Array) or jax.process_count() > 1:
    return None
  key = (id(leaf), sharding)
  entry = _placed.get(key)
  if entry is None:
    return None
  source, copy = entry
  if source() is not leaf or leaf.is_deleted() or copy.is_deleted():
    _placed.pop(key, None)
    return None
  _placed.move_to_end(key)
  return copy


def _remember(leaf: Any, sharding, copy: jax.Array) -> None:
  if not isinstance(leaf, jax.Array) or jax.process_count() > 1 or copy is leaf:
    return
  key = (id(leaf), sharding)
  _placed[key] = (weakref.ref(leaf, lambda _, key=key: _forget(key)), copy)
  while len(_placed) > PLACED_CACHE_SIZE:
    _placed.popitem(last=False)


_empty_programs: dict = {}  # (treedef, leaf fills, sharding, copies) -> compiled program


def place_empty(state: Any, sharding: jax.sharding.Sharding, copies: int | None) -> Any | None:
  """The host pytree ``state`` on the devices, made there by a cached compiled program.

  Args:
    state: a pytree of numpy arrays (an empty carried state).
    sharding: the sharding of every placed leaf.
    copies: stack this many copies on a new leading axis (one per shard), or None for none.

  Returns:
    The placed pytree, with fresh buffers on every call (the step may donate them): equal,
    bit for bit, to ``jax.device_put(stacked state, sharding)``; or None where it cannot be
    made so (several processes, a tree whose structure is not hashable).
  """
  if jax.process_count() > 1:
    return None
  leaves, treedef = jax.tree.flatten(state)
  leaves = [np.asarray(x) for x in leaves]
  key = (treedef, tuple(_fill_key(x) for x in leaves), sharding, copies)
  try:
    program = _empty_programs.get(key)
  except TypeError:  # a metric configuration that cannot be hashed
    return None
  if program is None:
    program = _empty_programs[key] = _empty_program(leaves, treedef, sharding, copies)
  return program()


def _fill_key(leaf: np.ndarray) -> tuple:
  """(shape, dtype, the one value's bytes) for a leaf of one repeated value, else its bytes."""
  flat = leaf.reshape(-1)
  if flat.size and leaf.dtype.itemsize in (1, 2, 4, 8):
    words = flat.view(f"u{leaf.dtype.itemsize}")
    if np.all(words == words[0]):
      return ("fill", leaf.shape, leaf.dtype.str, flat[:1].tobytes())
  return ("array", leaf.shape, leaf.dtype.str, leaf.tobytes())


def _empty_program(leaves: list, treedef, sharding, copies: int | None):
  lead = () if copies is None else (copies,)
  values = [np.array(x) for x in leaves]  # owned: the program's constants

  def make():
    made = [
      jnp.full(lead + x.shape, x.reshape(-1)[0], x.dtype)
      if _fill_key(x)[0] == "fill"
      else jnp.broadcast_to(jnp.asarray(x), lead + x.shape)
      for x in values
    ]
    return jax.tree.unflatten(treedef, made)

  return jax.jit(make, out_shardings=sharding)


def stacked(state: Any, copies: int) -> Any:
  """``state``'s numpy leaves stacked ``copies`` times on a new leading axis (one per shard).

  Every leaf gets its own buffers (``np.array`` copies), so none is donated twice.
  """
  return jax.tree.map(lambda x: np.stack([np.array(x)] * copies), state)


@functools.cache
def anchor() -> jax.Array:
  """One int32 zero on the default device (pmap's anchor for params without leaves)."""
  return jnp.zeros((), jnp.int32)
