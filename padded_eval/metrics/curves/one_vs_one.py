"""One-vs-one multiclass AUROC (scikit-learn's ``roc_auc_score(multi_class="ovo")``).

The state is one exact histogram per (score column ``a``, true class ``t``): row ``a * C + t``
counts the elements of class ``t`` by the bin of their class-``a`` score (``C * C`` rows of
``num_thresholds`` bins). The pair ``(a, b)`` is then two binary problems on the elements of
class ``a`` or ``b``: positives ``a`` against negatives ``b`` on column ``a`` (rows ``a C + a``
and ``a C + b``), and the reverse on column ``b``; its score is their mean (Hand and Till),
averaged over the pairs of classes that occur (``"macro"``) or weighted by the pair's
elements (``"weighted"``), as scikit-learn does. See :mod:`padded_eval.metrics.curves.histogram`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.masking import leading_ones

OVO_AVERAGES = ("macro", "weighted")


def pair_histogram(bins, labels, valid, num_classes: int, num_bins: int) -> jax.Array:
  """int32 ``[C * C, T]``: row ``a * C + t`` counts valid elements of class ``t`` by the bin
  of their class-``a`` score (``bins`` int32 ``[..., C]``, ``labels`` ``[...]``, ``valid``
  bool ``[..., C]``); one scatter-add."""
  c, t = num_classes, num_bins
  column = jnp.arange(c)
  index = leading_ones(column, labels.ndim) * (c * t) + labels[..., None] * t + bins
  flat = jnp.where(valid, index, c * c * t).reshape(-1)
  counts = jnp.zeros((c * c * t,), jnp.int32).at[flat].add(1, mode="drop")
  return counts.reshape(c * c, t)


def ordered_pairs(num_classes: int) -> tuple[np.ndarray, np.ndarray]:
  """``(positive rows, negative rows)`` of the ``C (C - 1)`` ordered pairs ``(a, b)``, ``a !=
  b``, in the pair histogram (``a C + a`` and ``a C + b``), ordered ``(a, b)`` row-major."""
  a, b = np.nonzero(~np.eye(num_classes, dtype=bool))
  return a * num_classes + a, a * num_classes + b


def pair_mean(per_ordered_pair: jax.Array, class_counts: jax.Array, included, average: str):
  """The average over unordered pairs ``a < b`` of ``(v[a, b] + v[b, a]) / 2``.

  Args:
    per_ordered_pair: float32 ``[C (C - 1)]`` in :func:`ordered_pairs` order.
    class_counts: float32 ``[C]`` counted elements per true class.
    included: bool ``[C]`` classes that may form pairs (not an ignored class id).
    average: ``"macro"`` (pairs of classes that occur) or ``"weighted"`` (by the pair's
      elements, scikit-learn's prevalence).

  Returns:
    float32 scalar; NaN when no pair of occurring classes exists.
  """
  c = class_counts.shape[0]
  values = jnp.zeros((c, c), jnp.float32).at[~np.eye(c, dtype=bool)].set(per_ordered_pair)
  pair_values = 0.5 * (values + values.T)
  upper = np.triu(np.ones((c, c), bool), 1)
  present = included & (class_counts > 0)
  usable = upper & present[:, None] & present[None, :] & ~jnp.isnan(pair_values)
  if average == "weighted":
    weight = class_counts[:, None] + class_counts[None, :]
  else:
    weight = jnp.ones((c, c), jnp.float32)
  weight = jnp.where(usable, weight, 0.0)
  total = jnp.sum(weight)
  mean = jnp.sum(weight * jnp.where(usable, pair_values, 0.0)) / jnp.where(total > 0, total, 1.0)
  return jnp.where(total > 0, mean, jnp.nan)
