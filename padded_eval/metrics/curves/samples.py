"""Per-row areas over the labels: multilabel AUROC / AUPRC ``average="samples"``.

scikit-learn's ``average="samples"`` scores each row of a ``[N, C]`` multilabel batch as
one binary problem over its ``C`` labels and averages the rows. A row lies inside one batch,
so its area is computed there, exactly, from ``[C, C]`` comparisons of its counted labels
(ties as scikit-learn counts them); the state is the compensated sum of the row values and
the count of rows scored, merged by addition. See :mod:`padded_eval.metrics.curves.histogram`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _rows(scores, truth, valid):
  width = scores.shape[-1]
  return tuple(jnp.reshape(x, (-1, width)) for x in (scores, truth, valid))


def row_auroc(scores, truth, valid) -> tuple[jax.Array, jax.Array]:
  """``(value [R], scored [R])``: each row's ROC AUC over its counted labels,
  ``(pairs ranked right + ties / 2) / (P N)``; a row is scored when it has a counted
  positive and a counted negative (scikit-learn refuses the others)."""
  scores, truth, valid = _rows(scores, truth, valid)
  positive, negative = valid & truth, valid & ~truth
  pair = positive[:, :, None] & negative[:, None, :]  # [R, C (pos), C (neg)]
  above = scores[:, :, None] > scores[:, None, :]
  tied = scores[:, :, None] == scores[:, None, :]
  right = jnp.sum(pair & above, (1, 2), dtype=jnp.int32).astype(jnp.float32)
  ties = jnp.sum(pair & tied, (1, 2), dtype=jnp.int32).astype(jnp.float32)
  pairs = jnp.sum(positive, -1).astype(jnp.float32) * jnp.sum(negative, -1)
  scored = pairs > 0
  return jnp.where(scored, (right + 0.5 * ties) / jnp.where(scored, pairs, 1.0), 0.0), scored


def row_average_precision(scores, truth, valid) -> tuple[jax.Array, jax.Array]:
  """``(value [R], scored [R])``: each row's average precision over its counted labels,
  the mean over its positives of the precision of ``score >= theirs`` (scikit-learn's
  step-wise AP, ties included); a row without a counted positive scores 0 and a row with no
  counted label is not scored (scikit-learn's rule for ``average="samples"``)."""
  scores, truth, valid = _rows(scores, truth, valid)
  positive = valid & truth
  at_least = valid[:, None, :] & (scores[:, None, :] >= scores[:, :, None])  # [R, i, j]: s_j >= s_i
  retrieved = jnp.sum(at_least, -1).astype(jnp.float32)
  relevant = jnp.sum(at_least & truth[:, None, :], -1).astype(jnp.float32)
  precision = jnp.where(positive, relevant / jnp.maximum(retrieved, 1.0), 0.0)
  count = jnp.sum(positive, -1).astype(jnp.float32)
  value = jnp.sum(precision, -1) / jnp.maximum(count, 1.0)
  return value, jnp.any(valid, -1)
