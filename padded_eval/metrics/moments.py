"""Second-moment metrics that merge exactly: Std, R2Score, PearsonCorrelation.

Variances and co-variances do not merge by addition, so they are kept as
:class:`Moments`: per column the weight ``n``, the total ``sum(w * x)`` and the
co-moment matrix ``M[j, k] = sum(w * (x_j - mean_j) * (x_k - mean_k))`` around the
state's own mean. Parts combine with the n-way form of Chan's formula

    M = sum_i M_i + sum_i n_i * (mean_i - mean) (mean_i - mean)^T,

with ``mean = sum_i total_i / sum_i n_i``. Merging two states is the two-part
case; ``reduce`` (``psum``) and ``aggregate`` (a sum over the stacked axis) are
the n-part case, so no gather is needed. Every total is an exact
:class:`~padded_eval.accumulate.ExactSum` and the differences ``mean_i - mean``
are formed from double-float means, so data with mean 1e4 and std 1 keeps its
variance to float32 precision over any number of steps and devices.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from padded_eval.accumulate import Accumulator, ExactSum, _register, upcast
from padded_eval.masking import element_weights
from padded_eval.metrics.base import Metric, state
from padded_eval.validation import check_choice


def _split(a):
  """Veltkamp split of float32 ``a`` into two 12-bit halves, ``a = hi + lo`` exactly."""
  scaled = 4097.0 * a  # 2**12 + 1
  hi = scaled - (scaled - a)
  return hi, a - hi


def two_prod(a, b):
  """Error-free product (Dekker): ``(p, e)`` with ``p = fl(a * b)`` and ``a * b = p + e``."""
  product = a * b
  a_hi, a_lo = _split(a)
  b_hi, b_lo = _split(b)
  error = ((a_hi * b_hi - product) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo
  return product, error


def _outer(u, v):
  return u[..., :, None] * v[..., None, :]


@_register
class Moments(Accumulator):
  """Weight, totals and co-moment matrix of ``k`` variables; merges exactly (Chan).

  Attributes:
    count: ExactSum ``[S...]``, the total weight ``n`` (the number of real elements
      when unweighted).
    total: ExactSum ``[S..., k]``, ``sum(w * x)`` per variable.
    comoment: ExactSum ``[S..., k, k]``, ``sum(w * (x - mean) (x - mean)^T)`` around
      this state's own mean ``total / count``.
  """

  _fields = ("count", "total", "comoment")

  @classmethod
  def zeros(cls, shape=(), num_vars: int = 1) -> Moments:
    shape = tuple(shape)
    return cls._make(
      ExactSum.zeros(shape),
      ExactSum.zeros(shape + (num_vars,)),
      ExactSum.zeros(shape + (num_vars, num_vars)),
    )

  @classmethod
  def of(cls, values: jax.Array, real: jax.Array, w: jax.Array, axes: tuple[int, ...]) -> Moments:
    """The moments of one batch.

    Args:
      values: ``[X..., k]`` float, the ``k`` variables of every element.
      real: ``[X...]`` bool, the real elements; the others never influence the result.
      w: ``[X...]`` float32 weights, 0 where not ``real``.
      axes: the axes of ``X`` to reduce; the state has the shape of the others.

    Returns:
      Moments of shape ``X`` without ``axes``. Within the batch the co-moment is taken
      around a shift (the batch mean) and corrected, ``M = P - s s^T / n``.
    """
    return _batch_moments(upcast(jnp.asarray(values)), real, w, tuple(axes))

  @property
  def shape(self) -> tuple[int, ...]:
    return self.count.shape

  def mean(self) -> jax.Array:
    """``[S..., k]`` float32 means (NaN where the weight is 0)."""
    return self.total.value_f32() / self.count.value_f32()[..., None]

  def _spread(self, mean_hi, mean_lo) -> ExactSum:
    """``n_i (mean_i - mean)(mean_i - mean)^T`` of this state's parts, 0 for empty parts."""
    own_hi, own_lo = _mean_parts(self.total, self.count)
    difference = (own_hi - mean_hi) + (own_lo - mean_lo)
    weight = self.count.value_f32()[..., None, None]
    return ExactSum.of(jnp.where(weight > 0, weight * _outer(difference, difference), 0.0))

  def merge(self, other: Moments) -> Moments:
    return _merge_moments(self, other)

  def _merge(self, other: Moments) -> Moments:
    count = self.count.merge(other.count)
    total = self.total.merge(other.total)
    mean_hi, mean_lo = _mean_parts(total, count)
    mine = self.comoment.merge(self._spread(mean_hi, mean_lo))
    theirs = other.comoment.merge(other._spread(mean_hi, mean_lo))
    return self._make(count, total, mine.merge(theirs))

  def aggregate(self) -> Moments:
    return _aggregate_moments(self)

  def _combine(self, total, maximum, n):
    combine = lambda acc: acc._combine(total, maximum, n)
    count, sums = combine(self.count), combine(self.total)
    mean_hi, mean_lo = _mean_parts(sums, count)
    comoment = combine(self.comoment.merge(self._spread(mean_hi, mean_lo)))
    return self._make(count, sums, comoment)


