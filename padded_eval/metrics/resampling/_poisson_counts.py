"""Counter-based Poisson(1) counts: a pure function of ``(seed, replica, row id)``.

The bootstrap (:class:`padded_eval.metrics.resampling.bootstrap.Bootstrap`) weights row ``i`` in
replica ``r`` by a Poisson(1) count. Drawing it from a stateful key would tie the
count to the batch the row happens to sit in; hashing the row's id instead makes the
count of every (replica, row) pair independent of batch size, batch order, padding,
device count and host count.

The hash, exactly (all arithmetic on uint32, wrapping; ``>>`` is a logical shift):

* ``mix32(x)``: ``x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B;
  x ^= x >> 16`` (a bijection of uint32 with good avalanche);
* ``seed_key = mix32(seed ^ 0x9E3779B9)``; ``replica_key = mix32(seed_key ^ r)``;
* ``u = mix32(mix32(index ^ replica_key) + replica_key)``, with ``index`` the row id
  (int32, reinterpreted as uint32).

The count is the inverse CDF of Poisson(1) at ``u / 2**32``:
``count = #{k >= 0 : u >= T_k}`` with ``T_k = floor(2**32 * P(X <= k))`` for the
``k`` whose ``T_k < 2**32 - 1`` (``k <= 11``), so counts lie in ``0..12`` and
``P(count = k)`` is the Poisson(1) probability to within ``2**-32``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

#: Counts are at most this (the inverse CDF from 32 bits cannot reach 13).
MAX_COUNT = 12
#: Bits of a count: replicas of counting metrics take one masked update per bit.
COUNT_BITS = 4

_GOLDEN = 0x9E3779B9


def poisson_thresholds() -> np.ndarray:
  """uint32 ``[MAX_COUNT]``: ``T_k = floor(2**32 * P(X <= k))`` for Poisson(1), ``k < 12``."""
  thresholds, cdf, term = [], 0.0, math.exp(-1.0)
  for k in range(64):
    cdf += term
    term /= k + 1
    threshold = math.floor(cdf * 2.0**32)
    if threshold >= 2**32 - 1:
      break
    thresholds.append(threshold)
  return np.asarray(thresholds, np.uint32)


def mix32(
  x: jax.Array, multipliers: tuple[int, int] = (0x7FEB352D, 0x846CA68B), middle_shift: int = 15
) -> jax.Array:
  """The uint32 mixer of the module docstring (elementwise; a bijection): xor-shift 16, multiply,
  xor-shift ``middle_shift``, multiply, xor-shift 16. Other ``multipliers`` (odd) and
  ``middle_shift`` give other mixers of the same shape (murmur3's finaliser: ``(0x85EBCA6B,
  0xC2B2AE35)``, 13)."""
  first, second = multipliers
  x = x ^ (x >> 16)
  x = x * jnp.uint32(first)
  x = x ^ (x >> middle_shift)
  x = x * jnp.uint32(second)
  return x ^ (x >> 16)


def replica_keys(seed: int, num_replicas: int) -> jax.Array:
  """uint32 ``[num_replicas]``: ``mix32(mix32(seed ^ 0x9E3779B9) ^ r)`` for each replica ``r``."""
  seed_key = mix32(jnp.uint32(seed) ^ jnp.uint32(_GOLDEN))
  return mix32(seed_key ^ jnp.arange(num_replicas, dtype=jnp.uint32))


def uniform_bits(seed: int, num_replicas: int, index: jax.Array) -> jax.Array:
  """uint32 ``[num_replicas, B]``: the hash ``u`` of every (replica, row id) pair.

  Args:
    seed: an int in ``[0, 2**32)``.
    num_replicas: the number of replicas ``R``.
    index: int ``[B]`` row ids.
  """
  keys = replica_keys(seed, num_replicas)[:, None]
  ids = jnp.asarray(index).astype(jnp.int32).view(jnp.uint32)[None, :]
  return mix32(mix32(ids ^ keys) + keys)


def poisson_counts(seed: int, num_replicas: int, index: jax.Array) -> jax.Array:
  """int32 ``[num_replicas, B]``: the Poisson(1) count of every (replica, row id) pair.

  A pure function of ``(seed, r, index[i])``; see the module docstring for the hash.

  Args:
    seed: an int in ``[0, 2**32)``.
    num_replicas: the number of replicas ``R``.
    index: int ``[B]`` row ids (padding rows may hold anything, e.g. -1).

  Returns:
    Counts in ``0..MAX_COUNT``.
  """
  u = uniform_bits(seed, num_replicas, index)
  thresholds = jnp.asarray(poisson_thresholds())
  return jnp.searchsorted(thresholds, u, side="right", method="compare_all").astype(jnp.int32)


#: Digits of the row-id checksum (:func:`id_digits`): 4 bytes of each of two hashes.
ID_DIGITS = 8
_ID_SALTS = (0x85EBCA6B, 0xC2B2AE35)


def id_digits(index: jax.Array) -> jax.Array:
  """int32 ``[ID_DIGITS, B]``: the bytes of two hashes of every row id, ``mix32(id ^ salt)``.

  Summed over the real rows they are an order-free checksum of the set of ids (a
  Bootstrap keeps it, so two runs can be checked to be over the same examples): any
  batching, padding, device or host split gives the same sums, and two different id
  sets agree in all 8 sums only by accident (about one chance in ``10**20``).
  """
  ids = jnp.asarray(index).astype(jnp.int32).view(jnp.uint32)
  digits = []
  for salt in _ID_SALTS:
    hashed = mix32(ids ^ jnp.uint32(salt))
    digits += [((hashed >> (8 * k)) & 0xFF).astype(jnp.int32) for k in range(4)]
  return jnp.stack(digits)
