"""Row-wise comparisons of vectors: CosineSimilarity and KLDivergence (torchmetrics).

Each row (a vector on the last axis) gives one value; the metric is their (weighted) mean
or sum over the real rows, kept as two exact totals (the weighted-mean base of
:mod:`padded_eval.metrics.averages`), so it equals one pass over the data whatever the
batching, devices and hosts. torchmetrics' ``reduction="none"`` (one value per row) is no
fixed-size state: ask ``masked_eval(..., outputs=True)`` for per-row values instead.

Update keywords: ``preds``, ``target`` float ``[B, ..., D]`` of equal shape; ``mask`` and
``weights`` a prefix of ``[B, ...]`` (one per vector).
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from padded_eval import validation
from padded_eval.exact._floats import compensated_sum, exact_product, scaled_to_unit
from padded_eval.exact.accumulate import ExactCount, upcast
from padded_eval.masking import element_weights
from padded_eval.metrics.averages import WeightedMean, weighted_totals
from padded_eval.metrics.base import invalid_state, state

REDUCTIONS = ("mean", "sum")


def _vectors(preds, target) -> tuple[jax.Array, jax.Array]:
  preds, target = upcast(jnp.asarray(preds)), upcast(jnp.asarray(target))
  if preds.shape != target.shape or preds.ndim < 2:
    raise ValueError(
      f"preds and target must have the same shape [batch, ..., D] (a vector per row on the last "
      f"axis); got {preds.shape} and {target.shape}"
    )
  return preds, target


def _scaled(x: jax.Array) -> jax.Array:
  """Each vector (last axis) scaled exactly by a power of two, its largest magnitude in [0.5, 1)."""
  return scaled_to_unit(x, -1)[0]


class _RowReduction(WeightedMean):
  """A per-row value reduced by ``reduction``: ``"mean"`` (weighted) or ``"sum"`` (NaN, not
  torchmetrics' 0, when no row was seen, as every metric here); a row of nonzero weight whose
  value is NaN is counted in ``invalid`` under ``invalid_kinds[0]`` and makes the result NaN (a
  row of weight 0 is not seen)."""

  reduction: str = "mean"
  invalid: ExactCount = state(invalid_state)

  def _check_config(self):
    validation.check_choice("reduction", self.reduction, REDUCTIONS)

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    values, ref = self._values(preds=preds, target=target)
    real, w = element_weights(mask, weights, values.shape, ref)
    bad = real & (w != 0) & jnp.isnan(values)  # a row of weight 0 is not seen
    invalid = self.count_invalid(**{self.invalid_kinds[0]: bad})
    totals = weighted_totals(values, mask, weights, ref)
    return totals.then(lambda pair: {"total": pair[0], "weight": pair[1], "invalid": invalid})

  def compute(self) -> jax.Array:
    """float32 scalar: the (weighted) mean over real rows, or their sum; NaN if none."""
    if self.reduction == "sum":
      return jnp.where(self.weight.total() > 0, self.total.total(), jnp.nan)
    return self.total.ratio(self.weight)


class CosineSimilarity(_RowReduction):
  """Cosine similarity ``<p, t> / (|p| |t|)`` of each row's vectors, reduced over rows.

  Equals torchmetrics ``CosineSimilarity(reduction="mean" | "sum")``. Each vector is
  scaled by its largest magnitude first, so huge or tiny vectors neither overflow nor
  underflow. A real row with a zero vector (or NaN) has no similarity: it is counted in
  ``invalid`` (``"zero vector or nan"``) and makes the result NaN, as torchmetrics' 0 / 0 (a
  row of weight 0 is not seen).

  Args:
    reduction: ``"mean"`` (weighted by ``weights``) or ``"sum"`` over the real rows.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> preds = np.array([[1.0, 0.0], [1.0, 1.0]])
    >>> target = np.array([[1.0, 0.0], [1.0, 0.0]])
    >>> m = pe.metrics.CosineSimilarity().update(preds=preds, target=target)
    >>> round(float(m.compute()), 4)  # (1 + 1 / sqrt(2)) / 2
    0.8536
  """

  higher_is_better: ClassVar[bool | None] = True

  invalid_kinds: ClassVar[tuple[str, ...]] = ("zero vector or nan",)

  def _values(self, *, preds, target, **_):
    preds, target = _vectors(preds, target)
    p, t = _scaled(preds), _scaled(target)
    norms = jnp.sqrt(jnp.sum(p * p, -1)) * jnp.sqrt(jnp.sum(t * t, -1))
    return jnp.sum(p * t, -1) / norms, "preds"


def _kl_terms(p, q):
  """The terms ``p' log(p' / q') - p' + q'`` of the generalized KL divergence of the rows
  ``p' = p / sum(p)`` and ``q' = q / sum(q)`` (each term >= 0; their sum is KL; ``q'`` where
  ``p`` is 0, NaN where ``p < 0``).

  Summed as ``p' log(p' / q')``, nearly equal distributions lost the divergence to float32:
  its first-order terms cancel (``sum p' - q' = 0``), and the rounding of ``p'`` and ``q'``
  did not (KL of 5e-5 was off by 0.5%, of 5e-9 by 180 times). Here each term is
  ``p' g(d)`` with ``g(d) = d - log1p(d)`` (its Taylor series where ``|d| < 1/4``), second
  order in ``d = q' / p' - 1 = (q P - p Q) / (p Q)``, whose numerator is formed from exact
  products (`exact_product`) and compensated sums ``P``, ``Q``: ``d`` keeps its digits however
  close the rows are (what is left of the sums' rounding, the same in every term, cancels to
  first order).
  """
  (total_p, p_error), (total_q, q_error) = (
    (jnp.broadcast_to(part, x.shape) for part in compensated_sum(x, -1, keepdims=True))
    for x in (p, q)
  )
  (a, a_error), (b, b_error) = exact_product(q, total_p), exact_product(p, total_q)
  positive = p > 0
  numerator = (a - b) + ((a_error - b_error) + (q * p_error - p * q_error))  # q P - p Q
  d = numerator / jnp.where(positive, b, 1.0)
  p, q = p / total_p, q / total_q
  positive = p > 0  # one below float32's normal range reads 0 (flushed): its term is q'
  small = jnp.abs(d) < 0.25
  x = jnp.where(small, d, 0.0)
  series = jnp.full_like(x, 1 / 17)
  for k in range(16, 1, -1):  # g(d) = d**2 (1/2 - d (1/3 - d (1/4 - ...))), to 1e-10 of it
    series = 1 / k - x * series
  near = p * (x * x * series)
  moderate = jnp.where(small | (d > 1e6), 1.0, d)  # d - log1p(d) loses at most 8 eps
  far = jnp.where(
    d > 1e6,  # q far above p: the logs apart (d may be inf)
    (q - p) - p * (jnp.log(q) - jnp.log(jnp.where(positive, p, 1.0))),
    p * (moderate - jnp.log1p(moderate)),  # q = 0: d = -1, inf
  )
  terms = jnp.where(small, near, far)
  return jnp.where(positive, terms, jnp.where(p == 0, q, jnp.nan))


class KLDivergence(_RowReduction):
  """Kullback-Leibler divergence ``KL(target || preds) = sum_c t_c log(t_c / p_c)`` per row.

  ``target`` is the data distribution (torchmetrics' ``p``), ``preds`` the model's (``q``):
  ``KLDivergence()`` equals torchmetrics ``KLDivergence()(p=target, q=preds)`` and
  ``scipy.stats.entropy(target, preds)`` per row. With ``log_prob=False`` each row is
  normalised to sum 1 first (as both peers), and a 0 in ``target`` adds 0 (scipy's
  ``rel_entr``; a 0 in ``preds`` where ``target > 0`` gives inf). With ``log_prob=True``
  both are log-probabilities: ``sum exp(t) (t - p)``. A real row with a negative entry or
  a zero sum (``log_prob=False``), or NaN, is counted in ``invalid`` (``"not a
  distribution"``) and makes the result NaN (a row of weight 0 is not seen).

  Args:
    log_prob: inputs are log-probabilities (torchmetrics ``log_prob``).
    reduction: ``"mean"`` (weighted by ``weights``) or ``"sum"`` over the real rows.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> target, preds = np.array([[0.5, 0.5]]), np.array([[0.25, 0.75]])
    >>> m = pe.metrics.KLDivergence().update(preds=preds, target=target)
    >>> round(float(m.compute()), 4)  # 0.5 log 2 + 0.5 log(2 / 3)
    0.1438
  """

  higher_is_better: ClassVar[bool | None] = False

  log_prob: bool = False
  invalid_kinds: ClassVar[tuple[str, ...]] = ("not a distribution",)

  def _check_config(self):
    super()._check_config()
    validation.check_choice("log_prob", self.log_prob, (True, False))

  def _values(self, *, preds, target, **_):
    q, p = _vectors(preds, target)
    if self.log_prob:
      return jnp.sum(jnp.exp(p) * (p - q), -1), "preds"
    bad = jnp.any((p < 0) | (q < 0), -1) | (jnp.sum(p, -1) <= 0) | (jnp.sum(q, -1) <= 0)
    p, q = _scaled(p), _scaled(q)  # no sum overflows
    return jnp.where(bad, jnp.nan, jnp.sum(_kl_terms(p, q), -1)), "preds"
