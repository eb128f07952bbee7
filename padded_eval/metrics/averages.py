"""Weighted means of element values: Mean, MSE, MAE, RMSE.

Each keeps two exact float totals, ``sum(w * x)`` and ``sum(w)`` over real
elements, so the result over many padded batches equals one pass over the data.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from padded_eval.exact._floats import exact_product, int_parts, rounded_difference
from padded_eval.exact.accumulate import ExactCount, ExactSum, upcast
from padded_eval.masking import element_weights
from padded_eval.metrics.base import Metric, config_field, empty_count, invalid_state, state
from padded_eval.metrics.regression._multioutput import check_multioutput, combine
from padded_eval.metrics.totals import Totals
from padded_eval.validation import check_positive_int

NAN_VALUE = "nan value"
"""The invalid kind of the weighted means: a real element of nonzero weight whose value is NaN."""


def nan_elements(
  values: ArrayLike, mask: ArrayLike | None, weights: ArrayLike | None, ref: str
) -> jax.Array:
  """Bool, ``values``' shape: the real elements of nonzero weight whose value is NaN."""
  values = upcast(jnp.asarray(values))
  real, w = element_weights(mask, weights, values.shape, ref)
  return real & (w != 0) & jnp.isnan(values)


def _counted(counts) -> ExactCount:
  """The invalid counts of `weighted_totals` (one int32 scalar per counted array) as a state."""
  return ExactCount.of(jnp.stack(counts))


def zero_total(_metric: Any = None) -> ExactSum:
  """An empty scalar :class:`~padded_eval.exact.accumulate.ExactSum` (a state factory)."""
  return ExactSum.zeros()


def weighted_totals(
  values: ArrayLike,
  mask: ArrayLike | None,
  weights: ArrayLike | None,
  ref: str,
  power: int = 1,
  invalid: list[ArrayLike | None] | None = None,
  nonnegative: bool = False,
) -> Totals:
  """The `Totals` of ``(ExactSum(sum w * x**power), ExactSum(sum w))`` over the real elements
  of ``values`` (summed by `Metric.batch_updates`, in one reduction with the real rows where
  ``power`` is 1). With ``weights`` and ``power`` 1, each product ``w * x`` is kept exactly, as
  its rounded value and its error (`padded_eval.exact._floats.exact_product`), summed apart: a
  weighted mean of cancelling values keeps its digits (rounded products near 1e6 would each be
  off by up to 0.03). Without ``weights`` the products are by 0 or 1, exact already; with
  ``nonnegative`` values (losses, squares, absolute errors) nothing cancels, and each product is
  rounded once (at most ``2**-24`` of the total; on CPU about a fifth of the time for 65536 rows).
  int32 and uint32 values (float32 is exact to ``2**24`` only) are split into two exact float32
  parts (`padded_eval.exact._floats.int_parts`), summed apart, where ``power`` is 1.

  Args:
    values: float or int array (bf16/f16/ints upcast); NaN in masked-out places, or in elements of
      weight 0, never leaks.
    mask: None or a bool prefix of ``values``' shape.
    weights: None or a float prefix of ``values``' shape.
    ref: the name of ``values`` for error messages.
    power: 1 or 2; the powers are formed on values scaled by a power of two, so the
      totals neither overflow nor underflow float32 (see ``ExactSum.of_sum``).
    invalid: None, or a list of bool arrays of ``values``' shape (invalid real elements,
      already masked) counted in the same reduction (power 1 only).
    nonnegative: the real values are ``>= 0`` (or NaN): their weighted products are not kept
      exactly (see above).

  Returns:
    `Totals` whose ``build`` gives the two scalar totals; with ``invalid``, also the int32
    count of each of its arrays.

  Raises:
    ValueError: if the mask or weights do not fit ``values``.
  """
  values = jnp.asarray(values)
  real, w = element_weights(mask, weights, values.shape, ref)
  if values.dtype in (jnp.int32, jnp.uint32) and power == 1:  # float32 is exact to 2**24 only
    parts = int_parts(values)  # two exact float32 parts, summed apart
  else:
    parts = (upcast(values),)
  if power == 1:  # one reduction (with the update's real rows): one all-reduce under jit
    used = real & (w != 0)  # a weight-0 element is not seen: inf or NaN there never leaks
    parts = [jnp.where(used, part, 0.0) for part in parts]
    if weights is None or nonnegative:  # w is 0 or 1 (exact), or nothing cancels
      products = [w * part for part in parts]
    else:  # each product as its rounded value and its error: cancelling values keep their digits
      products = [p for part in parts for p in exact_product(w, part)]
    sums = [jnp.where(used, product, 0.0) for product in products] + [w]
    total = lambda sums: functools.reduce(lambda a, b: a.merge(b), sums[:-1])
    if invalid is None:
      return Totals(sums, [], lambda sums, _: (total(sums), sums[-1]))
    return Totals(sums, invalid, lambda sums, counts: (total(sums), sums[-1], counts))
  if invalid is not None:
    raise ValueError("weighted_totals counts invalid elements with power=1 only")
  pair = ExactSum.of_sum(parts[0], where=real, weights=w, power=power), ExactSum.of_sum(w)
  return Totals([], [], lambda *_: pair)


