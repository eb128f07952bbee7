"""How regression metrics of ``D`` outputs combine their per-output scores (scikit-learn).

``multioutput`` is ``"raw_values"`` (the ``[D]`` scores), ``"uniform_average"``, their
mean, ``"variance_weighted"`` (where offered: weighted by each output's target
variance), or a sequence of ``D`` non-negative weights (``np.average`` of the scores
with those weights, as scikit-learn's array ``multioutput``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

MULTIOUTPUT_NAMES = ("uniform_average", "variance_weighted", "raw_values")


def check_multioutput(metric, num_outputs: int, allowed: tuple[str, ...]) -> None:
  """Validates ``metric.multioutput``; a sequence of weights is stored as a float tuple.

  Raises:
    ValueError: naming ``multioutput``, what came and what is expected.
  """
  value = metric.multioutput
  if isinstance(value, str):
    if value not in allowed:
      raise ValueError(
        f"multioutput must be one of {allowed} or {num_outputs} weights; got {value!r}"
      )
    return
  try:
    weights = tuple(float(x) for x in np.asarray(value, np.float64).reshape(-1))
    shape = np.shape(value)
  except (TypeError, ValueError) as err:
    raise ValueError(
      f"multioutput must be one of {allowed} or a sequence of {num_outputs} weights; got {value!r}"
    ) from err
  if shape != (num_outputs,):
    raise ValueError(
      f"multioutput weights must have shape ({num_outputs},) (one per output, num_outputs="
      f"{num_outputs}); got shape {shape}"
    )
  if not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
    raise ValueError(f"multioutput weights must be finite, >= 0 and not all 0; got {weights}")
  object.__setattr__(metric, "multioutput", weights)


def combine(scores: jax.Array, multioutput, variance_weights: jax.Array | None = None):
  """The combined score: ``scores`` ``[D]`` (or a scalar when ``D == 1``) as asked.

  ``variance_weights`` (``[D]``, >= 0) serve ``"variance_weighted"``; all zero falls back
  to the uniform mean, as scikit-learn.
  """
  if multioutput == "raw_values" or jnp.ndim(scores) == 0:
    return scores
  if isinstance(multioutput, tuple):
    weights = jnp.asarray(multioutput, jnp.float32)
    return jnp.sum(weights * scores) / jnp.sum(weights)
  if multioutput == "variance_weighted" and variance_weights is not None:
    total = jnp.sum(variance_weights)
    weighted = jnp.sum(variance_weights * scores) / jnp.where(total > 0, total, 1.0)
    return jnp.where(total > 0, weighted, jnp.mean(scores))
  return jnp.mean(scores)
