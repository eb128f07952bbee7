"""Values the step computes itself: LastValue and from_fun (CLU's ``LastValue`` and ``from_fun``).

:class:`LastValue` keeps the (masked) mean of its keyword over the last update that had a
real element, as CLU's ``LastValue``: useful for a learning rate or a loss logged during
training. "Last" is counted in updates: its :class:`LastBatch` state holds how many updates
it merged and which one was the last with a real element, so merging in sequence keeps the
later one, and ``reduce`` / ``aggregate`` across devices (which all ran the same steps)
average the parts of that same step over the devices that saw a real element in it. So under
``masked_eval`` the value is the mean over the real rows of the last batch that had any, on
every backend. Unlike the other metrics its ``merge`` is not commutative (``a.merge(b)``
keeps ``b``'s value when ``b`` saw a real element).

:func:`from_fun` wraps a function of the update keywords into a metric (CLU's
``Metric.from_fun``): the function's value is averaged by :class:`Mean` (or fed to any
metric given), with the update's ``mask``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar, cast

import jax
import jax.numpy as jnp

from padded_eval.exact._floats import compensated_sum
from padded_eval.exact.accumulate import Accumulator, ExactCount, register_accumulator, upcast
from padded_eval.masking import element_weights
from padded_eval.metrics.averages import NAN_VALUE, Mean
from padded_eval.metrics.base import Metric, empty_count, invalid_state, state


@register_accumulator
class LastBatch(Accumulator):
  """The totals of the last update with a real element.

  Attributes:
    updates: int32, the updates merged.
    last: int32, the 1-based index among them of the last one with a real element (0: none).
    total: float32, ``sum(w * x)`` over that update's real elements (compensated).
    weight: float32, ``sum(w)`` over them.
  """

  _fields = ("updates", "last", "total", "weight")
  updates: jax.Array
  last: jax.Array
  total: jax.Array
  weight: jax.Array

  @classmethod
  def zeros(cls) -> LastBatch:
    zero_int, zero = jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32)
    return cls._make(zero_int, zero_int, zero, zero)

  @classmethod
  def of(cls, total: jax.Array, weight: jax.Array) -> LastBatch:
    """One update's totals (it counts as seen when ``weight > 0``)."""
    seen = (weight > 0).astype(jnp.int32)
    return cls._make(jnp.ones((), jnp.int32), seen, total, weight)

  def merge(self, other: LastBatch) -> LastBatch:
    """``other`` follows ``self``: its totals win if it saw a real element."""
    later = other.last > 0
    pick = lambda a, b: jnp.where(later, b, a)
    last = jnp.where(later, self.updates + other.last, self.last)
    return self._make(
      self.updates + other.updates,
      last,
      pick(self.total, other.total),
      pick(self.weight, other.weight),
    )

  def _combine(self, total, maximum, n, spread=None):
    """Parts of the same steps (devices): those whose last seen update is the latest are summed."""
    del n
    latest = maximum(self.last)
    mine = self.last == (latest if spread is None else spread(latest))
    return self._make(
      maximum(self.updates),
      latest,
      total(jnp.where(mine, self.total, 0.0)),
      total(jnp.where(mine, self.weight, 0.0)),
    )


class LastValue(Metric):
  """The masked (weighted) mean of ``argname`` over the last update with a real element.

  CLU's ``LastValue``: each update's value is the mean of its real elements (summed over
  devices by ``reduce``, as CLU averages over the global batch); merging keeps the later
  update. One difference, for padding: an update with no real element (a batch of padding)
  leaves the value as it was (CLU's value becomes 0 / 0). NaN when no real element was seen.
  See [the module docstring][padded_eval.metrics.values] for what "last" means across devices. A real element of nonzero
  weight whose value is NaN is counted in ``invalid`` (``"nan value"``, reported by
  ``masked_eval``), in every update, not only the last; the last update's value stays NaN
  if it held one.

  Args:
    argname: the update keyword (default ``"values"``), any shape ``[B, ...]``; ``mask`` and
      ``weights`` a prefix of it.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> m = pe.metrics.LastValue().update(values=np.array([1.0, 3.0]))
    >>> m = m.update(values=np.array([5.0, 7.0, 99.0]), mask=np.array([True, True, False]))
    >>> float(m.update(values=np.array([8.0]), mask=np.array([False])).compute())
    6.0
  """

  higher_is_better: ClassVar[bool | None] = None

  argname: str = "values"
  last: LastBatch = state(lambda _: LastBatch.zeros())
  example_rows: ExactCount = state(empty_count)
  invalid: ExactCount = state(invalid_state)
  invalid_kinds: ClassVar[tuple[str, ...]] = (NAN_VALUE,)

  def required_inputs(self) -> tuple[str, ...]:
    return (self.argname,)

  def number_inputs(self) -> tuple[str, ...]:
    return self.required_inputs()

  def _batch_state(self, *, mask=None, weights=None, **kwargs):
    values = upcast(jnp.asarray(kwargs[self.argname]))
    real, w = element_weights(mask, weights, values.shape, self.argname)
    used = real & (w != 0)
    weighted = jnp.where(used, w * jnp.where(used, values, 0.0), 0.0)
    total, error = compensated_sum(weighted)
    total = total + jnp.where(jnp.isfinite(total), error, 0.0)  # by an inf, the error term is NaN
    return {
      "last": LastBatch.of(total, jnp.sum(jnp.where(used, w, 0.0))),
      "invalid": self.count_invalid(**{NAN_VALUE: used & jnp.isnan(values)}),
    }

  def compute(self) -> jax.Array:
    """float32 scalar: the last seen update's mean; NaN if none was seen."""
    seen = self.last.weight > 0
    return jnp.where(seen, self.last.total / jnp.where(seen, self.last.weight, 1.0), jnp.nan)


