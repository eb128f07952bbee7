"""What identifies one evaluation in a checkpoint directory: the fingerprint of its question.

`fingerprint` gathers what a resumed or finished `masked_eval` must share with the call that
wrote the directory (process count, backend layout, params structure and values
(`params_checksum`), batches, first batch's real rows (`batch_checksum`), metric state
structure); `padded_eval.eval.checkpoint` compares it and names what differs
(`FINGERPRINT_NAMES`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.caches import registry
from padded_eval.metrics.resampling._poisson_counts import mix32

__all__ = [
  "FINGERPRINT_NAMES",
  "batch_checksum",
  "fingerprint",
  "params_checksum",
  "tree_fingerprint",
]

FINGERPRINT_NAMES = {
  "process_count": "the process count",
  "backend": "the backend layout",
  "params": "the params structure",
  "params_checksum": "the params checksum (the params' values: another model checkpoint?)",
  "num_batches": "the number of batches (another dataset, or more or fewer rows?)",
  "num_rows": "the number of real rows (another dataset, or more or fewer rows?)",
  "batch_size": "the batch size",
  "batch": "the batch structure",
  "first_batch": "the first batch (its real rows' values: another dataset, or a pipeline that shuffles?)",
  "metric": "the metric",
}


def tree_fingerprint(tree: Any) -> dict:
  """The structure of a pytree as JSON: its treedef and its leaves' shapes and dtypes."""
  leaves, treedef = jax.tree.flatten(tree)
  return {
    "tree": str(treedef),
    "leaves": [[list(np.shape(x)), _dtype_name(x)] for x in leaves],
  }


def fingerprint(
  *,
  backend: dict,
  params: Any,
  batch_spec: dict | None,
  state_shapes: Any | None,
  checksum: str | None = None,
  num_batches: int | None = None,
  first_batch: str | None = None,
  num_rows: int | None = None,
) -> dict:
  """What a checkpoint must match to be resumed: a JSON dict of the evaluation.

  Two directories' fingerprints are compared on the parts both have (`CheckpointDir.check`).

  Args:
    backend: the backend's name and layout (mesh shape, data axis, shards).
    params: the params pytree (only its structure is kept).
    batch_spec: `BatchSpec.to_json()` of the first batch, or None when not read yet.
    state_shapes: the metric state's ``ShapeDtypeStruct`` pytree, or None when not traced.
    checksum: `params_checksum` of the placed params, or None when not computed yet.
    num_batches: ``len(batches)``, or None when the batches do not know it.
    first_batch: `batch_checksum` of the first batch (batch 0), or None when it is not read.
    num_rows: the real rows of the batches (``pad_batches(...).num_rows``), or None when unknown.
  """
  found = {
    "process_count": jax.process_count(),
    "backend": backend,
    "params": tree_fingerprint(params),
  }
  if checksum is not None:
    found["params_checksum"] = checksum
  if num_batches is not None:
    found["num_batches"] = num_batches
  if num_rows is not None:
    found["num_rows"] = num_rows
  if batch_spec is not None:
    found["batch_size"] = batch_spec["batch_size"]
    found["batch"] = batch_spec
  if first_batch is not None:
    found["first_batch"] = first_batch
  if state_shapes is not None:
    found["metric"] = tree_fingerprint(state_shapes)
  return found


def batch_checksum(batch: Any, mask_key: str) -> str:
  """A checksum of a host batch's real rows (``batch[mask_key]`` True): every leaf's path, dtype and
  the bytes of its real rows (strings and other objects by their ``repr``), and the mask. Padding
  rows are left out: their fill (``pad_value``) does not change the question.

  Args:
    batch: a dict batch of host arrays ``[B, ...]`` with the bool ``[B]`` mask at ``mask_key``.
    mask_key: the mask's key.

  Returns:
    32 hex digits (BLAKE2b).
  """
  mask = np.asarray(batch[mask_key], bool)
  digest = hashlib.blake2b(mask.tobytes(), digest_size=16)
  for path, leaf in jax.tree_util.tree_leaves_with_path(batch):
    rows = np.asarray(leaf)[mask]
    digest.update(f"{jax.tree_util.keystr(path)} {rows.dtype.str} {rows.shape}".encode())
    if rows.dtype.kind == "O":
      digest.update(repr(rows.tolist()).encode())
    else:
      digest.update(np.ascontiguousarray(rows).tobytes())
  return digest.hexdigest()


def _dtype_name(leaf: Any) -> str:
  dtype = getattr(leaf, "dtype", None)
  return np.dtype(dtype).str if dtype is not None else type(leaf).__name__


# --- the params' values: a checksum of their bits, computed where they lie ----------------------

_GOLDEN = 0x9E3779B9  # 2**32 / golden ratio: spreads consecutive positions over the words


