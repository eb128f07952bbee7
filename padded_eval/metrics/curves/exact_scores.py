"""The exact state of ``AUROC(exact=True)`` / ``AUPRC(exact=True)``: every counted element kept.

A :class:`ScoreBuffer` holds, per column (``L`` = 1 for binary, else ``num_classes``), the
float32 scores and 0/1 labels of the counted elements in a fixed-capacity buffer
``[L, capacity]``, filled from the front (``size [L]`` slots used, the rest zero). One
batch's buffer holds only as many slots as the batch has elements per column (its static
``limit`` is still ``capacity``), so that merging it into a total writes those slots alone (a
scatter, ``O(L * batch elements)`` per step, not ``O(L * capacity)``); two batches' buffers merge
into one of ``capacity`` slots. Elements that do not fit are counted in
``dropped [L]`` (reported as invalid, and the value is then NaN), never lost silently. It
reduces across devices by gathering the buffers (``all_gather``: ``devices`` times the
state, once, at the end) and folding them, and aggregates a stacked axis the same way.
The buffer is a set, not a sequence: the area depends only on the (score, label) pairs
it holds, so merging in any order or tree gives the same value, bit for bit.

The areas are computed once, at the end: each column is sorted by (score, label), tied
scores form one group (``-0.0`` equals ``0.0``, as in scikit-learn), and

* AUROC ``= sum_{positives} (2 * N_below + N_tied) / (2 * P * N)``, ``N_below`` the negatives
  of lower score, ``N_tied`` those of equal score (scikit-learn's trapezoid over distinct
  thresholds counts a tied pair as half);
* average precision ``= sum_{positives} precision(s) / P``, ``precision(s)`` the precision
  of the threshold ``score >= s`` (scikit-learn's ``average_precision_score``).

The terms are exact integers below ``2**24`` (up to 8M elements per column; above they are
rounded to float32 once, relatively ``< 6e-8``, all of one sign) or one float32 division,
summed with error-free pairwise steps (:func:`compensated_sum`), so the error against
scikit-learn stays at float32 rounding of the final division (``~1e-7``).

Sample weights (``weighted=True``): a :class:`WeightedScoreBuffer` keeps each element's
float32 weight beside its score; the group counts become weight sums (compensated prefix
sums, one rounding each), AUROC ``= sum_{positives} w (2 * W_below + W_tied) / (2 * P * N)``
and average precision ``= sum_{positives} w * precision(s) / P`` in weighted terms
(scikit-learn's ``sample_weight``), within float32 rounding (~1e-7 relative per sum).

Memory: ``5 * L * capacity`` bytes (float32 score, int8 label; ``9 *`` with weights) plus ``8 * L``; under pmap /
shard_map every device carries one buffer of the full capacity (its own rows end up in
the first slots), and the final reduce gathers ``devices`` of them once. The sort at the
end is ``O(L * capacity * log(capacity))``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.exact._floats import compensated_suffix_sums, scaled_to_unit, two_sum
from padded_eval.exact.accumulate import GatheredBuffer

MAX_CAPACITY = 1 << 29  # sizes of two merged buffers stay below 2**31


def _register_buffer(cls):
  """Registers a :class:`ScoreBuffer` class as a pytree whose static part is its ``limit``."""

  def flatten_with_keys(buffer):
    return [(jax.tree_util.GetAttrKey(f), getattr(buffer, f)) for f in cls._fields], buffer.limit

  def unflatten(limit, children):
    buffer = object.__new__(cls)
    for name, child in zip(cls._fields, children):
      object.__setattr__(buffer, name, child)
    object.__setattr__(buffer, "limit", limit)
    return buffer

  jax.tree_util.register_pytree_with_keys(
    cls,
    flatten_with_keys,
    unflatten,
    flatten_func=lambda buffer: ([getattr(buffer, f) for f in cls._fields], buffer.limit),
  )
  return cls


@_register_buffer
class ScoreBuffer(GatheredBuffer):
  """Kept (score, label) elements per column.

  Attributes:
    scores: float32 ``[L, capacity]``; slots at and after ``size`` hold 0.
    labels: int8 ``[L, capacity]``: 1 positive, 0 negative (0 in unused slots).
    size: int32 ``[L]``: used slots, ``<= capacity``.
    dropped: int32 ``[L]``: elements that did not fit.
  """

  _fields = ("scores", "labels", "size", "dropped")
  scores: jax.Array
  labels: jax.Array
  size: jax.Array
  dropped: jax.Array
  _slots: tuple[tuple[str, Any], ...] = (
    ("scores", jnp.float32),
    ("labels", jnp.int8),
  )  # the per-slot fields
  limit: int  # static: the capacity a merge fills (a batch's buffer may hold fewer slots)

  @classmethod
  def _of_fields(cls, fields: dict, limit: int) -> ScoreBuffer:
    buffer = cls._make(*(fields[name] for name in cls._fields))
    object.__setattr__(buffer, "limit", int(limit))
    return buffer

  @classmethod
  def zeros(cls, columns: int, capacity: int) -> ScoreBuffer:
    zeros = jnp.zeros((columns,), jnp.int32)
    slots = {name: jnp.zeros((columns, capacity), dtype) for name, dtype in cls._slots}
    return cls._of_fields({**slots, "size": zeros, "dropped": zeros}, capacity)

  @classmethod
  def of(cls, scores, truth, valid, capacity: int, weights=None) -> ScoreBuffer:
    """The buffer of one batch's elements ``[..., L]`` (``valid`` ones only; ``weights``
    float ``[..., L]`` for a :class:`WeightedScoreBuffer`).

    Its ``limit`` is ``capacity``, and it holds ``min(n, capacity)`` slots per column, ``n`` the
    batch's elements per column: merging it into a total writes those slots only, so a step
    costs ``O(L * n)``, not ``O(L * capacity)``.
    """
    columns = scores.shape[-1]
    values = {
      "scores": jnp.reshape(scores, (-1, columns)).astype(jnp.float32) + 0.0,  # -0.0 -> 0.0
      "labels": jnp.reshape(truth, (-1, columns)).astype(jnp.int8),
    }
    if weights is not None:
      values["weights"] = jnp.reshape(weights, (-1, columns)).astype(jnp.float32)
    valid = jnp.reshape(valid, (-1, columns))
    slots = min(valid.shape[0], capacity)
    position = jnp.cumsum(valid.astype(jnp.int32), axis=0) - 1  # [n, L]
    count = jnp.sum(valid.astype(jnp.int32), axis=0)
    slot = jnp.where(valid, position, slots)  # out of range: not written
    column = jnp.broadcast_to(jnp.arange(columns), slot.shape)
    empty = cls.zeros(columns, slots)
    kept = {
      name: getattr(empty, name).at[column, slot].set(values[name], mode="drop")
      for name, _ in cls._slots
    }
    size = jnp.minimum(count, slots)
    return cls._of_fields({**kept, "size": size, "dropped": count - size}, capacity)

  @property
  def capacity(self) -> int:
    """The slots this buffer holds (``limit`` for a total; a batch's may hold fewer)."""
    return self.scores.shape[-1]

  def full_shapes(self) -> tuple[tuple[int, ...], ...]:
    """The fields' shapes in a total: the slot axis at ``limit``."""
    slot_fields = {name for name, _ in self._slots}
    return tuple(
      np.shape(getattr(self, f))[:-1] + (self.limit,)
      if f in slot_fields
      else np.shape(getattr(self, f))
      for f in self._fields
    )

  def trimmed(self) -> ScoreBuffer:
    """The buffer cut to a power of two of slots at least its fullest column's (host values; a
    traced buffer is returned as it is): the final sort then costs what the elements need, not
    the capacity (one compiled compute per power of two). The ``limit`` is kept."""
    if any(isinstance(getattr(self, f), jax.core.Tracer) for f in self._fields):
      return self
    used = int(np.max(np.asarray(self.size), initial=0))
    slots = 1 << max(used - 1, 0).bit_length()
    if slots >= self.capacity:
      return self
    cut = {name: getattr(self, name)[..., :slots] for name, _ in self._slots}
    return self._of_fields({**cut, "size": self.size, "dropped": self.dropped}, self.limit)

  def merge(self, other: ScoreBuffer) -> ScoreBuffer:
    """Both buffers' elements in one of ``limit`` slots: the smaller's used slots written after
    the larger's (a scatter of the smaller's slots: ``O(L * slots)``); elements beyond ``limit``
    are counted in ``dropped``."""
    if other.limit != self.limit:
      raise ValueError(
        f"cannot merge score buffers of capacity {self.limit} and {other.limit} (configure "
        "both metrics with the same capacity)"
      )
    total, part = (self, other) if self.capacity >= other.capacity else (other, self)
    limit = self.limit
    if total.capacity < limit:  # two batches' buffers: the total gets its every slot
      pad = [(0, 0)] * (total.scores.ndim - 1) + [(0, limit - total.capacity)]
      total = total._of_fields(
        {
          **{name: jnp.pad(getattr(total, name), pad) for name, _ in self._slots},
          "size": total.size,
          "dropped": total.dropped,
        },
        limit,
      )
    source = jnp.broadcast_to(jnp.arange(part.capacity), part.scores.shape)
    target = jnp.where(source < part.size[..., None], total.size[..., None] + source, limit)
    rows = jnp.broadcast_to(jnp.arange(part.scores.shape[0])[:, None], target.shape)
    kept = {
      name: jnp.asarray(getattr(total, name)).at[rows, target].set(getattr(part, name), mode="drop")
      for name, _ in self._slots
    }
    count = total.size + part.size
    size = jnp.minimum(count, limit)
    dropped = total.dropped + part.dropped + (count - size)
    return self._of_fields({**kept, "size": size, "dropped": dropped}, limit)

  def label_counts(self) -> tuple[jax.Array, jax.Array]:
    """float32 ``(positives [L], negatives [L])`` kept (weighted: their weights' sums)."""
    used = jnp.broadcast_to(jnp.arange(self.capacity), self.labels.shape) < self.size[..., None]
    weights = getattr(self, "weights", None)
    if weights is not None:
      positive, negative = used & (self.labels == 1), used & (self.labels == 0)
      return (
        compensated_sum(jnp.where(positive, weights, 0.0)),
        compensated_sum(jnp.where(negative, weights, 0.0)),
      )
    positives = jnp.sum(used & (self.labels == 1), -1)
    return positives.astype(jnp.float32), (self.size - positives).astype(jnp.float32)

  def pooled(self, included: np.ndarray | jax.Array) -> ScoreBuffer:
    """One column of every ``included`` column's elements (the micro average)."""
    slots = jnp.broadcast_to(jnp.arange(self.capacity), self.labels.shape)
    used = (slots < self.size[..., None]) & jnp.asarray(included)[:, None]
    flat = lambda x: jnp.reshape(x, (1, -1))
    size = jnp.sum(used.astype(jnp.int32))
    order = jnp.argsort(~flat(used), axis=-1, stable=True)  # used slots first
    take = lambda x: jnp.take_along_axis(flat(x), order, -1)
    used_slots = jnp.arange(order.shape[-1])[None, :] < size
    kept = {
      name: jnp.where(used_slots, take(getattr(self, name)), jnp.zeros((), dtype))
      for name, dtype in self._slots
    }
    pooled = {**kept, "size": size[None], "dropped": jnp.sum(self.dropped)[None]}
    return self._of_fields(pooled, order.shape[-1])


@_register_buffer
class WeightedScoreBuffer(ScoreBuffer):
  """A :class:`ScoreBuffer` that keeps each element's sample weight too (``weighted=True``).

  Attributes:
    weights: float32 ``[L, capacity]``, each kept element's weight (> 0; 0 in unused slots).
  """

  _fields = ("scores", "labels", "weights", "size", "dropped")
  weights: jax.Array
  _slots = ScoreBuffer._slots + (("weights", jnp.float32),)


def compensated_sum(x: jax.Array) -> jax.Array:
  """float32 sum over the last axis by pairwise error-free additions (``two_sum``)."""
  width = x.shape[-1]
  size = 1 << max(width - 1, 0).bit_length()
  hi = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, size - width)])
  lo = jnp.zeros_like(hi)
  while hi.shape[-1] > 1:
    s, e = two_sum(hi[..., 0::2], hi[..., 1::2])
    lo = lo[..., 0::2] + lo[..., 1::2] + e
    hi = s
  return hi[..., 0] + lo[..., 0]