class FromFun(Metric):
  """A metric fed by a function of the update keywords (see :func:`from_fun`).

  Attributes:
    fun: the function, called as ``fun(**update_keywords)``.
    metric: the wrapped metric's state (``compute()`` is its ``compute()``).

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> def halves(preds, target, **_):  # a mapping: the wrapped metric's keywords
    ...   return {"preds": preds / 2, "target": target / 2}
    >>> m = pe.metrics.FromFun(halves, pe.metrics.MAE())
    >>> float(m.update(preds=np.array([2.0, 4.0]), target=np.array([0.0, 0.0])).compute())
    1.5
  """

  fun: Callable = cast(Callable, None)  # set by __init__, which requires it
  metric: Metric = state(lambda self: self.metric.empty())

  def __init__(self, fun: Callable, metric: Metric | None = None, *, name: str | None = None):
    if not callable(fun):
      raise ValueError(f"from_fun wraps a function of the update keywords; got fun={fun!r}")
    metric = Mean() if metric is None else metric
    if not isinstance(metric, Metric):
      raise ValueError(f"from_fun feeds a Metric (e.g. pe.metrics.Mean()); got metric={metric!r}")
    default = getattr(fun, "__name__", "from_fun")
    name = (default if default != "<lambda>" else metric.name) if name is None else name
    for field, value in {"fun": fun, "name": name, "arg_routes": ()}.items():
      object.__setattr__(self, field, value)
    object.__setattr__(self, "metric", metric.empty())

  @property
  # pyrefly: ignore[bad-override]  # the wrapped metric's direction: a property over the class constant
  def higher_is_better(self) -> bool | None:
    """The wrapped metric's direction."""
    return self.metric.higher_is_better

  def required_inputs(self) -> tuple[str, ...]:
    return ()

  def optional_inputs(self) -> tuple[str, ...]:
    return ()

  def _batch_state(self, **kwargs):
    mask = kwargs.get("mask")
    out = self.fun(**kwargs)
    if isinstance(out, Mapping):
      inner = dict(out)
      first = next(iter(inner.values()), None)
    else:
      names = self.metric.required_inputs()
      if len(names) != 1:
        raise ValueError(
          f"from_fun: fun returned one value but {type(self.metric).__name__} needs the keywords "
          f"{names}; return a dict of them"
        )
      inner, first = {names[0]: out}, out
    if "mask" not in inner and mask is not None and _same_rows(first, mask):
      inner["mask"] = mask  # CLU: the mask follows only values with the batch's rows
    return {"metric": self.metric.batch_updates(**inner)}

  def compute(self) -> Any:
    """The wrapped metric's value."""
    return self.metric.compute()


def _same_rows(value, mask) -> bool:
  shape = jnp.shape(value)
  return bool(shape) and shape[0] == jnp.shape(mask)[0]


def from_fun(fun: Callable, metric: Metric | None = None, *, name: str | None = None) -> FromFun:
  """A metric whose update calls ``fun(**update_keywords)`` and feeds ``metric`` its value.

  CLU's ``Metric.from_fun``: if ``fun`` returns a mapping, it is ``metric``'s update keywords
  (a ``"mask"`` in it replaces the update's); otherwise its value is ``metric``'s one
  required keyword (``values`` for the default :class:`Mean`). The update's ``mask`` is
  forwarded when the value has the batch's rows (a leading axis of the mask's length), so a
  per-example value is masked and a per-batch one is not. ``fun`` must accept (and may
  ignore, with ``**_``) every keyword the update gets.

  Args:
    fun: a function of the update keywords, traced with them (jit-compatible).
    metric: what its value feeds (default ``Mean()``: the masked average).
    name: the key in logs (default: ``fun``'s name).

  Returns:
    A :class:`FromFun` metric: merge, reduce and compute are the wrapped metric's.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> def abs_error(preds, target, **_):
    ...   return jnp.abs(preds - target)
    >>> m = pe.metrics.from_fun(abs_error).update(
    ...   preds=np.array([1.0, 2.0, 9.0]), target=np.array([2.0, 2.0, 0.0]),
    ...   mask=np.array([True, True, False]))
    >>> float(m.compute())
    0.5
  """
  return FromFun(fun, metric, name=name)