class WeightedMean(Metric):
  """Base of the weighted means: state ``total = sum(w * x**power)``, ``weight = sum(w)``.

  A subclass defines ``_values(**kwargs) -> (values, name for errors)`` and may set
  ``power = 2`` (the mean of squares, formed without overflow). ``compute()`` is
  ``total / weight``, NaN if no real element was seen. A real element of nonzero weight
  whose value is NaN is counted in ``invalid`` (``"nan value"``) and makes the result NaN
  (a subclass with its own ``_batch_state`` declares its own kinds).

  ``per_batch`` (keyword, default False): the values come one per batch (or device) on purpose,
  e.g. a batch-level statistic. Without it ``masked_eval`` refuses a weighted mean whose updates
  counted no row (scalar values, such as ``jnp.mean(per_row_loss)``) while the batches held real
  rows: a mean of batch means, not of rows (:meth:`Metric.saw_values_without_rows`). With it the
  result is the weighted mean of the values given; ``weights=batch["mask"].sum()`` weights each
  batch's mean by its real rows, which equals the mean over rows when each value is its batch's
  mean over real rows.
  """

  higher_is_better: ClassVar[bool | None] = None

  power = 1
  per_batch: bool = config_field(default=False)
  nonnegative: ClassVar[bool] = False  # values >= 0: weighted products rounded (weighted_totals)
  total: ExactSum = state(zero_total)
  weight: ExactSum = state(zero_total)
  example_rows: ExactCount = state(empty_count)
  invalid: ExactCount = state(invalid_state)
  invalid_kinds: ClassVar[tuple[str, ...]] = (NAN_VALUE,)

  @abc.abstractmethod
  def _values(self, *args: Any, **kwargs: Any) -> tuple[jax.Array, str]:
    """``(values to average, their name for errors)`` from the update keywords."""

  def _batch_state(
    self, *args: Any, mask=None, weights=None, **kwargs: Any
  ) -> Mapping[str, Any] | Totals:
    values, ref = self._values(**kwargs)
    nan = nan_elements(values, mask, weights, ref)
    if self.power == 1:  # counted in the sums' reduction
      totals = weighted_totals(
        values, mask, weights, ref, invalid=[nan], nonnegative=self.nonnegative
      )
      return totals.then(
        lambda built: {"total": built[0], "weight": built[1], "invalid": _counted(built[2])}
      )
    totals = weighted_totals(values, mask, weights, ref, self.power)
    invalid = self.count_invalid(**{NAN_VALUE: nan})
    return totals.then(lambda pair: {"total": pair[0], "weight": pair[1], "invalid": invalid})

  def number_inputs(self) -> tuple[str, ...]:
    return self.required_inputs()

  def saw_values_without_rows(self) -> bool:
    """Values were averaged (a nonzero total weight) but no row was counted, unless ``per_batch``.
    Reads a stacked state too (`Sliced`, `Bootstrap` replicas): any slice's weight counts."""
    if self.per_batch:
      return False
    rows = np.asarray(self.example_rows.to_numpy())
    return bool(rows.sum() == 0 and np.any(np.asarray(self.weight.to_numpy()) != 0))

  def compute(self) -> jax.Array:
    """The weighted mean over real elements; NaN if none was seen."""
    return self.total.ratio(self.weight)


class Mean(WeightedMean):
  """Weighted mean of the keyword ``argname`` over real elements (nnx ``Average``).

  Every element of the value counts: a ``[B, T]`` value with a ``[B]`` mask counts
  ``T`` elements per real row. ``weights`` follow the mask's shape rule.

  Args:
    argname: the update keyword to average (default ``"values"``).
    per_batch: (keyword) accept values given one per batch in ``masked_eval`` (see
      `WeightedMean`); by default a batch-level scalar there is refused.

  Examples:
    >>> import jax.numpy as jnp
    >>> m = Mean("mse").update(mse=jnp.array([2.0, 4.0]))
    >>> float(m.compute())
    3.0
  """

  argname: str = "values"

  def required_inputs(self) -> tuple[str, ...]:
    return (self.argname,)

  def rounded_inputs(self) -> tuple[str, ...]:
    # a mean of int64 values rounded to float32 is within float32's rounding of the exact one
    return (self.argname,)

  def _values(self, **kwargs):
    if self.argname not in kwargs:
      raise ValueError(
        f"Mean(argname={self.argname!r}) needs the keyword {self.argname!r} in "
        f"update(); got keywords {sorted(kwargs)}"
      )
    return kwargs[self.argname], self.argname


