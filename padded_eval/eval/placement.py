"""The small-state fast path's switch, and placing a carried state.

A short evaluation (one or a few batches) spends most of its time placing things, not
computing. A small carried state (`is_small_state`: at most `SMALL_STATE_BYTES` per shard) is
carried packed and placed once per compiled step (`padded_eval.eval.run`).
Nothing here keeps anything on the devices but the pmap anchor (`anchor`): the caches live in
`padded_eval.eval.cache` (bounded, cleared by `pe.clear_caches()`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.caches import registry

__all__ = [
  "SMALL_STATE_BYTES",
  "anchor",
  "fetched",
  "is_small_state",
  "on_host",
  "stacked",
]

SMALL_STATE_BYTES = 1 << 16
"""The one switch of the small-state fast path: a carried state of at most this many bytes per
shard (with a checkpoint or without) is carried packed and placed once (`padded_eval.eval.run`). 0 turns it
off."""


def is_small_state(state: Any) -> bool:
  """Whether the host ``state`` (one shard's) takes the small-state fast path: at most
  `SMALL_STATE_BYTES`."""
  return sum(np.asarray(x).nbytes for x in jax.tree.leaves(state)) <= SMALL_STATE_BYTES


def on_host() -> contextlib.AbstractContextManager:
  """``jax.default_device`` of the host's CPU device (where JAX has a CPU backend; else nothing).

  What the driver computes from host values alone (the empty state, the logs of the fetched final
  metric) runs there: on an accelerator, eager zeros compiled a program each on the chip (six of a
  first call's eight on TPU v5e), and the logs went back to the chip and were fetched again.
  """
  try:
    device = jax.local_devices(backend="cpu")[0]
  except RuntimeError:  # JAX_PLATFORMS without cpu
    return contextlib.nullcontext()
  return jax.default_device(device)


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


@registry.cache
def anchor() -> jax.Array:
  """One int32 zero on the default device (pmap's anchor for params without leaves)."""
  return jnp.zeros((), jnp.int32)