# Jitted so that eager use (host-side merges) runs one compiled program, not dozens of ops.
_merge_moments = jax.jit(Moments._merge)
_aggregate_moments = jax.jit(Accumulator.aggregate)


@functools.partial(jax.jit, static_argnums=3)
def _batch_moments(values, real, w, axes) -> Moments:
  """See :meth:`Moments.of`."""
  values = jnp.where(real[..., None], values, 0.0)
  weight = w[..., None]
  count = jnp.sum(w, axes, keepdims=True)
  total = jnp.sum(weight * values, axes, keepdims=True)
  safe_count = jnp.where(count > 0, count, 1.0)[..., None]
  shift = total / safe_count
  deviation = values - shift
  weighted_deviation = weight * deviation
  shift_total = jnp.sum(weighted_deviation, axes, keepdims=True)
  products = jnp.sum(_outer(weighted_deviation, deviation), axes, keepdims=True)
  comoment = products - _outer(shift_total, shift_total) / safe_count[..., None]
  # total = n * shift + sum(w * (x - shift)): the product exactly, the small rest in float32,
  # so the batch mean is good to ~45 bits, not to the rounding of a float32 batch sum.
  product, product_error = two_prod(count[..., None], shift)
  squeeze = lambda x: jnp.squeeze(x, axes)
  rest = ExactSum.of(squeeze(product_error + shift_total))
  exact_total = ExactSum.of(squeeze(product)).merge(rest)
  return Moments._make(ExactSum.of(squeeze(count)), exact_total, ExactSum.of(squeeze(comoment)))


def _mean_parts(total: ExactSum, count: ExactSum):
  """``total / count`` as an unevaluated float32 pair ``hi + lo`` (~45 bits)."""
  count_hi, count_lo = count.value[..., None], count.error[..., None]
  hi = total.value / count_hi
  product, product_error = two_prod(hi, count_hi)
  residual = ((total.value - product) - product_error) + total.error - hi * count_lo
  return hi, residual / count_hi


def _values_of(kwargs, argname: str, owner: str) -> jax.Array:
  if argname not in kwargs:
    raise ValueError(
      f"{owner} needs the keyword {argname!r} in update(); got keywords {sorted(kwargs)}"
    )
  return upcast(jnp.asarray(kwargs[argname]))


def _check_num_outputs(num_outputs) -> None:
  if not isinstance(num_outputs, int) or isinstance(num_outputs, bool) or num_outputs < 1:
    raise ValueError(f"num_outputs must be a positive int; got {num_outputs!r}")