def pair_and_error(preds, target) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``(preds, target, preds - target)``: the inputs as float32, checked to have equal shapes,
  and their difference rounded once from the exact one (int32 values beyond ``2**24`` are not
  rounded one by one first: `padded_eval.exact._floats.rounded_difference`).

  Raises:
    ValueError: ``preds`` and ``target`` of different shapes.
  """
  preds, target = jnp.asarray(preds), jnp.asarray(target)
  if preds.shape != target.shape:
    raise ValueError(
      f"preds has shape {preds.shape} but target has shape {target.shape}; expected equal shapes"
    )
  return upcast(preds), upcast(target), rounded_difference(preds, target)


def _error(preds, target) -> jax.Array:
  return pair_and_error(preds, target)[2]


def _output_total(metric) -> ExactSum:
  return ExactSum.zeros(() if metric.num_outputs == 1 else (metric.num_outputs,))


class _PerOutputMean(WeightedMean):
  """A weighted mean of errors per output (``num_outputs`` columns on the last axis) combined
  as ``multioutput`` asks (scikit-learn: ``"uniform_average"``, ``"raw_values"`` or
  ``num_outputs`` weights). Lower is better."""

  higher_is_better: ClassVar[bool | None] = False

  num_outputs: int = 1
  multioutput: str | tuple[float, ...] = "uniform_average"
  total: ExactSum = state(_output_total)
  weight: ExactSum = state(_output_total)

  def _check_config(self):
    check_positive_int("num_outputs", self.num_outputs)
    check_multioutput(self, self.num_outputs, ("uniform_average", "raw_values"))

  def _batch_state(self, *, mask=None, weights=None, **kwargs):
    if self.num_outputs == 1:
      return super()._batch_state(mask=mask, weights=weights, **kwargs)
    values, ref = self._values(**kwargs)
    if values.ndim < 2 or values.shape[-1] != self.num_outputs:
      raise ValueError(
        f"num_outputs={self.num_outputs} expects preds and target of shape "
        f"[batch, ..., {self.num_outputs}]; got {values.shape}"
      )
    real, w = element_weights(mask, weights, values.shape, ref)
    axes = tuple(range(values.ndim - 1))
    used = real & (w != 0)
    total = ExactSum.of_sum(values, axis=axes, where=used, weights=w, power=self.power)
    weight = ExactSum.of_sum(jnp.where(used, w, 0.0), axis=axes)
    invalid = self.count_invalid(**{NAN_VALUE: used & jnp.isnan(upcast(values))})
    return {"total": total, "weight": weight, "invalid": invalid}

  def _per_output(self) -> jax.Array:
    return self.total.ratio(self.weight)

  def compute(self) -> jax.Array:
    """The weighted mean (``[D]`` with ``multioutput="raw_values"``); NaN if none seen."""
    return combine(self._per_output(), self.multioutput)


class MSE(_PerOutputMean):
  """Mean squared error ``mean((preds - target)**2)`` over real elements.

  The squares are formed on scaled errors: finite whenever the result fits float32.

  Args:
    num_outputs: 1 (every element is one observation) or ``D``: ``preds`` / ``target``
      ``[batch, ..., D]``, one mean per output (scikit-learn's ``multioutput``).
    multioutput: ``"uniform_average"`` (the mean of the outputs' values; for MSE and MAE
      the mean over all elements), ``"raw_values"`` (``[D]``) or ``D`` weights. RMSE
      takes the root per output first, as scikit-learn's ``root_mean_squared_error``.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> preds, target = np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 5.0])
    >>> round(float(pe.metrics.MSE().update(preds=preds, target=target).compute()), 4)  # 8 / 3
    2.6667
  """

  power = 2

  def _values(self, *, preds, target, **_):
    return _error(preds, target), "preds"


class MAE(_PerOutputMean):
  """Mean absolute error ``mean(|preds - target|)`` over real elements.

  ``num_outputs`` and ``multioutput`` as for :class:`MSE`.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> preds = np.array([[1.0, 2.0], [2.0, 0.0], [3.0, 5.0]])  # 3 rows of 2 outputs
    >>> target = np.array([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    >>> m = pe.metrics.MAE(num_outputs=2, multioutput="raw_values")
    >>> [round(float(v), 4) for v in m.update(preds=preds, target=target).compute()]  # 4/3, 3/3
    [1.3333, 1.0]
  """

  def _values(self, *, preds, target, **_):
    return jnp.abs(_error(preds, target)), "preds"


class RMSE(MSE):
  """Root mean squared error: ``sqrt`` of :class:`MSE` over the whole dataset.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> preds, target = np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.0, 5.0])
    >>> round(float(pe.metrics.RMSE().update(preds=preds, target=target).compute()), 4)  # sqrt(8 / 3)
    1.633
  """

  def _per_output(self) -> jax.Array:
    """``sqrt(sum(w * e**2) / sum(w))`` formed on the scaled totals (no overflow)."""
    return self.total.ratio(self.weight, sqrt=True)
