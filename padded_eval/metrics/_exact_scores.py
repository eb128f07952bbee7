"""The exact state of ``AUROC(exact=True)`` / ``AUPRC(exact=True)``: every counted element kept.

A :class:`ScoreBuffer` holds, per column (``L`` = 1 for binary, else ``num_classes``), the
float32 scores and 0/1 labels of the counted elements in a fixed-capacity buffer
``[L, capacity]``, filled from the front (``size [L]`` slots used, the rest zero). It
merges exactly: the other buffer's used slots are written after this one's (a gather,
``O(L * capacity)`` per merge, so per step), and elements that do not fit are counted in
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

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.exact._floats import compensated_suffix_sums, two_sum
from padded_eval.exact.accumulate import Accumulator, register_accumulator

MAX_CAPACITY = 1 << 29  # sizes of two merged buffers stay below 2**31


@register_accumulator
class ScoreBuffer(Accumulator):
  """Kept (score, label) elements per column.

  Attributes:
    scores: float32 ``[L, capacity]``; slots at and after ``size`` hold 0.
    labels: int8 ``[L, capacity]``: 1 positive, 0 negative (0 in unused slots).
    size: int32 ``[L]``: used slots, ``<= capacity``.
    dropped: int32 ``[L]``: elements that did not fit.
  """

  _fields = ("scores", "labels", "size", "dropped")
  _slots = (("scores", jnp.float32), ("labels", jnp.int8))  # the per-slot fields

  @classmethod
  def _of_fields(cls, fields: dict) -> ScoreBuffer:
    return cls._make(*(fields[name] for name in cls._fields))

  @classmethod
  def zeros(cls, columns: int, capacity: int) -> ScoreBuffer:
    zeros = jnp.zeros((columns,), jnp.int32)
    slots = {name: jnp.zeros((columns, capacity), dtype) for name, dtype in cls._slots}
    return cls._of_fields({**slots, "size": zeros, "dropped": zeros})

  @classmethod
  def of(cls, scores, truth, valid, capacity: int, weights=None) -> ScoreBuffer:
    """The buffer of one batch's elements ``[..., L]`` (``valid`` ones only; ``weights``
    float ``[..., L]`` for a :class:`WeightedScoreBuffer`)."""
    columns = scores.shape[-1]
    values = {
      "scores": jnp.reshape(scores, (-1, columns)).astype(jnp.float32) + 0.0,  # -0.0 -> 0.0
      "labels": jnp.reshape(truth, (-1, columns)).astype(jnp.int8),
    }
    if weights is not None:
      values["weights"] = jnp.reshape(weights, (-1, columns)).astype(jnp.float32)
    valid = jnp.reshape(valid, (-1, columns))
    position = jnp.cumsum(valid.astype(jnp.int32), axis=0) - 1  # [n, L]
    count = jnp.sum(valid.astype(jnp.int32), axis=0)
    slot = jnp.where(valid, position, capacity)  # out of range: not written
    column = jnp.broadcast_to(jnp.arange(columns), slot.shape)
    empty = cls.zeros(columns, capacity)
    kept = {
      name: getattr(empty, name).at[column, slot].set(values[name], mode="drop")
      for name, _ in cls._slots
    }
    size = jnp.minimum(count, capacity)
    return cls._of_fields({**kept, "size": size, "dropped": count - size})

  @property
  def capacity(self) -> int:
    return self.scores.shape[-1]

  def merge(self, other: ScoreBuffer) -> ScoreBuffer:
    capacity = self.capacity
    slots = jnp.broadcast_to(jnp.arange(capacity), self.scores.shape)
    source = slots - self.size[..., None]  # slot j takes other's j - size
    taken = (source >= 0) & (source < other.size[..., None])
    index = jnp.clip(source, 0, capacity - 1)
    kept = {
      name: jnp.where(
        taken, jnp.take_along_axis(getattr(other, name), index, -1), getattr(self, name)
      )
      for name, _ in self._slots
    }
    total = self.size + other.size
    size = jnp.minimum(total, capacity)
    dropped = self.dropped + other.dropped + (total - size)
    return self._of_fields({**kept, "size": size, "dropped": dropped})

  def reduce(self, axis_name) -> ScoreBuffer:
    """Every device's buffer gathered and folded (every device gets the whole).

    The gather is a ``psum`` of each buffer written into its own row of a zero
    ``[devices, ...]`` stack (exact: every other row adds zero), so its result is known to be
    the same on every device (what ``shard_map``'s replication check asks of ``P()``).
    """
    devices = jax.lax.psum(1, axis_name)
    me = jax.lax.axis_index(axis_name)

    def gathered(x):
      stack = jnp.zeros((devices,) + x.shape, x.dtype).at[me].set(x)
      return jax.lax.psum(stack, axis_name)

    return jax.tree.map(gathered, self).aggregate()

  def aggregate(self) -> ScoreBuffer:
    """The buffers stacked on a leading axis, folded into one."""
    parts = self
    if any(_on_several_devices(x) for x in jax.tree.leaves(self)):
      parts = jax.device_get(self)  # eager parts over several devices: fold on the host
    folded = jax.tree.map(lambda x: x[0], parts)
    for i in range(1, parts.size.shape[0]):
      folded = folded.merge(jax.tree.map(lambda x, i=i: x[i], parts))
    return folded

  def _combine(self, total, maximum, n):
    del total, maximum, n
    raise ValueError(
      "a ScoreBuffer is combined by gathering, not summing: use reduce(axis_name) or aggregate()"
    )

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

  def pooled(self, included: np.ndarray) -> ScoreBuffer:
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
    return self._of_fields({**kept, "size": size[None], "dropped": jnp.sum(self.dropped)[None]})


@register_accumulator
class WeightedScoreBuffer(ScoreBuffer):
  """A :class:`ScoreBuffer` that keeps each element's sample weight too (``weighted=True``).

  Attributes:
    weights: float32 ``[L, capacity]``, each kept element's weight (> 0; 0 in unused slots).
  """

  _fields = ("scores", "labels", "weights", "size", "dropped")
  _slots = ScoreBuffer._slots + (("weights", jnp.float32),)


def _on_several_devices(x) -> bool:
  """Whether ``x`` is a concrete array held by more than one local device (not a tracer)."""
  return (
    isinstance(x, jax.Array)
    and not isinstance(x, jax.core.Tracer)
    and x.is_fully_addressable
    and len(x.sharding.device_set) > 1
  )


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
  unused = (index >= buffer.size[..., None]).astype(jnp.int32)
  labels = buffer.labels.astype(jnp.int32)
  kept_weights = getattr(buffer, "weights", None)
  weights = jnp.ones_like(buffer.scores) if kept_weights is None else kept_weights
  unused, scores, labels, weights = jax.lax.sort(
    (unused, buffer.scores, labels, weights), num_keys=3
  )
  used = unused == 0
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
  weight sums, compensated)."""
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
