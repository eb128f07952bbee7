"""``pe.nnx.Metric``: a padded_eval metric as an ``nnx.Metric`` (flax is imported here only).

``nnx.MultiMetric(accuracy=pe.nnx.Metric(pe.metrics.Accuracy()), loss=nnx.metrics.Average("loss"))``
updates, computes and resets both in one call, in place, under ``nnx.jit`` as outside it. The
wrapper's state is one ``nnx.metrics.MetricState`` holding the padded_eval metric (an immutable
pytree: exact accumulators, configuration as static metadata), so ``nnx.jit`` traces it once
per configuration and the padded rows are selected away before any arithmetic, as in the
metric itself. ``update`` takes the metric's keywords (``preds``, ``target``, ``mask``, ...;
``map_arg`` renames them, e.g. to nnx's ``logits`` / ``labels``) and ignores the others, so it
shares one ``MultiMetric.update(**batch)`` with nnx's metrics. docs/howto/ecosystem.md.
"""

from __future__ import annotations

from typing import Any

from flax import nnx

from padded_eval.ecosystem import check_wrapped
from padded_eval.metrics import base

__all__ = ["Metric"]


class Metric(nnx.Metric):
  """An ``nnx.Metric`` holding a padded_eval metric (or collection); updated in place.

  Args:
    metric: any padded_eval metric or collection (``pe.metrics.Accuracy()``,
      ``pe.Metrics({...})``, ``pe.metrics.Bootstrap(...)``); its configuration is kept,
      any state it holds is not (the wrapper starts empty).

  Attributes:
    state: the ``nnx.metrics.MetricState`` holding the current padded_eval metric.

  Raises:
    ValueError: ``metric`` is not a padded_eval metric.

  Example:
    Beside nnx's own metrics in one ``nnx.MultiMetric``, sharing one ``update(**batch)``:

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> import padded_eval as pe
    >>> metrics = nnx.MultiMetric(
    ...   accuracy=pe.nnx.Metric(pe.metrics.Accuracy()), loss=nnx.metrics.Average("loss")
    ... )
    >>> batch = {"preds": jnp.array([1, 0, 1]), "target": jnp.array([1, 1, 0]), "loss": jnp.array([0.5, 1.5, 9.0])}
    >>> metrics.update(**batch, mask=jnp.array([True, True, False]))  # the last row is padding
    >>> {name: float(value) for name, value in metrics.compute().items()}
    {'accuracy': 0.5, 'loss': 1.0}
  """

  def __init__(self, metric: base.Metric):
    check_wrapped(metric, "pe.nnx.Metric")
    self.state = nnx.metrics.MetricState(metric.empty())

  @property
  def metric(self) -> base.Metric:
    """The padded_eval metric now held (for ``invalid_report()``, curves, ``pe.plot``)."""
    return self.state.get_value()

  @property
  def higher_is_better(self) -> bool | None:
    """The wrapped metric's ``higher_is_better``."""
    return self.metric.higher_is_better

  def update(self, **kwargs: Any) -> None:
    """Merges one batch in place: ``metric.update(**kwargs)``; unknown keywords are ignored.

    Raises:
      ValueError: a keyword the metric needs is missing, or an input does not fit (the
        wrapped metric's own checks).
    """
    self.state.set_value(self.metric.update(**kwargs))

  def reset(self) -> None:
    """Empties the state in place (the configuration is kept)."""
    self.state.set_value(self.metric.empty())

  def compute(self) -> Any:
    """The wrapped metric's ``compute()`` (NaN when no real element was seen; a dict for a
    collection)."""
    return self.metric.compute()
