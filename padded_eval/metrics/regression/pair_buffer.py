"""The exact state of the rank correlations: every counted ``(preds, target)`` pair kept.

Ranks are not sufficient statistics: the rank of one element depends on every other
element of the dataset, so no sum over batches gives them. :class:`PairBuffer` keeps the
counted pairs instead, per output column (``L`` columns), in a fixed-capacity buffer
``[L, capacity, 2]`` filled from the front (``size [L]`` slots used, the rest zero). It
merges exactly: the other buffer's used slots are written after this one's (a gather,
``O(L * capacity)`` per merge), and pairs that do not fit are counted in ``dropped [L]``
(reported as invalid; the value is then NaN), never lost silently. It reduces across
devices by gathering the buffers (``devices`` times the state, once, at the end) and folding
them. The buffer is a set: the correlations depend only on the pairs it holds, so any
merge order or tree gives the same value, bit for bit.

Memory: ``8 * L * capacity`` bytes (two float32 per pair) plus ``8 * L``; under pmap /
shard_map every device carries one buffer of the full capacity. The values are computed
once, at the end, by sorting: :func:`average_ranks` (``O(capacity log capacity)``) and
:func:`kendall_terms` (``O(capacity log^2 capacity)``, a bottom-up merge count of the
discordant pairs, memory ``O(L * capacity)``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from padded_eval.exact._floats import compensated_sum
from padded_eval.exact.accumulate import (
  GatheredBuffer,
  register_accumulator,
)
from padded_eval.masking import leading_ones

MAX_CAPACITY = 1 << 23  # per-slot counts stay exact in float32, merged sizes fit int32


@register_accumulator
class PairBuffer(GatheredBuffer):
  """Kept ``(x, y)`` pairs per column.

  Attributes:
    pairs: float32 ``[L, capacity, 2]``; slots at and after ``size`` hold 0.
    size: int32 ``[L]``: used slots, ``<= capacity``.
    dropped: int32 ``[L]``: pairs that did not fit.
  """

  _fields = ("pairs", "size", "dropped")
  pairs: jax.Array
  size: jax.Array
  dropped: jax.Array

  @classmethod
  def zeros(cls, columns: int, capacity: int) -> PairBuffer:
    zeros = jnp.zeros((columns,), jnp.int32)
    return cls._make(jnp.zeros((columns, capacity, 2), jnp.float32), zeros, zeros)

  @classmethod
  def of(cls, x, y, valid, capacity: int) -> PairBuffer:
    """The buffer of one batch's pairs ``x``, ``y``, ``valid`` ``[n, L]`` (valid ones only)."""
    columns = x.shape[-1]
    pairs = jnp.stack([x, y], -1).astype(jnp.float32) + 0.0  # -0.0 -> 0.0
    position = jnp.cumsum(valid.astype(jnp.int32), axis=0) - 1  # [n, L]
    count = jnp.sum(valid.astype(jnp.int32), axis=0)
    slot = jnp.where(valid, position, capacity)  # out of range: not written
    column = jnp.broadcast_to(jnp.arange(columns), slot.shape)
    kept = cls.zeros(columns, capacity).pairs.at[column, slot].set(pairs, mode="drop")
    size = jnp.minimum(count, capacity)
    return cls._make(kept, size, count - size)

  @property
  def capacity(self) -> int:
    return self.pairs.shape[-2]

  def merge(self, other: PairBuffer) -> PairBuffer:
    capacity = self.capacity
    source = (
      leading_ones(jnp.arange(capacity), self.size.ndim) - self.size[..., None]
    )  # slot j takes other's j - size
    taken = (source >= 0) & (source < other.size[..., None])
    index = jnp.clip(source, 0, capacity - 1)[..., None]
    moved = jnp.take_along_axis(other.pairs, index, -2)
    pairs = jnp.where(taken[..., None], moved, self.pairs)
    total = self.size + other.size
    size = jnp.minimum(total, capacity)
    return self._make(pairs, size, self.dropped + other.dropped + (total - size))

  def used(self) -> jax.Array:
    """bool ``[L, capacity]``: the slots holding a pair."""
    return leading_ones(jnp.arange(self.capacity), self.size.ndim) < self.size[..., None]


