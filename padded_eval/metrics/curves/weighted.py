"""Sample weights of AUROC / AUPRC (``weighted=True``, scikit-learn's ``sample_weight``).

Each counted element adds its weight, not 1, to its bin: the histograms of positives and
negatives become float sums, summed in float32 within a batch (one scatter-add: exact for
integer weights up to ``2**24`` per bin and batch) and in compensated sums
(:class:`~padded_eval.exact.accumulate.ExactSum`) across batches and devices, so integer
weights give the value of repeated rows. The areas and their bounds read the same
formulas off the weighted sums (scikit-learn's weighted ``roc_curve`` /
``precision_recall_curve``); the suffix sums are compensated too
(:meth:`~padded_eval.exact.accumulate.ExactSum.suffix_totals`).

``weights`` are a prefix of ``target``'s shape (``[B]`` rows; ``[B, C]`` per label for
multilabel). A real element whose weight is negative, NaN or inf is not counted and is
reported as invalid (:data:`INVALID_WEIGHT`); padded rows are never read. Weight 0 counts
nothing. With ``exact=True`` the weights are kept beside the scores instead
(:class:`~padded_eval.metrics.curves.exact_scores.WeightedScoreBuffer`). See
:mod:`padded_eval.metrics.curves.histogram`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from padded_eval.masking import element_weights

#: The invalid kind of a real element whose weight is negative, NaN or inf.
INVALID_WEIGHT = "weight negative or not finite"


def check_weighted(metric) -> None:
  """Raises ValueError for a ``weighted=True`` configuration that has no weighted value."""
  name = type(metric).__name__
  others = {
    "thresholds": metric.thresholds,
    "average='samples'": metric.average == "samples",
    "multi_class='ovo'": getattr(metric, "multi_class", "ovr") == "ovo",
  }
  given = [k for k, v in others.items() if v not in (None, False)]
  if given:
    raise ValueError(
      f"{name}(weighted=True) weights the binned histograms (scikit-learn's sample_weight); "
      f"it does not combine with {', '.join(given)} (thresholds= "
      "is torchmetrics' value, which has none; scikit-learn refuses sample_weight with "
      "multi_class='ovo'; 'samples' weighs rows, not elements): drop weighted=True or "
      f"{', '.join(given)}"
    )


def element_weights_of(metric, truth, mask, weights) -> tuple[jax.Array, jax.Array]:
  """``(w, bad)``: float32 weights ``[..., L]`` of the elements (0 where not real or bad) and
  bool ``bad`` marking real elements with a negative, NaN or inf weight (multiclass: ``[...]``,
  one per row, the shape of ``target``).

  Args:
    metric: the curve metric (its ``task``).
    truth: bool ``[..., L]`` of the formatted elements.
    mask: the update's mask (a prefix of ``target``'s shape) or None.
    weights: the update's ``weights`` (a prefix of ``target``'s shape) or None (all 1).

  Raises:
    ValueError: ``weights`` whose shape is not a prefix of ``target``'s.
  """
  multiclass = metric.task == "multiclass"
  shape = truth.shape[:-1] if multiclass else truth.shape
  real, w = element_weights(mask, weights, shape, "target")
  bad = real & ~(jnp.isfinite(w) & (w >= 0))
  w = jnp.where(bad, 0.0, w)
  if multiclass:
    w = jnp.broadcast_to(w[..., None], truth.shape)
  return w, bad


def histograms(index, values, size) -> jax.Array:
  """float32 ``[size]``: ``values`` summed at ``index`` (``index == size``: dropped)."""
  flat = jnp.reshape(index, (-1,))
  return jnp.zeros((size,), jnp.float32).at[flat].add(jnp.reshape(values, (-1,)), mode="drop")
