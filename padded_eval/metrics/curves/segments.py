"""The pieces of a curve that the curve metrics share: explicit thresholds and ROC segments.

Explicit thresholds (``thresholds=[...]``, torchmetrics' binned meaning): ``T`` increasing
thresholds in probability units define ``T + 1`` bins, bin ``j`` holding the scores with
exactly ``j`` thresholds ``<= score`` (compared in float32, as torchmetrics does), so the
counts of ``score >= thresholds[k]`` are the suffix sums from bin ``k + 1``.

ROC segments: a ROC curve built from cumulative counts is a chain of segments, one per
bin (or group of tied scores), from ``(a, c) = (FP_above / N, TP_above / P)`` to
``(b, d) = ((FP_above + neg) / N, (TP_above + pos) / P)``. :func:`partial_terms` integrates
the chain over ``fpr <= max_fpr`` (the last segment cut at ``max_fpr`` by linear
interpolation, as scikit-learn's ``roc_auc_score(max_fpr=)``), :func:`mcclish` standardizes
it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval import validation


def normalized_thresholds(thresholds) -> tuple[float, ...]:
  """``thresholds`` as a tuple of floats: an int ``n`` is ``linspace(0, 1, n)`` (torchmetrics).

  Raises:
    ValueError: not an int >= 2 or a non-empty increasing sequence of floats in ``[0, 1]``.
  """
  if validation.is_int(thresholds):
    if thresholds < 2:
      raise ValueError(
        f"thresholds as an int is the size of linspace(0, 1, thresholds): at least 2; got "
        f"{thresholds!r}"
      )
    return tuple(float(t) for t in np.linspace(0.0, 1.0, thresholds))
  try:
    values = np.asarray(thresholds, np.float64)
  except (TypeError, ValueError):
    values = None
  if values is None or values.ndim != 1 or values.size == 0:
    raise ValueError(
      "thresholds must be an int (linspace(0, 1, n)) or a 1-D sequence of floats in [0, 1]; "
      f"got {thresholds!r}"
    )
  if not np.all((values >= 0) & (values <= 1)) or np.any(np.diff(values) <= 0):
    raise ValueError(
      "thresholds must be strictly increasing probabilities in [0, 1] (sort them, drop "
      f"duplicates); got {values.tolist()}"
    )
  return tuple(float(t) for t in values)


def threshold_bins(probabilities: jax.Array, thresholds: tuple[float, ...]) -> jax.Array:
  """int32 bin of each probability: how many ``thresholds`` are ``<= p`` (float32)."""
  edges = jnp.asarray(thresholds, jnp.float32)
  return jnp.searchsorted(edges, probabilities, side="right").astype(jnp.int32)


def check_max_fpr(max_fpr) -> None:
  """Raises ValueError unless ``max_fpr`` is None or a float in ``(0, 1]``."""
  if max_fpr is None:
    return
  if not validation.is_number(max_fpr) or not 0 < max_fpr <= 1:
    raise ValueError(
      f"max_fpr must be None or a float in (0, 1] (scikit-learn's range); got {max_fpr!r}"
    )


def partial_terms(neg, pos, neg_above, pos_above, total_neg, total_pos, max_fpr) -> jax.Array:
  """float32 ``[L, K]``: each segment's area over ``fpr <= max_fpr`` (``[L, K]`` inputs, the
  totals ``[L, 1]``; a segment that should not count has ``neg = pos = 0``); their sum is the
  partial area."""
  n = jnp.where(total_neg > 0, total_neg, 1.0)
  p = jnp.where(total_pos > 0, total_pos, 1.0)
  a, b = neg_above / n, (neg_above + neg) / n
  c, d = pos_above / p, (pos_above + pos) / p
  x = jnp.clip(max_fpr, a, b)  # a segment right of max_fpr adds nothing
  share = jnp.where(b > a, (x - a) / jnp.where(b > a, b - a, 1.0), 0.0)
  return (x - a) * (c + c + (d - c) * share) * 0.5


def partial_tie_bound(neg, pos, neg_above, total_neg, total_pos, max_fpr) -> jax.Array:
  """float32 ``[L]``: bound on the error of :func:`partial_area` against the exact curve when
  each segment holds unknown orderings: ``sum (x - a) * (d - c)`` over the clipped parts."""
  n = jnp.where(total_neg > 0, total_neg, 1.0)
  p = jnp.where(total_pos > 0, total_pos, 1.0)
  a, b = neg_above / n, (neg_above + neg) / n
  x = jnp.clip(max_fpr, a, b)
  return jnp.sum((x - a) * (pos / p), -1)


def mcclish(partial: jax.Array, max_fpr: float) -> jax.Array:
  """McClish's standardization of a partial AUC: 0.5 for chance, 1 for a perfect ranking."""
  if max_fpr == 1:
    return partial
  min_area, max_area = 0.5 * max_fpr**2, max_fpr
  return 0.5 * (1 + (partial - min_area) / (max_area - min_area))


def mcclish_scale(max_fpr: float) -> float:
  """The factor by which :func:`mcclish` scales an error of the partial area."""
  return 1.0 if max_fpr == 1 else 0.5 / (max_fpr - 0.5 * max_fpr**2)