class Groups(NamedTuple):
  """Per sorted element ``[L, capacity]`` (ascending scores; unused slots last), the counts of
  its group of tied scores.

  Attributes:
    positive, negative: bool, the element is a used positive / negative.
    first: bool, the element is the first (used) element of its group.
    negatives_below, positives_below: int32, used elements of lower score (float32 sums of
      their weights for a :class:`WeightedScoreBuffer`).
    negatives_tied, positives_tied: int32, used elements of the element's score (weighted:
      float32 sums).
    weight: float32, the element's weight (1 unweighted; 0 in unused slots).
  """

  positive: jax.Array
  negative: jax.Array
  first: jax.Array
  negatives_below: jax.Array
  positives_below: jax.Array
  negatives_tied: jax.Array
  positives_tied: jax.Array
  weight: jax.Array


def _prefix_sums(x: jax.Array) -> jax.Array:
  """float32 inclusive prefix sums along the last axis, compensated (one rounding each)."""
  hi, lo = compensated_suffix_sums(jnp.flip(x, -1))
  return jnp.flip(hi + lo, -1)


def groups(buffer: ScoreBuffer) -> Groups:
  """The :class:`Groups` of the buffer's sorted elements.

  Written over the whole ``[L, capacity]`` buffer (no ``vmap``: eager use on arrays of a
  ``jax.make_mesh`` mesh then stays op by op on their sharding).
  """
  capacity = buffer.capacity
  index = jnp.broadcast_to(jnp.arange(capacity), buffer.scores.shape)
  labels = buffer.labels.astype(jnp.int32)
  kept_weights = getattr(buffer, "weights", None)
  weights = jnp.ones_like(buffer.scores) if kept_weights is None else kept_weights
  # Unused slots get a NaN score, which sorts after every kept one (kept scores are never NaN):
  # two sort keys instead of three (the sort is most of compute()'s time).
  keyed = jnp.where(index < buffer.size[..., None], buffer.scores, jnp.nan)
  scores, labels, weights = jax.lax.sort((keyed, labels, weights), num_keys=2)
  unused = jnp.isnan(scores).astype(jnp.int32)
  used = unused == 0
  if kept_weights is not None:
    # The areas are ratios of weight sums: each column's weights times the power of two that
    # brings the largest into [0.5, 1) (exact), so products of sums neither overflow (weights
    # of 1e18) nor underflow (1e-25).
    weights = scaled_to_unit(jnp.where(used, weights, 0.0), -1)[0]
  positive, negative = used & (labels == 1), used & (labels == 0)
  differs = (scores[..., 1:] != scores[..., :-1]) | (unused[..., 1:] != unused[..., :-1])
  first = jnp.ones(differs.shape[:-1] + (1,), bool)
  starts = jnp.concatenate([first, differs], -1)
  ends = jnp.concatenate([differs, first], -1)
  start = jax.lax.cummax(jnp.where(starts, index, 0), axis=index.ndim - 1)
  end = jax.lax.cummin(jnp.where(ends, index, capacity - 1), axis=index.ndim - 1, reverse=True)
  at = lambda x, i: jnp.take_along_axis(x, i, -1)
  if kept_weights is None:  # exact int32 counts
    negative_part, positive_part, cumulative = negative, positive, lambda x: jnp.cumsum(x, -1)
  else:  # weight sums, compensated
    negative_part = jnp.where(negative, weights, 0.0)
    positive_part = jnp.where(positive, weights, 0.0)
    cumulative = _prefix_sums
  negatives, positives = cumulative(negative_part), cumulative(positive_part)
  zero = jnp.zeros_like(negatives[..., :1])
  before = lambda x: jnp.concatenate([zero, x[..., :-1]], -1)  # exclusive: nothing subtracted
  below, positives_below = at(before(negatives), start), at(before(positives), start)
  return Groups(
    positive,
    negative,
    starts & used,
    below,
    positives_below,
    at(negatives, end) - below,
    at(positives, end) - positives_below,
    jnp.where(used, weights, 0.0),
  )


