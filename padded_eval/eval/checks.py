"""What `masked_eval` checks on the finished metric, and the dict it returns.

A finished run's metric is fetched once; before its logs are returned, ``on_invalid`` decides
what happens to what the metrics counted but could not raise inside the compiled step: padded
rows counted (an update without ``mask=``), values given one per batch (a mean of batch means),
and invalid values in real rows (`InvalidValuesWarning`).
"""

from __future__ import annotations

import os
import sys
import warnings

import jax
import numpy as np

from padded_eval.eval import cache as cache_lib
from padded_eval.eval import outputs as outputs_lib
from padded_eval.eval.results import EvalResults
from padded_eval.metrics.base import Metric

__all__ = ["NUM_EXAMPLES", "InvalidValuesWarning", "checked", "package_dir", "results"]

NUM_EXAMPLES = "num_examples"

package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The package's folder: frames of files under it are the driver's, not the user's."""


class InvalidValuesWarning(RuntimeWarning):
  """``masked_eval(..., on_invalid="warn")``: the metrics counted invalid values in real rows.

  Examples:
    >>> import warnings
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> data = {"logits": np.eye(3, dtype=np.float32), "label": np.array([0, 1, 7])}  # 7: no such class
    >>> def step(params, batch):
    ...   return pe.metrics.Accuracy().batch_updates(
    ...     preds=batch["logits"], target=batch["label"], mask=batch["mask"])
    >>> with warnings.catch_warnings(record=True) as caught:
    ...   warnings.simplefilter("always")
    ...   results = pe.masked_eval(step, None, pe.pad_batches(data, 8), backend="jit", on_invalid="warn")
    >>> any(issubclass(w.category, pe.InvalidValuesWarning) for w in caught)
    True
  """


def checked(results: EvalResults, num_examples: int, on_invalid: str) -> EvalResults:
  """``results`` after the checks of ``on_invalid`` on its metric (rows counted, invalid values)."""
  metric = results.metric
  assert metric is not None  # a finished run holds its metric
  _check_example_counts(metric, num_examples, on_invalid)
  _report_invalid(metric, on_invalid)
  return results


def results(metric: Metric, num_examples: int, on_invalid: str) -> EvalResults:
  """The returned dict: the metric's logs and ``num_examples``, after the checks of ``on_invalid``."""
  _check_example_counts(metric, num_examples, on_invalid)
  _report_invalid(metric, on_invalid)
  logs = dict(cache_lib.metric_logs(metric))
  if NUM_EXAMPLES in logs:
    raise ValueError(
      f"the metric logs a value named {NUM_EXAMPLES!r}, which masked_eval reserves for "
      "the count of real rows; rename the metric (name=...)"
    )
  logs.pop(outputs_lib.NO_STATISTICS, None)  # a step that returned per-row outputs alone
  logs = jax.tree.map(_to_python, logs)
  logs[NUM_EXAMPLES] = num_examples
  return EvalResults(logs, metric)


def _check_example_counts(metric: Metric, num_examples: int, on_invalid: str) -> None:
  """Raises or warns (per ``on_invalid``) if a metric counted more rows than were real.

  Each metric (each member of a collection) that can say reports the rows it counted
  (``Metric.example_report()``); more than ``num_examples`` means it counted padded
  rows, the sign of an update without ``mask=batch["mask"]``.
  """
  if on_invalid == "ignore":
    return
  _check_per_batch(metric, num_examples, on_invalid)
  over = [(name, n) for name, n in metric.example_report() if n > num_examples]
  if not over:
    return
  counted = "; ".join(f"{name!r} counted {n} rows" for name, n in over)
  message = (
    f"masked_eval: {counted}, but the batches held {num_examples} real rows: padded rows "
    'were counted. Pass mask=batch["mask"] to every metric\'s update / batch_updates in '
    "step_fn"
  )
  if on_invalid == "raise":
    raise ValueError(f"{message} (on_invalid='warn' or 'ignore' skips this check)")
  warnings.warn(message, InvalidValuesWarning, stacklevel=_user_stacklevel())


def _check_per_batch(metric: Metric, num_examples: int, on_invalid: str) -> None:
  """Raises or warns (per ``on_invalid``) if a metric averaged values given one per batch while
  the batches held real rows (`Metric.per_batch_report`): a mean of batch means."""
  names = metric.per_batch_report() if num_examples > 0 else []
  if not names:
    return
  message = (
    f"masked_eval: {', '.join(repr(name) for name in names)} got one value per batch (a "
    "scalar, e.g. jnp.mean(per_row_loss); under pmap and shard_map one per device) and counted no "
    f"row, while the batches held {num_examples} real rows: the result would be a mean of batch "
    "means, which weights a half-padded batch like a full one. Pass one value per row with the "
    'mask: pe.metrics.Mean("loss").batch_updates(loss=per_row_loss, mask=batch["mask"]); to '
    "average per-batch values on purpose, configure the metric with per_batch=True (e.g. "
    'pe.metrics.Mean("loss", per_batch=True), with weights=batch["mask"].sum() to weight each '
    "batch by its real rows)"
  )
  if on_invalid == "raise":
    raise ValueError(f"{message} (on_invalid='warn' or 'ignore' skips this check)")
  warnings.warn(message, InvalidValuesWarning, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
  """``warnings.warn``'s stacklevel, for the caller of this function, that names the first frame
  outside the package: the user's call of `masked_eval`, however deep the driver calls."""
  frame, level = sys._getframe(1), 1
  while frame is not None and frame.f_code.co_filename.startswith(package_dir):
    frame, level = frame.f_back, level + 1
  return level


def _report_invalid(metric: Metric, on_invalid: str) -> None:
  """Raises or warns (per ``on_invalid``) if ``metric`` counted invalid values in real rows."""
  report = [] if on_invalid == "ignore" else metric.invalid_report()
  if not report:
    return
  counted = "; ".join(f"{name!r}: {count} x {kind!r}" for name, kind, count in report)
  message = f"masked_eval: the metrics counted invalid values in real rows: {counted}"
  if on_invalid == "raise":
    raise ValueError(
      f"{message}. Fix the inputs, or pass on_invalid='warn' to get the results with a "
      "warning (on_invalid='ignore' to get them silently)"
    )
  warnings.warn(message, InvalidValuesWarning, stacklevel=_user_stacklevel())


def _to_python(value):
  """A scalar -> Python float; an array -> numpy array."""
  value = np.asarray(value)
  return float(value) if value.ndim == 0 else value
