"""What ``masked_eval`` returns: a dict of computed values that also holds the final metric.

`EvalResults` is a plain ``dict`` (``metric.compute_logs()`` with Python floats and numpy
arrays, plus ``"num_examples"``), so logging, comparing and JSON-dumping it work as
before; its attribute ``metric`` is the final metric itself, reduced over every device
and process and on the host, whose exact state the pictures of `padded_eval.plot` and
the host views (``AUROC.curve()``, ``CalibrationError.bins()``,
``ConfusionMatrix.counts()``) read. `find_metric` picks one member of a collection.
"""

from __future__ import annotations

from typing import Any

from padded_eval.collections import LossesAndMetrics
from padded_eval.metrics.base import Metric

__all__ = ["EvalResults", "find_metric"]


class EvalResults(dict):
  """``masked_eval``'s result: ``{name: value, ..., "num_examples": n}`` and ``.metric``.

  Attributes:
    metric: the final metric (a host copy of the state after the last step and the one
      reduction; a result read back from a finished ``checkpoint_dir`` has the stored one),
      or None for an `EvalResults` made of values alone.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> data = {"x": np.array([1.0, 2.0, 3.0, 6.0, 8.0])}
    >>> def step(params, batch):
    ...   return pe.metrics.Mean("x").batch_updates(x=batch["x"], mask=batch["mask"])
    >>> results = pe.masked_eval(step, None, pe.pad_batches(data, 8), backend="jit")
    >>> results
    {'mean': 4.0, 'num_examples': 5}
    >>> float(results.metric.compute())
    4.0
  """

  def __init__(self, values: dict[str, Any], metric: Metric | None = None):
    super().__init__(values)
    self.metric = metric

  def __reduce__(self):  # pickles with its metric (dict subclasses drop attributes otherwise)
    return (type(self), (dict(self), self.metric))


def _members(metric: Metric, path: str):
  """``(path, member)`` for ``metric`` and every metric inside its collections, depth first."""
  yield path, metric
  if isinstance(metric, LossesAndMetrics):
    parts = {"metrics": metric.metrics, "losses": metric.losses}
    for part in parts.values():
      if part is not None:
        yield from _members(part, path)
    return
  children = getattr(metric, "children", None)
  if isinstance(children, dict):
    for key, child in children.items():
      if isinstance(child, Metric):
        yield from _members(child, f"{path}/{key}" if path else key)


def find_metric(m: Any, kind: type, argname: str = "m", name: str | None = None) -> Any:
  """The metric of type ``kind`` in ``m``: a metric, a collection, or `EvalResults`.

  Args:
    m: a ``kind`` instance (returned as it is), a collection holding one, or a
      ``masked_eval`` result (its ``.metric`` is searched).
    kind: the metric class wanted, e.g. ``pe.metrics.AUROC``.
    argname: the argument's name, for error messages.
    name: the member's key in the collection (``"auroc"``, or ``"group/auroc"`` for
      nested dicts) when it holds several ``kind`` metrics.

  Returns:
    The ``kind`` metric.

  Raises:
    ValueError: ``m`` holds no ``kind`` metric, several and ``name`` does not pick one,
      or is an `EvalResults` of values alone (``.metric`` None).
  """
  if isinstance(m, EvalResults):
    if m.metric is None:
      raise ValueError(
        f"{argname} is an EvalResults of values alone (its .metric is None); pass the "
        "result masked_eval returned (or its .metric) to draw it"
      )
    m = m.metric
  if not isinstance(m, Metric):
    raise ValueError(
      f"{argname} must be a padded_eval.metrics.{kind.__name__}, a collection holding one, "
      f"or a masked_eval result; got {type(m).__name__}"
    )
  found = [(path, member) for path, member in _members(m, "") if isinstance(member, kind)]
  if name is not None:
    found = [(path, member) for path, member in found if path == name]
  if len(found) == 1:
    return found[0][1]
  paths = [path for path, member in _members(m, "") if isinstance(member, kind)]
  if not paths:
    raise ValueError(
      f"{argname} must be a padded_eval.metrics.{kind.__name__}, a collection holding one, "
      f"or a masked_eval result; got {type(m).__name__} (holding none)"
    )
  raise ValueError(
    f"{argname} holds {len(paths)} {kind.__name__} metrics {paths}; pick one with name=; "
    f"got name={name!r}"
  )
