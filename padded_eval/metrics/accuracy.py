"""Accuracy: the weighted fraction of real examples whose class is predicted."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from padded_eval.accumulate import ExactSum
from padded_eval.metrics.averages import weighted_totals, zero_total
from padded_eval.metrics.base import Metric, state


class Accuracy(Metric):
  """Fraction of real elements whose target is among the top-k predictions.

  Args:
    top_k: with score ``preds`` ``[..., C]``, a hit is ``target`` among the ``top_k``
      highest scores (ties broken towards the lower class index, like ``lax.top_k``).

  Update keywords: ``preds`` ``[...]`` int class ids or ``[..., C]`` float scores;
  ``target`` ``[...]`` int class ids; ``mask`` and ``weights`` a prefix of ``target``'s shape.
  """

  top_k: int = 1
  correct: ExactSum = state(zero_total)
  weight: ExactSum = state(zero_total)

  def _check_config(self):
    if not isinstance(self.top_k, int) or self.top_k < 1:
      raise ValueError(f"top_k must be a positive int; got {self.top_k!r}")

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    preds, target = jnp.asarray(preds), jnp.asarray(target)
    if preds.shape == target.shape:
      if self.top_k != 1:
        raise ValueError(
          f"top_k={self.top_k} needs score preds [..., C]; got class ids of shape {preds.shape}"
        )
      hits = preds == target
    elif preds.shape[:-1] == target.shape:
      if self.top_k > preds.shape[-1]:
        raise ValueError(f"top_k={self.top_k} exceeds the {preds.shape[-1]} classes of preds")
      hits = _in_top_k(preds, target, self.top_k)
    else:
      raise ValueError(
        f"preds has shape {preds.shape} and target {target.shape}; expected "
        "preds of target's shape (class ids) or target's shape + [C] (scores)"
      )
    correct, weight = weighted_totals(hits.astype(jnp.float32), mask, weights, "target")
    return {"correct": correct, "weight": weight}

  def compute(self) -> jax.Array:
    """Weighted accuracy over real elements; NaN if none was seen."""
    return self.correct.total() / self.weight.total()


def _in_top_k(scores: jax.Array, target: jax.Array, k: int) -> jax.Array:
  """Whether ``target`` is among the ``k`` best scores (NaN scores count as worst)."""
  if k == 1:
    return jnp.argmax(scores, axis=-1) == target
  _, top = jax.lax.top_k(scores, k)
  return jnp.any(top == target[..., None], axis=-1)