def _pair(preds, target, num_outputs: int, mask, weights):
  """``(preds, target, real, w, axes)`` for metrics of ``num_outputs`` columns.

  With ``num_outputs == 1`` every element is one observation of one output; else the
  last axis of ``preds``/``target`` must be ``num_outputs`` and the others are reduced.
  """
  preds, target = upcast(jnp.asarray(preds)), upcast(jnp.asarray(target))
  if preds.shape != target.shape:
    raise ValueError(
      f"preds has shape {preds.shape} but target has shape {target.shape}; expected equal shapes"
    )
  if num_outputs > 1 and (preds.ndim < 2 or preds.shape[-1] != num_outputs):
    raise ValueError(
      f"num_outputs={num_outputs} expects preds and target of shape "
      f"[batch, ..., {num_outputs}]; got {preds.shape}"
    )
  real, w = element_weights(mask, weights, preds.shape, "preds")
  axes = tuple(range(preds.ndim - (num_outputs > 1)))
  return preds, target, real, w, axes


class Std(Metric):
  """Weighted standard deviation of the keyword ``argname`` over real elements.

  ``sqrt(M2 / (n - ddof))`` with ``n`` the total weight (weights act as frequency
  weights) and ``M2`` the sum of weighted squared deviations from the dataset mean,
  accumulated with Chan's merge, so large means (1e4 with std 1) lose nothing.

  Args:
    ddof: delta degrees of freedom, as in ``numpy.std``.
    argname: the update keyword whose elements are the data (default ``"values"``).

  Update keywords: ``values`` (``argname``) ``[...]`` float; ``mask`` / ``weights`` a
  prefix of its shape. ``compute()`` is NaN when ``n - ddof <= 0`` (e.g. empty).

  Example:
    >>> import jax.numpy as jnp
    >>> m = Std().update(values=jnp.array([1.0, 3.0, jnp.nan]), mask=jnp.array([True, True, False]))
    >>> float(m.compute())
    1.0
  """

  ddof: int = 0
  argname: str = "values"
  moments: Moments = state(lambda self: Moments.zeros((), 1))

  def required_inputs(self) -> tuple[str, ...]:
    return (self.argname,)

  def _check_config(self):
    if isinstance(self.ddof, bool) or not isinstance(self.ddof, (int, float)) or self.ddof < 0:
      raise ValueError(f"ddof must be a non-negative number; got {self.ddof!r}")

  def _batch_state(self, *, mask=None, weights=None, **kwargs):
    values = _values_of(kwargs, self.argname, f"Std(argname={self.argname!r})")
    real, w = element_weights(mask, weights, values.shape, self.argname)
    return {"moments": Moments.of(values[..., None], real, w, tuple(range(values.ndim)))}

  def variance(self) -> jax.Array:
    """``M2 / (n - ddof)``; NaN when ``n - ddof <= 0``."""
    dof = self.moments.count.value_f32() - self.ddof
    m2 = jnp.maximum(self.moments.comoment.value_f32()[..., 0, 0], 0.0)
    return jnp.where(dof > 0, m2 / jnp.where(dof > 0, dof, 1.0), jnp.nan)

  def compute(self) -> jax.Array:
    """The standard deviation (float32 scalar); NaN when empty."""
    return jnp.sqrt(self.variance())


