"""Weighted means of element values: Mean, MSE, MAE, RMSE.

Each keeps two exact float totals, ``sum(w * x)`` and ``sum(w)`` over real
elements, so the result over many padded batches equals one pass over the data.
"""

from __future__ import annotations

import abc

import jax
import jax.numpy as jnp

from padded_eval.accumulate import ExactSum, upcast
from padded_eval.masking import element_weights, masked
from padded_eval.metrics.base import Metric, state


def _zero_sum(_):
  return ExactSum.zeros()


def weighted_totals(values, mask, weights, ref):
  """``(ExactSum(sum w*x), ExactSum(sum w))`` over the real elements of ``values``."""
  values = upcast(jnp.asarray(values))
  real, w = element_weights(mask, weights, values.shape, ref)
  total = jnp.sum(masked(w * masked(values, real), real))
  return ExactSum.of(total), ExactSum.of(jnp.sum(w))


class _WeightedMean(Metric):
  """Base of the weighted means: state ``total = sum(w * x)``, ``weight = sum(w)``."""

  total: ExactSum = state(_zero_sum)
  weight: ExactSum = state(_zero_sum)

  @abc.abstractmethod
  def _values(self, **kwargs) -> tuple[jax.Array, str]:
    """``(values to average, their name for errors)`` from the update keywords."""

  def _batch_state(self, *, mask=None, weights=None, **kwargs):
    values, ref = self._values(**kwargs)
    total, weight = weighted_totals(values, mask, weights, ref)
    return {"total": total, "weight": weight}

  def compute(self) -> jax.Array:
    """The weighted mean over real elements; NaN if none was seen."""
    return self.total.value_f32() / self.weight.value_f32()


class Mean(_WeightedMean):
  """Weighted mean of the keyword ``argname`` over real elements (nnx ``Average``).

  Every element of the value counts: a ``[B, T]`` value with a ``[B]`` mask counts
  ``T`` elements per real row. ``weights`` follow the mask's shape rule.

  Args:
    argname: the update keyword to average (default ``"values"``).

  Example:
    >>> import jax.numpy as jnp
    >>> m = Mean("mse").update(mse=jnp.array([2.0, 4.0]))
    >>> float(m.compute())
    3.0
  """

  argname: str = "values"

  def required_inputs(self) -> tuple[str, ...]:
    return (self.argname,)

  def _values(self, **kwargs):
    if self.argname not in kwargs:
      raise ValueError(
        f"Mean(argname={self.argname!r}) needs the keyword {self.argname!r} in "
        f"update(); got keywords {sorted(kwargs)}"
      )
    return kwargs[self.argname], self.argname


def _error(preds, target) -> jax.Array:
  preds, target = upcast(jnp.asarray(preds)), upcast(jnp.asarray(target))
  if preds.shape != target.shape:
    raise ValueError(
      f"preds has shape {preds.shape} but target has shape {target.shape}; expected equal shapes"
    )
  return preds - target


class MSE(_WeightedMean):
  """Mean squared error ``mean((preds - target)**2)`` over real elements."""

  def _values(self, *, preds, target, **_):
    return jnp.square(_error(preds, target)), "preds"


class MAE(_WeightedMean):
  """Mean absolute error ``mean(|preds - target|)`` over real elements."""

  def _values(self, *, preds, target, **_):
    return jnp.abs(_error(preds, target)), "preds"


class RMSE(MSE):
  """Root mean squared error: ``sqrt`` of :class:`MSE` over the whole dataset."""

  def compute(self) -> jax.Array:
    return jnp.sqrt(super().compute())
