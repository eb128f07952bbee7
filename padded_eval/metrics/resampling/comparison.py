"""compare: is model B better than model A? A paired bootstrap from two separate runs.

Replica ``r`` of a :class:`~padded_eval.metrics.resampling.bootstrap.Bootstrap` counts example ``i``
``k_ri`` times, a pure function of ``(seed, r, id_i)``. Two runs over the same examples with
the same seed and replica count therefore weight every example identically in replica
``r``: the replica differences ``D_r = B_r - A_r`` are a paired bootstrap of the difference
``d = B - A`` of the point estimates, with no need to hold both models in one pass. The
example ids are checked through an order-free checksum each Bootstrap keeps
(:meth:`~padded_eval.metrics.resampling.bootstrap.Bootstrap.examples_checksum`).

* ``difference``: ``d = b.compute() - a.compute()`` (exact point estimates);
* ``low``, ``high``: the percentile interval of the ``D_r`` (``(1 - c) / 2`` and
  ``(1 + c) / 2`` quantiles, linear interpolation as ``numpy.quantile``);
* ``p_value``: two-sided, ``min(1, 2 min((#{D_r <= 0} + 1) / (R + 1), (#{D_r >= 0} + 1) /
  (R + 1)))``: below ``1 - c`` exactly when the interval (nearly) excludes 0; a model
  compared with itself gives ``d = 0`` and ``p_value = 1``.

Pairing removes the examples' shared difficulty from the spread: the interval is narrower
than the one for two independent runs (``sqrt(var A + var B)``) whenever the models agree on
which examples are hard (``tests/metrics/resampling/test_comparison.py`` measures both).

Example:
  >>> import jax.numpy as jnp
  >>> import padded_eval as pe
  >>> boot = pe.metrics.Bootstrap(pe.metrics.Mean(), num_replicas=200)
  >>> ids = jnp.arange(100)
  >>> a = boot.update(values=jnp.sin(ids * 1.0), index=ids)
  >>> b = boot.update(values=jnp.sin(ids * 1.0) + 0.1, index=ids)
  >>> result = pe.metrics.compare(a, b)
  >>> round(result["difference"], 4), round(result["low"], 4), result["p_value"] < 0.01
  (0.1, 0.1, True)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval import validation
from padded_eval.metrics.resampling.bootstrap import Bootstrap
from padded_eval.metrics.resampling.sliced import Sliced


def _bootstraps(metric: Any, argname: str) -> Bootstrap:
  """The Bootstrap of ``metric`` (itself, or the slices of a ``Sliced(Bootstrap)``)."""
  inner = metric.slices if isinstance(metric, Sliced) else metric
  if not isinstance(inner, Bootstrap):
    raise ValueError(
      f"compare takes two pe.metrics.Bootstrap metrics (or Sliced(Bootstrap(...))), e.g. "
      f"results.metric of two masked_eval runs; got {argname}={type(metric).__name__}"
      + (f"({type(inner).__name__})" if isinstance(metric, Sliced) else "")
    )
  return inner


def _check_paired(a: Any, b: Any) -> None:
  """Raises ValueError unless ``a`` and ``b`` resample the same examples the same way."""
  if isinstance(a, Sliced) != isinstance(b, Sliced):
    raise ValueError(
      f"compare needs both metrics sliced or both not; got a={type(a).__name__}, "
      f"b={type(b).__name__}"
    )
  if isinstance(a, Sliced) and a.num_slices != b.num_slices:
    raise ValueError(f"a has {a.num_slices} slices but b {b.num_slices}; expected the same")
  boot_a, boot_b = _bootstraps(a, "a"), _bootstraps(b, "b")
  for field in ("seed", "num_replicas"):
    mine, theirs = getattr(boot_a, field), getattr(boot_b, field)
    if mine != theirs:
      raise ValueError(
        f"a and b are not paired: {field}={mine} vs {theirs}. Evaluate both with the same "
        f"Bootstrap(..., num_replicas=, seed=) so replica r weights each example alike"
      )
  if type(boot_a.point) is not type(boot_b.point):
    raise ValueError(
      f"a wraps {type(boot_a.point).__name__} but b {type(boot_b.point).__name__}; "
      "expected the same metric"
    )
  ids_a, ids_b = boot_a.examples_checksum(), boot_b.examples_checksum()  # [..., 9]
  if not np.array_equal(ids_a, ids_b):
    rows_a, rows_b = ids_a[..., 0], ids_b[..., 0]
    where = ""
    if ids_a.ndim == 2:
      differ = np.flatnonzero(np.any(ids_a != ids_b, axis=-1))
      where = f" in slices {differ[:10].tolist()}{' ...' if len(differ) > 10 else ''}"
    raise ValueError(
      f"a and b are not over the same examples{where}: {np.sum(rows_a)} vs {np.sum(rows_b)} "
      "real rows, and their row-id checksums differ. Compare runs over the same rows with "
      'the same ids (pe.pad_batches(..., index_key="index"), index_offset= per process)'
    )


def _replicas(metric: Any):
  """The replicate values, replicas on the leading axis (``[R, S, ...]`` when sliced)."""
  if isinstance(metric, Sliced):
    per_slice = jax.vmap(lambda m: m.replicas())(metric.slices)  # [S, R, ...]
    return jax.tree.map(lambda r: jnp.swapaxes(r, 0, 1), per_slice)
  return metric.replicas()


def _to_host(value):
  value = np.asarray(jax.device_get(value), np.float64)
  return float(value) if value.ndim == 0 else value


def compare(a: Any, b: Any, confidence: float = 0.95) -> dict[str, Any]:
  """The paired bootstrap comparison of two runs: ``b - a``, its interval and p-value.

  Args:
    a, b: ``Bootstrap`` metrics (or ``Sliced(Bootstrap(...))``, compared slice by slice),
      e.g. ``results.metric`` of two ``masked_eval`` runs over the same examples with the
      same ``seed`` and ``num_replicas``.
    confidence: the interval's coverage, in ``(0, 1)``.

  Returns:
    ``{"difference", "low", "high", "p_value"}`` (see [the module docstring][padded_eval.metrics.resampling.comparison]): float64 numbers,
    arrays of the value's shape (``[num_slices, ...]`` when sliced, NaN for an empty
    slice), or dicts of them for a wrapped collection.

  Raises:
    ValueError: not two Bootstrap metrics; different seeds, replica counts, metrics or
      slice counts; examples that differ (the row-id checksums); a bad ``confidence``.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> ids = np.arange(200)
    >>> hits_a = (ids % 4 != 0).astype(np.float32)  # 150 of 200
    >>> hits_b = np.where(ids % 8 == 0, 1.0, hits_a).astype(np.float32)  # 175 of 200
    >>> boot = pe.metrics.Bootstrap(pe.metrics.Mean("x"), num_replicas=100, seed=0)
    >>> a, b = boot.update(x=hits_a, index=ids), boot.update(x=hits_b, index=ids)
    >>> result = pe.metrics.compare(a, b)
    >>> float(result["difference"]), bool(result["low"] > 0)  # b is better, beyond noise
    (0.125, True)
    >>> float(pe.metrics.compare(a, a)["p_value"])
    1.0
  """
  validation.check_probability("confidence", confidence)
  if not 0.0 < confidence < 1.0:
    raise ValueError(f"confidence must be in (0, 1); got {confidence}")
  _check_paired(a, b)
  tail = (1.0 - confidence) / 2.0
  difference = jax.tree.map(lambda x, y: jnp.asarray(y) - jnp.asarray(x), a.compute(), b.compute())
  deltas = jax.tree.map(lambda x, y: y - x, _replicas(a), _replicas(b))
  replicas = jax.tree.leaves(deltas)[0].shape[0]

  def p_value(delta):
    below = (jnp.sum(delta <= 0, axis=0) + 1) / (replicas + 1)
    above = (jnp.sum(delta >= 0, axis=0) + 1) / (replicas + 1)
    p = jnp.minimum(1.0, 2.0 * jnp.minimum(below, above))
    return jnp.where(jnp.any(jnp.isnan(delta), axis=0), jnp.nan, p)

  result = {
    "difference": difference,
    "low": jax.tree.map(lambda d: jnp.quantile(d, tail, axis=0), deltas),
    "high": jax.tree.map(lambda d: jnp.quantile(d, 1.0 - tail, axis=0), deltas),
    "p_value": jax.tree.map(p_value, deltas),
  }
  return jax.tree.map(_to_host, result)