def params_checksum(params: Any, wait: Any = None) -> str:
  """A checksum of every bit of ``params``, computed on the devices: 16 hex digits.

  Every leaf is read as 32-bit words (1-, 2- and 4-byte elements one word each, zero-extended;
  8-byte elements two; complex ones their real and imaginary parts). Word ``i`` of the tree (leaves
  in ``jax.tree.leaves`` order, elements in row-major order) adds ``m_i = fmix32(w_i ^ (i *
  0x9E3779B9 mod 2**32))`` (murmur3's finaliser, a bijection of 32-bit words) to two sums mod
  2**32: ``sum m_i`` and ``sum m_i * (2 i + 1)``. Changing any one word changes the first sum;
  a permutation of words or of leaves moves words to other positions, which changes both sums
  except by a ~2**-64 accident. The value does not depend on where the leaves lie: a fully
  replicated leaf is read on one device holding it (and summed by halves, `_sum_by_halves`), a
  sharded one where its shards are (XLA adds the partial sums across devices and processes).
  One jitted program per leaf shape,
  dtype and sharding (its position is an argument), so leaves of one shape share a
  compilation (measured: benchmarks/RESULTS.md).

  Args:
    params: a pytree of ``jax.Array`` leaves (other leaves are put on the default device).
    wait: ``wait(sums)`` blocks until the programs finished (a deadline of several processes),
      or None.

  Returns:
    ``"%08x%08x"`` of the two sums.
  """
  sums, offset = [], 0
  for leaf in jax.tree.leaves(params):
    leaf = leaf if isinstance(leaf, jax.Array) else jnp.asarray(leaf)
    if leaf.is_fully_replicated:
      leaf = leaf.addressable_shards[0].data  # one copy, no transfer
    one_device = len(leaf.sharding.device_set) == 1
    sums.append(_leaf_sums(leaf, np.uint32(offset), one_device))
    offset = (offset + leaf.size * max(1, leaf.dtype.itemsize // 4)) % 2**32
  if wait is not None:
    wait(sums)
  total = np.zeros(2, np.uint64)
  for part in jax.device_get([part.addressable_shards[0].data for part in sums]):
    total += part
  first, second = (int(x) % 2**32 for x in total)
  return f"{first:08x}{second:08x}"


@registry.jit(static_argnums=2)
def _leaf_sums(leaf: jax.Array, offset: jax.Array, one_device: bool) -> jax.Array:
  """``uint32 [2]``: the two sums of `params_checksum` over ``leaf``, its first word at ``offset``."""
  words = _words(leaf)
  index = jnp.broadcast_to(offset, words.shape)
  stride = 1
  for axis in reversed(range(words.ndim)):
    position = jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis)
    index = index + position * jnp.uint32(stride % 2**32)
    stride *= words.shape[axis]
  mixed = _fmix32(words ^ (index * jnp.uint32(_GOLDEN)))
  lanes = (mixed, mixed * (index * jnp.uint32(2) + jnp.uint32(1)))
  if one_device:
    return jnp.stack([_sum_by_halves(lane) for lane in lanes])
  return jnp.stack([jnp.sum(lane, dtype=jnp.uint32) for lane in lanes])  # XLA: partial sums


def _sum_by_halves(x: jax.Array) -> jax.Array:
  """The sum of uint32 ``x`` (mod 2**32) by adding halves, then their halves, along each axis.

  Elementwise adds instead of one integer reduction, which XLA's CPU backend does not
  vectorise: about 8x faster there on a 2048 x 2048 leaf.
  """
  for axis in range(x.ndim):
    while x.shape[axis] > 1:
      size = x.shape[axis]
      half = size // 2
      summed = jax.lax.slice_in_dim(x, 0, half, axis=axis) + jax.lax.slice_in_dim(
        x, half, 2 * half, axis=axis
      )
      if size % 2:  # the odd last slice joins the first
        first = jax.lax.slice_in_dim(summed, 0, 1, axis=axis)
        first = first + jax.lax.slice_in_dim(x, size - 1, size, axis=axis)
        summed = jax.lax.concatenate(
          [first, jax.lax.slice_in_dim(summed, 1, half, axis=axis)], axis
        )
      x = summed
  return x.reshape(())


def _words(leaf: jax.Array) -> jax.Array:
  """The bits of ``leaf`` as uint32 words: ``leaf.shape`` (+ ``[2]`` for 8-byte elements)."""
  if jnp.issubdtype(leaf.dtype, jnp.complexfloating):
    leaf = jnp.stack([jnp.real(leaf), jnp.imag(leaf)], axis=-1)
  if leaf.dtype == jnp.bool_:
    return leaf.astype(jnp.uint32)
  if jnp.issubdtype(leaf.dtype, jnp.integer) and jnp.iinfo(leaf.dtype).bits < 8:
    leaf = leaf.astype(jnp.int8)  # int4 / uint4: exact
  size = leaf.dtype.itemsize
  if size >= 4:
    return jax.lax.bitcast_convert_type(leaf, jnp.uint32)  # 8 bytes: a trailing [2]
  unsigned = jnp.uint16 if size == 2 else jnp.uint8
  return jax.lax.bitcast_convert_type(leaf, unsigned).astype(jnp.uint32)


def _fmix32(x: jax.Array) -> jax.Array:
  """murmur3's 32-bit finaliser: a bijection whose every output bit depends on every input bit."""
  return mix32(x, (0x85EBCA6B, 0xC2B2AE35), 13)
