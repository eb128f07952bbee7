"""padded_eval inside other libraries' metric APIs: nnx and CLU.

* ``pe.nnx.Metric(metric)`` (`padded_eval.ecosystem.nnx`): an ``nnx.Metric`` for
  ``nnx.MultiMetric``, beside nnx's own metrics, under ``nnx.jit``;
* ``pe.clu.metric(metric)`` (`padded_eval.ecosystem.clu`): a ``clu.metrics.Metric`` subclass
  for ``clu.metrics.Collection.create(...)``.

Each wraps any padded_eval metric or collection; the numbers are the wrapped metric's (exact,
masked by selection). flax and clu stay optional: this folder's modules import them, and the
package's facade imports those modules only when ``pe.nnx`` or ``pe.clu`` is first read (so
this ``__init__`` re-exports nothing; it holds the check both wrappers share). docs/architecture.md,
"Folders and layers".
"""

from typing import Any

from padded_eval.metrics.base import Metric


def check_wrapped(metric: Any, wrapper: str) -> None:
  """Raises ValueError unless `metric` is a padded_eval metric or collection (what `wrapper` wraps)."""
  if not isinstance(metric, Metric):
    raise ValueError(
      f"{wrapper} wraps a padded_eval metric or collection (e.g. pe.metrics.Accuracy(), "
      f"pe.Metrics([...]); a loss as pe.Metrics([loss])); got metric={metric!r}"
    )
