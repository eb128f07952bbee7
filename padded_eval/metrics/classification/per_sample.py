"""Per-sample and weighted confusion counts (``multidim_average="samplewise"``,
``average="samples"``, ``weighted=True``).

A *sample* is one row of the batch (``"samplewise"``: its counts are over the row's
extra axes, torchmetrics' ``multidim_average="samplewise"``) or one ``[C]`` row of
multilabel labels (``average="samples"``, scikit-learn's meaning). Its counts are the
``[4, L]`` tp / fp / fn / tn of its elements; a sample without a counted element is not a
sample. See :class:`padded_eval.metrics.classification.scores.ClassScore`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from padded_eval.masking import element_weights
from padded_eval.metrics.classification._formatting import probabilities
from padded_eval.metrics.classification._inputs import (
  class_counts,
  label_counts,
  predicted_classes,
)

MULTIDIM_AVERAGES = ("global", "samplewise")


def sample_counts(metric, elements) -> jax.Array:
  """int32 ``[S, 4, L]``: each sample's counts (``S`` samples, see the module docstring)."""
  if metric.task != "multiclass":
    guess = probabilities(elements.scores, metric.from_logits) > metric.threshold
    arrays = (elements.truth, guess, elements.valid)
    shape = elements.truth.shape  # sizes spelled out: -1 is ambiguous for 0 rows
    width, inner = shape[-1], math.prod(shape[1:-1])
    rows = (
      (math.prod(shape[:-1]), 1, width) if metric.average == "samples" else (shape[0], inner, width)
    )
    truth, guess, valid = (jnp.reshape(a, rows) for a in arrays)
    return jax.vmap(label_counts)(truth, guess, valid)
  predicted = predicted_classes(metric, elements)
  rows, inner = elements.labels.shape[0], math.prod(elements.labels.shape[1:])
  labels, valid = (jnp.reshape(a, (rows, inner)) for a in (elements.labels, elements.valid))
  predicted = jnp.reshape(predicted, (rows, inner, predicted.shape[-1]))
  return jax.vmap(lambda t, p, v: class_counts(t, p, v, metric.num_classes))(
    labels, predicted, valid
  )


def sample_scores(metric, counts: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(scores, scored)``: each sample's averaged score ``[S]`` (``[S, L]`` with
  ``average=None``) and whether it is one (a counted sample, and a number: NaN scores
  from ``zero_division=nan`` are left out of the mean, as scikit-learn does)."""
  counts = counts.astype(jnp.float32)
  scores = jax.vmap(lambda c: metric.averaged(c[0], c[1], c[2], c[3]))(counts)
  counted = jnp.sum(counts, axis=(1, 2)) > 0
  if scores.ndim == 2:
    counted = counted[:, None]
  return scores, counted & ~jnp.isnan(scores)


def weighted_counts(metric, elements, weights) -> jax.Array:
  """float32 ``[4, L]``: tp, fp, fn, tn per class, each element counted with its weight.

  ``weights`` (a prefix of ``target``'s shape, or None for 1) is broadcast over the
  elements; padded and invalid elements weigh 0 (selected with ``where``, so NaN
  weights there never arrive).
  """
  valid = elements.valid
  _, w = element_weights(valid, weights, valid.shape, "target")
  w = jnp.where(valid, w, 0.0)
  if metric.task != "multiclass":
    guess = probabilities(elements.scores, metric.from_logits) > metric.threshold
    truth = elements.truth
    axes = tuple(range(truth.ndim - 1))
    parts = (truth & guess, ~truth & guess, truth & ~guess, ~truth & ~guess)
    return jnp.stack([jnp.sum(jnp.where(p, w, 0.0), axis=axes) for p in parts])
  c = metric.num_classes
  predicted = predicted_classes(metric, elements)  # [..., k]; -1: no class
  labels = elements.labels
  hit = jnp.any(predicted == labels[..., None], axis=-1)

  def scatter(ids, values):
    flat = jnp.where(values != 0, ids, c).reshape(-1)
    return jnp.zeros((c,), jnp.float32).at[flat].add(values.reshape(-1), mode="drop")

  tp = scatter(labels, jnp.where(hit, w, 0.0))
  wk = jnp.where(predicted >= 0, w[..., None], 0.0)
  predicted_weight = scatter(jnp.where(predicted >= 0, predicted, c), wk)
  true_weight = scatter(labels, w)
  fp, fn = predicted_weight - tp, true_weight - tp
  return jnp.stack([tp, fp, fn, jnp.sum(w) - tp - fp - fn])


def weighted_matrix(metric, elements, weights) -> jax.Array:
  """float32 ``[C, C + 1]`` (rows true, columns predicted; the last: no class) of multiclass
  elements, each counted with its weight (one scatter-add; padded and invalid elements weigh
  0, selected with ``where``)."""
  valid = elements.valid
  _, w = element_weights(valid, weights, valid.shape, "target")
  w = jnp.where(valid, w, 0.0)
  c = metric.num_classes
  predicted = elements.top_k(1)[..., 0]
  columns = jnp.where(predicted >= 0, predicted, c)
  cells = jnp.where(valid, elements.labels * (c + 1) + columns, c * (c + 1)).reshape(-1)
  flat = jnp.zeros((c * (c + 1),), jnp.float32).at[cells].add(w.reshape(-1), mode="drop")
  return flat.reshape(c, c + 1)