def totals(g: Groups) -> tuple[jax.Array, jax.Array]:
  """float32 ``(P [L, 1], N [L, 1])``: the used positives' and negatives' counts (weighted:
  weight sums, compensated, of the column's weights scaled by a power of two)."""
  return (
    compensated_sum(jnp.where(g.positive, g.weight, 0.0))[..., None],
    compensated_sum(jnp.where(g.negative, g.weight, 0.0))[..., None],
  )


def auroc(buffer: ScoreBuffer) -> jax.Array:
  """float32 ``[L]`` exact AUROC per column, NaN without positives or negatives, or with
  dropped elements."""
  g = groups(buffer)
  positive, below, tied = g.positive, g.negatives_below, g.negatives_tied
  p, n = (x[..., 0] for x in totals(g))
  if hasattr(buffer, "weights"):  # each positive's weight times its weighted negatives
    terms = g.weight * (2 * below + tied)
  else:  # exact integers below 2**24
    terms = (2 * below + tied).astype(jnp.float32)
  twice = compensated_sum(jnp.where(positive, terms, 0.0))
  area = twice / jnp.where(p * n > 0, 2.0 * p * n, 1.0)
  return jnp.where((p > 0) & (n > 0) & (buffer.dropped == 0), area, jnp.nan)


def average_precision(buffer: ScoreBuffer) -> jax.Array:
  """float32 ``[L]`` exact average precision per column, NaN without positives, or with
  dropped elements."""
  g = groups(buffer)
  positive, negative, below, positives_below = (
    g.positive,
    g.negative,
    g.negatives_below,
    g.positives_below,
  )
  if hasattr(buffer, "weights"):  # weight sums: a positive's own weight is > 0
    p, n = totals(g)
    true_pos, false_pos = p - positives_below, n - below  # score >= the element's score
    tiny = jnp.finfo(jnp.float32).tiny
    precision = g.weight * true_pos / jnp.maximum(true_pos + false_pos, tiny)
  else:
    p, n = jnp.sum(positive, -1, keepdims=True), jnp.sum(negative, -1, keepdims=True)
    true_pos, false_pos = p - positives_below, n - below  # score >= the element's score
    precision = true_pos.astype(jnp.float32) / jnp.maximum(true_pos + false_pos, 1)
  total = compensated_sum(jnp.where(positive, precision, 0.0))
  p = p[..., 0].astype(jnp.float32)
  return jnp.where((p > 0) & (buffer.dropped == 0), total / jnp.where(p > 0, p, 1.0), jnp.nan)