def _group_bounds(starts: jax.Array, ends: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per sorted slot ``[L, n]``, the first and last slot of its group of ties."""
  n = starts.shape[-1]
  index = jnp.broadcast_to(jnp.arange(n), starts.shape)
  first = jax.lax.cummax(jnp.where(starts, index, 0), axis=index.ndim - 1)
  last = jax.lax.cummin(jnp.where(ends, index, n - 1), axis=index.ndim - 1, reverse=True)
  return first, last


def _boundaries(differs: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(starts, ends)`` of the groups, from ``differs [L, n - 1]`` (slot i+1 differs from i)."""
  edge = jnp.ones(differs.shape[:-1] + (1,), bool)
  return jnp.concatenate([edge, differs], -1), jnp.concatenate([differs, edge], -1)


def _sorted_ties(used: jax.Array, keys: tuple[jax.Array, ...], carry: tuple[jax.Array, ...]):
  """Sorts ``[L, n]`` by (unused last, ``keys``...) and returns ``(first, last, sorted carry)``:
  per sorted slot the bounds of its group of equal keys (unused slots form their own group)."""
  unused = (~used).astype(jnp.int32)
  out = jax.lax.sort((unused, *keys, *carry), num_keys=1 + len(keys))
  unused, keys, carry = out[0], out[1 : 1 + len(keys)], out[1 + len(keys) :]
  differs = unused[..., 1:] != unused[..., :-1]
  for key in keys:
    differs = differs | (key[..., 1:] != key[..., :-1])
  first, last = _group_bounds(*_boundaries(differs))
  return first, last, unused == 0, keys, carry


def average_ranks(values: jax.Array, used: jax.Array) -> jax.Array:
  """float32 ``[L, n]``: 1-based ranks of ``values`` among the used slots of each row, tied
  values sharing the mean of their ranks (``scipy.stats.rankdata(method="average")``);
  0 in unused slots."""
  index = jnp.broadcast_to(jnp.arange(values.shape[-1], dtype=jnp.int32), values.shape)
  first, last, used_sorted, _, (origin,) = _sorted_ties(used, (values,), (index,))
  ranks = jnp.where(used_sorted, (first + last).astype(jnp.float32) / 2.0 + 1.0, 0.0)
  _, back = jax.lax.sort((origin, ranks), num_keys=1)  # back to the slots' order
  return back


def _before_in_group(first: jax.Array, used: jax.Array) -> jax.Array:
  """int32 ``[L, n]``: per sorted used slot the used slots before it in its group of ties
  (a row sums to ``sum_groups t (t - 1) / 2``, the tied pairs)."""
  index = jnp.broadcast_to(jnp.arange(first.shape[-1], dtype=jnp.int32), first.shape)
  return jnp.where(used, index - first, 0)


def _partial(terms: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The error-free ``(hi, lo)`` sum over the last axis of int32 terms (each exact in float32:
  even integers below ``2**25``, which holds while ``capacity <= 2**23``)."""
  return compensated_sum(terms.astype(jnp.float32), axis=-1)


def _total(parts: list[tuple[jax.Array, jax.Array]]) -> jax.Array:
  """float32 ``[L]``: the partial sums' own compensated sum, rounded once."""
  hi, lo = compensated_sum(jnp.stack([x for pair in parts for x in pair], -1), axis=-1)
  return hi + lo


def _discordant(ranks: jax.Array) -> list[tuple[jax.Array, jax.Array]]:
  """``-2 x`` the number of pairs ``i < j`` with ``ranks[i] > ranks[j]`` (strict) of ``ranks
  [L, 2**m]``, as one partial sum per level of a bottom-up merge sort.

  At level ``h`` the sorted blocks of ``h`` are paired; sorting a pair (left first among
  equals) puts a right element at ``(left ones <= it) + (its index in the right block)``,
  so ``origin - position`` summed over the right elements counts the left ones above them.
  Each level is summed as it is formed: memory ``O(L * 2**m)``.
  """
  rows, n = ranks.shape
  parts, h = [], 1
  while h < n:
    blocks = ranks.reshape(rows, n // (2 * h), 2 * h)
    origin = jnp.broadcast_to(jnp.arange(2 * h, dtype=jnp.int32), blocks.shape)
    blocks, origin = jax.lax.sort((blocks, origin), num_keys=2)
    position = jnp.broadcast_to(jnp.arange(2 * h, dtype=jnp.int32), origin.shape)
    above = jnp.where(origin >= h, origin - position, 0).reshape(rows, n)
    parts.append(_partial(-2 * above))
    ranks, h = blocks.reshape(rows, n), 2 * h
  return parts


def kendall_terms(buffer: PairBuffer) -> tuple[jax.Array, jax.Array, jax.Array]:
  """float32 ``[L]`` each: ``(concordant - discordant, pairs untied in x, pairs untied in y)``,
  so that tau-b ``= first / sqrt(second * third)`` (``scipy.stats.kendalltau``).

  Every count is a sum of exact int32 per-slot terms, summed error-free (one rounding):
  untied in x ``= sum_i first_x(i)`` (the used slots before ``i``'s group sorted by x),
  and ``concordant - discordant = untied_x - ties_y + ties_xy - 2 * discordant``.
  """
  x, y = buffer.pairs[..., 0], buffer.pairs[..., 1]
  used = buffer.used()
  above = jnp.float32(buffer.capacity + 1)  # above every rank: unused slots
  first_x, _, used_x, _, _ = _sorted_ties(used, (x,), ())
  first_y, _, used_y, _, _ = _sorted_ties(used, (y,), ())
  y_ranks = jnp.where(used, average_ranks(y, used), above)
  first_xy, _, used_xy, _, (key,) = _sorted_ties(used, (x, y), (y_ranks,))
  width = 1 << max(buffer.capacity - 1, 0).bit_length()
  key = jnp.pad(key, ((0, 0), (0, width - buffer.capacity)), constant_values=above)
  untied_x = jnp.where(used_x, first_x, 0)
  untied_y = jnp.where(used_y, first_y, 0)
  ties_y = _before_in_group(first_y, used_y)
  ties_xy = _before_in_group(first_xy, used_xy)
  untied = _partial(untied_x)
  score = _total([untied, _partial(-ties_y), _partial(ties_xy), *_discordant(key)])
  return score, _total([untied]), _total([_partial(untied_y)])
