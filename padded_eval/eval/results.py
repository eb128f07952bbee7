"""What ``masked_eval`` returns: a dict of computed values that also holds the final metric.

`EvalResults` is a plain ``dict`` (``metric.compute_logs()`` with Python floats and numpy
arrays, plus ``"num_examples"``), so logging, comparing and JSON-dumping it work as
before; its attribute ``metric`` is the final metric itself, reduced over every device
and process and on the host, whose exact state the pictures of `padded_eval.plot` and
the host views (``AUROC.curve()``, ``CalibrationError.bins()``,
``ConfusionMatrix.counts()``) read. `find_metric` picks one member of a collection.

For loggers, ``scalars()`` flattens it to ``{str: float}`` and ``write(writer, step)`` hands
that to a CLU ``metric_writers`` writer; `best` picks the best of several results (one per
checkpoint) by a key, in the direction its metric declares (``higher_is_better``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from padded_eval.collections import LossesAndMetrics, unique_name
from padded_eval.metrics.base import Metric

__all__ = ["EvalResults", "best", "direction_of", "find_metric"]


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

  def __init__(self, values: Mapping[str, Any], metric: Metric | None = None) -> None:
    super().__init__(values)
    self.metric = metric

  def __reduce__(self):  # pickles with its metric (dict subclasses drop attributes otherwise)
    return (type(self), (dict(self), self.metric))

  def scalars(self) -> dict[str, float]:
    """The values as one flat ``{str: float}`` (what metric writers and loggers take).

    A scalar keeps its key; an array value ``[C]`` becomes ``name/0``, ..., ``name/C-1``
    (``[C, C]``: ``name/i/j``); a nested dict joins its keys with ``"/"``. NaN (a metric
    that saw nothing) stays NaN; ``num_examples`` is included.

    Raises:
      ValueError: a value that is not numeric (named by its key).
    """
    flat: dict[str, float] = {}
    for key, value in self.items():
      _flat_scalars(str(key), value, flat)
    return flat

  def write(self, writer: Any, step: int) -> None:
    """``writer.write_scalars(step, self.scalars())``: the CLU ``metric_writers`` interface.

    Args:
      writer: a ``clu.metric_writers.MetricWriter`` (``SummaryWriter`` for TensorBoard,
        ``LoggingWriter``, ``create_default_writer(...)``) or anything with that method.
      step: int >= 0, the step the values belong to (the checkpoint's training step).

    Raises:
      ValueError: ``writer`` has no ``write_scalars``, or ``step`` is not an int >= 0.
    """
    if not callable(getattr(writer, "write_scalars", None)):
      raise ValueError(
        f"writer must have write_scalars(step, scalars) (a clu.metric_writers writer); got "
        f"{type(writer).__name__}"
      )
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
      raise ValueError(f"step must be an int >= 0 (the training step); got {step!r}")
    writer.write_scalars(int(step), self.scalars())


def _flat_scalars(key: str, value: Any, flat: dict[str, float]) -> None:
  if isinstance(value, Mapping):
    for inner, inner_value in value.items():
      _flat_scalars(f"{key}/{inner}", inner_value, flat)
    return
  array = np.asarray(value)
  if not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
    raise ValueError(f"value {key!r} is not numeric: got {type(value).__name__} {value!r}")
  if array.ndim == 0:
    flat[key] = float(array)
    return
  for index in np.ndindex(array.shape):
    flat["/".join([key, *map(str, index)])] = float(array[index])


def _members(metric: Metric, path: str):
  """``(path, member)`` for ``metric`` and every metric inside its collections, depth first.

  A ``LossesAndMetrics``'s members come in the order of its logs (its losses, then its
  metrics), each under the key it logs: a key taken already (``"loss"``, or a loss's
  ``"crossentropy"`` for a metric of that name) gets the suffix its logs give it
  (`padded_eval.collections.unique_name`: ``"crossentropy2"``)."""
  yield path, metric
  if isinstance(metric, LossesAndMetrics):
    taken = {"loss"}
    for part in (metric.losses, metric.metrics):
      if part is None:
        continue
      for inner, member in _members(part, ""):
        if inner:  # "": the part itself, a collection that logs nothing of its own
          inner = unique_name(inner, taken)
          taken.add(inner)
        yield "/".join(p for p in (path, inner) if p), member
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


def direction_of(m: Any, key: str) -> bool | None:
  """The direction of the value ``key`` of ``masked_eval``'s result for metric ``m``.

  Args:
    m: the metric or collection evaluated (or an `EvalResults`, whose ``.metric`` is read).
    key: a key of the result (``"accuracy"``, ``"group/auroc"``, ``"accuracy_low"`` of a
      `Bootstrap`, ``"precision/2"`` of an array value in :meth:`EvalResults.scalars`).

  Returns:
    The ``higher_is_better`` of the member that logs ``key`` (``"loss"`` of
    ``LossesAndMetrics``: False), or None when it has no direction or nothing logs it.
  """
  if isinstance(m, EvalResults):
    m = m.metric
  if not isinstance(m, Metric):
    return None
  found, longest = None, -1
  for path, member in _members(m, ""):
    if isinstance(member, LossesAndMetrics) and key == (f"{path}/loss" if path else "loss"):
      return False  # its total loss, at any depth
    if isinstance(member, LossesAndMetrics) or isinstance(getattr(member, "children", None), dict):
      continue  # a collection: its members log the values
    prefix = path or member.name
    matches = key == prefix or key.startswith((prefix + "/", prefix + "_"))
    if matches and len(prefix) > longest:
      found, longest = member.higher_is_better, len(prefix)
  return found


def best(
  results: Sequence[Mapping] | Mapping[Any, Mapping],
  key: str,
  *,
  higher_is_better: bool | None = None,
) -> Any:
  """Which of several results is best by ``key`` (e.g. one result per checkpoint).

  Args:
    results: a list of results (``masked_eval``'s `EvalResults`, or dicts), or a mapping
      ``{checkpoint: result}``.
    key: the value compared: a key of the results, or of their :meth:`EvalResults.scalars`
      (``"f1score/2"`` for class 2 of an array value).
    higher_is_better: whether higher is better; default: the ``higher_is_better`` its metric declares
      (read from the results' ``.metric``).

  Returns:
    The index of the best result (the key, for a mapping); the first one on ties. A NaN
    value (a metric that saw nothing) is never best.

  Raises:
    ValueError: no results, a result without ``key`` or whose value is not one number,
      every value NaN, or no known direction (pass ``higher_is_better=``).

  Example:
    >>> import padded_eval as pe
    >>> runs = [pe.EvalResults({"mse": 0.5}), pe.EvalResults({"mse": 0.25})]
    >>> pe.best(runs, "mse", higher_is_better=False)
    1
  """
  items = list(results.items()) if isinstance(results, Mapping) else list(enumerate(results))
  if not items:
    raise ValueError("results is empty; expected at least one result to choose from")
  values = []
  for name, result in items:
    if not isinstance(result, Mapping):
      raise ValueError(f"results[{name!r}] must be a result dict; got {type(result).__name__}")
    flat = result.scalars() if isinstance(result, EvalResults) else EvalResults(result).scalars()
    if key not in flat:
      raise ValueError(
        f"results[{name!r}] has no value {key!r}; it has {sorted(flat)} (array values are "
        "name/i, as in EvalResults.scalars())"
      )
    values.append(flat[key])
  higher = higher_is_better
  if higher is None:
    found = (direction_of(r, key) for _, r in items if getattr(r, "metric", None))
    directions = {d for d in found if d is not None}
    if len(directions) != 1:
      raise ValueError(
        f"the direction of {key!r} is not known (its metric declares higher_is_better "
        f"{sorted(directions) or None}); pass higher_is_better=True or False"
      )
    higher = directions.pop()
  candidates = [(v, i) for i, v in enumerate(values) if not math.isnan(v)]
  if not candidates:
    raise ValueError(f"every result's {key!r} is NaN (its metric saw no real element)")
  sign = -1.0 if higher else 1.0
  _, index = min(candidates, key=lambda pair: (sign * pair[0], pair[1]))
  return items[index][0]
