"""``pe.clu.metric``: a padded_eval metric as a ``clu.metrics.Metric`` (clu imported here only).

``Collection.create(accuracy=pe.clu.metric(pe.metrics.Accuracy()), ...)`` gives CLU's whole
protocol: ``empty()``, ``single_from_model_output(**outputs)``,
``gather_from_model_output(**outputs)`` inside ``pmap`` (an ``all_gather`` of the batch's
statistics, then ``reduce()``), ``merge``, ``compute``, ``unreplicate``. The class holds the
padded_eval metric as its one pytree field; ``from_model_output`` is the metric's
``batch_updates`` (exact statistics, padded rows selected away before any arithmetic),
``merge`` its ``merge`` and ``reduce`` its ``aggregate`` over the gathered axis (the exact
limbs summed, so the result does not depend on the device count). ``from_model_output`` reads
the metric's keywords (``map_arg(preds="logits", target="labels")`` for CLU's names) and
ignores the others. docs/howto/ecosystem.md.
"""

from __future__ import annotations

from typing import Any

from clu import metrics as clu_metrics
from flax import struct

from padded_eval.ecosystem import check_wrapped
from padded_eval.metrics import base

__all__ = ["metric"]


def metric(metric: base.Metric) -> type[clu_metrics.Metric]:
  """A ``clu.metrics.Metric`` subclass computing ``metric`` (for ``Collection.create``).

  Args:
    metric: any padded_eval metric or collection; its configuration is kept, any state it
      holds is not (``empty()`` is its empty state).

  Returns:
    A ``flax.struct.dataclass`` subclass of ``clu.metrics.Metric`` whose one field,
    ``metric``, is the padded_eval metric; ``compute()`` is its ``compute()`` (NaN when no
    real element was seen; a dict for a collection).

  Raises:
    ValueError: ``metric`` is not a padded_eval metric.

  Example:
    >>> import jax.numpy as jnp
    >>> from clu import metrics
    >>> import padded_eval as pe
    >>> Metrics = metrics.Collection.create(mean=pe.clu.metric(pe.metrics.Mean("loss")))
    >>> update = Metrics.single_from_model_output(
    ...   loss=jnp.array([1.0, 3.0, jnp.nan]), mask=jnp.array([True, True, False])
    ... )
    >>> float(Metrics.empty().merge(update).compute()["mean"])
    2.0
  """
  check_wrapped(metric, "pe.clu.metric")
  template = metric

  @struct.dataclass
  class PaddedEvalMetric(clu_metrics.Metric):
    metric: base.Metric
    higher_is_better = template.higher_is_better

    @classmethod
    def empty(cls) -> PaddedEvalMetric:
      return cls(metric=template.empty())

    @classmethod
    def from_model_output(cls, **model_output: Any) -> PaddedEvalMetric:
      return cls(metric=template.batch_updates(**model_output))

    def merge(self, other: PaddedEvalMetric) -> PaddedEvalMetric:
      return type(self)(metric=self.metric.merge(other.metric))

    def reduce(self) -> PaddedEvalMetric:
      return type(self)(metric=self.metric.aggregate())

    def compute(self) -> Any:
      return self.metric.compute()

  PaddedEvalMetric.__name__ = PaddedEvalMetric.__qualname__ = f"Padded{type(metric).__name__}"
  return PaddedEvalMetric
