"""Placing what does not change between `masked_eval` calls without copying it on every call.

A short evaluation (one or a few batches) spends most of its time placing things, not
computing. Two of them are the same on every call of a training loop's validation:

* the params, when they are ``jax.Array``s that must be replicated (e.g. uncommitted arrays
  on one device): `place_reusing` keeps the replicated copy of each such array while the
  array itself lives and hands it out again. A ``jax.Array`` cannot change in place (donating
  it deletes it, which is checked), so the copy stays equal to it. numpy arrays and Python
  scalars can change, and are placed on every call.
* the empty carried state, when small: `placed_once` places it once and hands out the same
  device arrays again; the step that takes it does not donate it
  (``CompiledStep.step_keeping_state``), so it stays empty. (A compiled program making it
  on the devices was slower than copying it: every program over all devices costs a launch
  on each.)

The per-shard partial states of a short evaluation are small too: `combined_on_one_device`
fetches them and combines them in one single-device program, instead of a collective across
every device. All of this is for one process; with several processes the callers do as
before.
"""

from __future__ import annotations

import collections
import functools
import weakref
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
  "PLACED_CACHE_SIZE",
  "PLACED_STATES",
  "REUSED_STATE_BYTES",
  "SMALL_STATE_BYTES",
  "anchor",
  "combined_on_one_device",
  "place_reusing",
  "placed_once",
  "reusable_state",
  "stacked",
]

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


_placed_states: collections.OrderedDict = collections.OrderedDict()  # (id, owner) -> (host, placed)
PLACED_STATES = 64
"""The most placed empty states kept (one per compiled step and input shapes in use)."""

REUSED_STATE_BYTES = 1 << 16
"""Empty states up to this many bytes per shard are placed once and kept (`placed_once`): at
most `PLACED_STATES` of them stay on the devices between calls."""


def reusable_state(state: Any) -> bool:
  """Whether the empty ``state`` is placed once and reused (`placed_once`): one process, and at
  most `REUSED_STATE_BYTES` (host leaves, one shard). The step that takes it must not donate it.
  """
  if jax.process_count() > 1:
    return False
  return sum(np.asarray(x).nbytes for x in jax.tree.leaves(state)) <= REUSED_STATE_BYTES


def placed_once(state: Any, owner: Any, place: Callable[[], Any]) -> Any:
  """``place()``, the placed empty ``state``, made once per ``(state, owner)`` where reusable.

  Args:
    state: the host empty state; the same object on every call (the compiled-step cache's).
    owner: what places it (a backend: the same state placed by another is another entry).
    place: makes the placed state.

  Returns:
    The placed state: the one made before for this ``state`` and ``owner`` when
    `reusable_state` (its buffers are never donated: the step is
    ``CompiledStep.step_keeping_state``), else a fresh ``place()``.
  """
  if not reusable_state(state):
    return place()
  key = (id(state), owner)
  entry = _placed_states.get(key)
  if entry is not None and entry[0] is state:
    if not any(leaf.is_deleted() for leaf in jax.tree.leaves(entry[1])):
      _placed_states.move_to_end(key)
      return entry[1]
  placed = place()
  _placed_states[key] = (state, placed)
  while len(_placed_states) > PLACED_STATES:
    _placed_states.popitem(last=False)
  return placed


def stacked(state: Any, copies: int) -> Any:
  """``state``'s numpy leaves stacked ``copies`` times on a new leading axis (one per shard).

  Every leaf gets its own buffers (``np.array`` copies), so none is donated twice.
  """
  return jax.tree.map(lambda x: np.stack([np.array(x)] * copies), state)


@functools.cache
def anchor() -> jax.Array:
  """One int32 zero on the default device (pmap's anchor for params without leaves)."""
  return jnp.zeros((), jnp.int32)


SMALL_STATE_BYTES = 1 << 20
"""Per-shard partial states up to this many bytes in all are combined on one device
(`combined_on_one_device`) rather than by a collective across the devices."""


def combined_on_one_device(state: Any, keep_axis: bool = False) -> Any | None:
  """Per-shard partial states combined exactly on one device, without a collective.

  On CPU devices that share few cores, a program with collectives costs a rendezvous of
  every device (milliseconds under load); a small state is cheaper to fetch whole and combine
  with ``aggregate()`` (the same exact totals as ``reduce``) in one single-device program.

  Args:
    state: a pytree of metrics and accumulators (objects with ``aggregate()``) whose
      leaves are ``[shards, ...]`` device arrays, one partial state per shard.
    keep_axis: keep a leading axis of size 1 on every combined leaf (pmap's layout).

  Returns:
    The combined state on the default device, or None where the collective should do it:
    several processes (the other parts are elsewhere), or more than `SMALL_STATE_BYTES`.
  """
  if jax.process_count() > 1:
    return None
  if sum(x.nbytes for x in jax.tree.leaves(state)) > SMALL_STATE_BYTES:
    return None
  return _aggregate(jax.device_get(state), keep_axis)


@functools.partial(jax.jit, static_argnums=1)
def _aggregate(state: Any, keep_axis: bool) -> Any:
  combined = jax.tree.map(
    lambda part: part.aggregate(), state, is_leaf=lambda x: hasattr(x, "aggregate")
  )
  return jax.tree.map(lambda x: x[None], combined) if keep_axis else combined