class R2Score(Metric):
  """Coefficient of determination ``1 - SS_res / SS_tot`` (scikit-learn ``r2_score``).

  ``SS_tot`` is taken around the dataset's (weighted) mean of ``target``, kept as
  mergeable moments, so the result equals one pass over the whole dataset. As in
  scikit-learn (``force_finite=True``), an output with ``SS_tot == 0`` scores 1 if
  ``SS_res == 0`` and else 0. Empty: NaN.

  Args:
    num_outputs: 1 (every element of ``preds`` is one observation) or ``D`` for
      ``preds`` / ``target`` ``[batch, ..., D]``, one score per output.
    multioutput: ``"uniform_average"`` (mean of the outputs' scores),
      ``"variance_weighted"`` (weighted by ``SS_tot``) or ``"raw_values"`` (``[D]``).

  Update keywords: ``preds``, ``target`` float of equal shape; ``mask`` / ``weights``
  a prefix of their shape.
  """

  num_outputs: int = 1
  multioutput: str = "uniform_average"
  target_moments: Moments = state(lambda self: Moments.zeros(self._output_shape(), 1))
  residual: ExactSum = state(lambda self: ExactSum.zeros(self._output_shape()))

  def _output_shape(self) -> tuple[int, ...]:
    return () if self.num_outputs == 1 else (self.num_outputs,)

  def _check_config(self):
    _check_num_outputs(self.num_outputs)
    check_choice(
      "multioutput", self.multioutput, ("uniform_average", "variance_weighted", "raw_values")
    )

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    preds, target, real, w, axes = _pair(preds, target, self.num_outputs, mask, weights)
    squared_error = jnp.where(real, jnp.square(preds - target), 0.0)
    return {
      "target_moments": Moments.of(target[..., None], real, w, axes),
      "residual": ExactSum.of(jnp.sum(w * squared_error, axes)),
    }

  def compute(self) -> jax.Array:
    """The score: a float32 scalar, or ``[D]`` with ``multioutput="raw_values"``."""
    ss_res = self.residual.value_f32()
    ss_tot = jnp.maximum(self.target_moments.comoment.value_f32()[..., 0, 0], 0.0)
    seen = self.target_moments.count.value_f32() > 0
    ratio = ss_res / jnp.where(ss_tot > 0, ss_tot, 1.0)
    scores = jnp.where(ss_tot > 0, 1.0 - ratio, jnp.where(ss_res == 0, 1.0, 0.0))
    scores = jnp.where(seen, scores, jnp.nan)
    if self.multioutput == "raw_values" or self.num_outputs == 1:
      return scores
    if self.multioutput == "variance_weighted":
      total_variance = jnp.sum(ss_tot)
      weighted = jnp.sum(ss_tot * scores) / jnp.where(total_variance > 0, total_variance, 1.0)
      return jnp.where(total_variance > 0, weighted, jnp.mean(scores))
    return jnp.mean(scores)


class PearsonCorrelation(Metric):
  """Pearson correlation of ``preds`` and ``target`` over real elements.

  ``C_xy / sqrt(C_xx C_yy)`` from weighted co-moments around the dataset means,
  merged exactly (Chan). NaN when empty or when either variable is constant.

  Args:
    num_outputs: 1 (all elements one sample) or ``D`` for ``[batch, ..., D]`` inputs,
      giving ``[D]`` correlations.

  Update keywords: ``preds``, ``target`` float of equal shape; ``mask`` / ``weights``
  a prefix of their shape.
  """

  num_outputs: int = 1
  moments: Moments = state(
    lambda self: Moments.zeros(() if self.num_outputs == 1 else (self.num_outputs,), 2)
  )

  def _check_config(self):
    _check_num_outputs(self.num_outputs)

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    preds, target, real, w, axes = _pair(preds, target, self.num_outputs, mask, weights)
    return {"moments": Moments.of(jnp.stack([preds, target], axis=-1), real, w, axes)}

  def compute(self) -> jax.Array:
    """The correlation in ``[-1, 1]`` (float32 scalar or ``[D]``); NaN when undefined."""
    comoment = self.moments.comoment.value_f32()
    xx, yy, xy = comoment[..., 0, 0], comoment[..., 1, 1], comoment[..., 0, 1]
    denominator = jnp.sqrt(jnp.maximum(xx, 0.0) * jnp.maximum(yy, 0.0))
    correlation = jnp.clip(xy / denominator, -1.0, 1.0)
    return jnp.where(denominator > 0, correlation, jnp.nan)
