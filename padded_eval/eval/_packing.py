"""A small carried state as one byte vector: one transfer instead of one per leaf and shard.

A metric's carried state is a pytree of a dozen small leaves (an exact sum is three, a count
two). Copying it between host and devices costs per leaf and per device shard, not per byte:
fetching a per-shard state of 12 leaves from 8 CPU devices is 96 copies, most of a short
evaluation's fixed cost. `StatePacking` lays the leaves of one shard's state end to end as
``uint8`` (bit for bit: `jax.lax.bitcast_convert_type`, so nothing is rounded), and the
compiled step carries that vector instead of the tree (`padded_eval.eval._step.packed`).

The layout is fixed by the empty state's structure, shapes and dtypes (it is hashable: the
jitted programs that unpack it take it as a static argument). `masked_eval` packs only small
states (`padded_eval.eval._placement.is_small_state`) with one process and no checkpoint: a large
state would be copied whole on every step, and a checkpoint saves the tree.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["StatePacking", "aggregate_packed"]


class StatePacking:
  """The byte layout of one shard's carried state.

  Attributes:
    treedef: the state's tree structure.
    specs: per leaf, ``(shape, numpy dtype, first byte, byte count)``.
    nbytes: the length of the packed vector.
    empty: ``pack_host`` of the empty state it was made from (a host ``uint8`` array).
  """

  def __init__(self, empty: Any):
    """``empty``: the empty state of one shard, a pytree of host arrays."""
    leaves, self.treedef = jax.tree.flatten(empty)
    specs, start = [], 0
    for leaf in leaves:
      leaf = np.asarray(leaf)
      size = leaf.size * leaf.dtype.itemsize
      specs.append((leaf.shape, leaf.dtype, start, size))
      start += size
    self.specs, self.nbytes = tuple(specs), start
    self.empty = self.pack_host(empty)
    self._key = (self.treedef, self.specs)

  def __hash__(self) -> int:
    return hash(self._key)

  def __eq__(self, other: object) -> bool:
    return isinstance(other, StatePacking) and other._key == self._key

  def pack(self, state: Any) -> jax.Array:
    """``state`` (traced leaves of the layout's shapes) -> ``uint8 [nbytes]``, bit for bit."""
    parts = [_bytes(jnp.asarray(leaf)).reshape(-1) for leaf in self.treedef.flatten_up_to(state)]
    return jnp.concatenate(parts) if parts else jnp.zeros((0,), jnp.uint8)

  def unpack(self, packed: jax.Array) -> Any:
    """``uint8 [..., nbytes]`` -> the state, every leaf with the same leading axes ``[...]``."""
    lead = packed.shape[:-1]
    leaves = [
      _from_bytes(packed[..., start : start + size], lead + shape, dtype)
      for shape, dtype, start, size in self.specs
    ]
    return self.treedef.unflatten(leaves)

  def pack_host(self, state: Any) -> np.ndarray:
    """``pack`` on the host: numpy leaves -> ``uint8 [nbytes]``."""
    parts = [
      np.ascontiguousarray(leaf, dtype).view(np.uint8).reshape(-1)
      for leaf, (_, dtype, _, _) in zip(self.treedef.flatten_up_to(state), self.specs)
    ]
    return np.concatenate(parts) if parts else np.zeros((0,), np.uint8)

  def unpack_host(self, packed: np.ndarray) -> Any:
    """``unpack`` on the host: ``uint8 [..., nbytes]`` -> the state with numpy leaves."""
    packed = np.asarray(packed)
    lead = packed.shape[:-1]
    leaves = [
      np.ascontiguousarray(packed[..., start : start + size]).view(dtype).reshape(lead + shape)
      for shape, dtype, start, size in self.specs
    ]
    return self.treedef.unflatten(leaves)


def _bytes(x: jax.Array) -> jax.Array:
  """``x``'s bytes: ``uint8 [..., itemsize]`` (``[...]`` for one-byte dtypes)."""
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint8)
  return jax.lax.bitcast_convert_type(x, jnp.uint8)


def _from_bytes(raw: jax.Array, shape: tuple, dtype: np.dtype) -> jax.Array:
  if dtype == np.bool_:
    return raw.reshape(shape) != 0
  if dtype.itemsize == 1:
    return jax.lax.bitcast_convert_type(raw.reshape(shape), dtype)
  return jax.lax.bitcast_convert_type(raw.reshape(shape + (dtype.itemsize,)), dtype)


@functools.partial(jax.jit, static_argnums=1)
def aggregate_packed(packed: jax.Array, packing: StatePacking) -> jax.Array:
  """Per-shard packed states ``uint8 [shards, nbytes]`` -> their exact combination, packed.

  Every part of the state (metrics, accumulators: whatever has ``aggregate()``) is combined
  over the leading shard axis with ``aggregate()``, in one single-device program.
  """
  state = packing.unpack(packed)
  combined = jax.tree.map(
    lambda part: part.aggregate(), state, is_leaf=lambda x: hasattr(x, "aggregate")
  )
  return packing.pack(combined)
