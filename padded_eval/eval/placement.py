"""The small-state fast path's switch, and placing and combining a carried state.

A short evaluation (one or a few batches) spends most of its time placing things, not
computing. A small carried state (`is_small_state`: one process, at most `SMALL_STATE_BYTES`
per shard) is carried packed and placed once per compiled step (`padded_eval.eval.run`), and
its per-shard partial states are fetched and combined in one single-device program
(`combined_on_one_device`) instead of a collective across every device. Nothing here keeps
anything on the devices: the caches live in `padded_eval.eval.cache` (bounded, cleared by
`pe.clear_caches()`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
  "SMALL_STATE_BYTES",
  "anchor",
  "clear_cache",
  "combined_on_one_device",
  "fetched",
  "is_small_state",
  "stacked",
]

SMALL_STATE_BYTES = 1 << 16
"""The one switch of the small-state fast path: a carried state of at most this many bytes per
shard (one process, no checkpoint) is carried packed, placed once (`padded_eval.eval.run`), and
its partial states are combined on one device (`combined_on_one_device`). 0 turns it off."""


def is_small_state(state: Any) -> bool:
  """Whether the host ``state`` (one shard's) takes the small-state fast path: one process, and at
  most `SMALL_STATE_BYTES`."""
  if jax.process_count() > 1:
    return False
  return sum(np.asarray(x).nbytes for x in jax.tree.leaves(state)) <= SMALL_STATE_BYTES


def stacked(state: Any, copies: int) -> Any:
  """``state``'s numpy leaves stacked ``copies`` times on a new leading axis (one per shard).

  Every leaf gets its own buffers (``np.array`` copies), so none is donated twice.
  """
  return jax.tree.map(lambda x: np.stack([np.array(x)] * copies), state)


def fetched(tree: Any) -> Any:
  """``jax.device_get(tree)``, every zero-size leaf a numpy array of zeros of its shape and dtype.

  A zero-size leaf has no values to fetch, and fetching one can fail: under ``jax.disable_jit()``,
  ``jax.pmap`` returns zero-size outputs whose per-device buffers keep the whole array's shape
  (jax 0.10: "could not broadcast input array from shape (8,4,0) into shape (1,4,0)").
  """
  return jax.device_get(
    jax.tree.map(lambda x: np.zeros(np.shape(x), x.dtype) if np.size(x) == 0 else x, tree)
  )


@functools.cache
def anchor() -> jax.Array:
  """One int32 zero on the default device (pmap's anchor for params without leaves)."""
  return jnp.zeros((), jnp.int32)


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
  shards = max(len(jax.tree.leaves(state)[0]), 1) if jax.tree.leaves(state) else 1
  if sum(x.nbytes for x in jax.tree.leaves(state)) > SMALL_STATE_BYTES * shards:
    return None
  return _aggregate(fetched(state), keep_axis)


@functools.partial(jax.jit, static_argnums=1)
def _aggregate(state: Any, keep_axis: bool) -> Any:
  combined = jax.tree.map(
    lambda part: part.aggregate(), state, is_leaf=lambda x: hasattr(x, "aggregate")
  )
  return jax.tree.map(lambda x: x[None], combined) if keep_axis else combined


def clear_cache() -> None:
  """Drops the anchor array and the compiled one-device combine (`padded_eval.eval.cache.clear_caches`)."""
  anchor.cache_clear()
  _aggregate.clear_cache()
