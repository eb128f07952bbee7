"""Rows of the metric table for the regression half of issue 31, with float64 references:
scipy (``spearmanr``, ``kendalltau`` tau-b, ``entropy``), scikit-learn
(``mean_tweedie_deviance``, ``d2_tweedie_score``, ``explained_variance_score``) and numpy
from torchmetrics' documented formulas (``CosineSimilarity``: ``<p, t> / (|p| |t|)`` per row).

``REGRESSION_CASES`` join the main table (imported at the end of ``tests/metric_cases.py``):
every generic check (garbage padding, split and merge, jit, scan, pmap and shard_map on 8
devices) and every test over that table (weights included) runs on them. The rank
correlations refuse weights: ``RANK_CASES`` are run through every generic check by
``tests/metrics/regression/test_regression_metrics.py``, as the counting metrics' tables are.
"""

from __future__ import annotations

import numpy as np
import scipy.stats
import sklearn.metrics as skm
from metric_cases import MetricCase, padded_batches, real

import padded_eval as pe

M = pe.metrics
ROWS = 48  # NUM_BATCHES * BATCH_SIZE of the table: the most real rows a case has


def _tied_pair(columns=None):
  """Correlated preds / target rounded to halves (many exact ties), ``[b]`` or ``[b, D]``."""
  tail = () if columns is None else (columns,)

  def fields(rng, b):
    x = rng.standard_normal((b,) + tail)
    y = 0.6 * x + 0.8 * rng.standard_normal((b,) + tail)
    return {
      "preds": (np.round(2 * x) / 2).astype(np.float32),
      "target": (np.round(2 * y) / 2).astype(np.float32),
    }

  return fields


def _per_column(fn, columns=None):
  def reference(bs):
    x, y = real(bs, "preds"), real(bs, "target")
    if columns is None:
      return fn(x.ravel(), y.ravel()).statistic
    return np.array([fn(x[:, k], y[:, k]).statistic for k in range(columns)])

  return reference


def _cosine(bs, reduction="mean"):
  p, t = real(bs, "preds"), real(bs, "target")
  rows = np.sum(p * t, -1) / (np.linalg.norm(p, axis=-1) * np.linalg.norm(t, axis=-1))
  if reduction == "sum":
    return np.sum(rows)
  w = np.broadcast_to(real(bs, "weights"), rows.shape)
  return np.sum(w * rows) / np.sum(w)


def _kl(bs, log_prob=False):
  q, p = real(bs, "preds"), real(bs, "target")
  if log_prob:
    rows = np.sum(np.exp(p) * (p - q), -1)
  else:
    rows = scipy.stats.entropy(p, q, axis=-1)  # normalises each row, 0 log 0 = 0
  w = real(bs, "weights")
  return np.sum(w * rows) / np.sum(w)


def _distributions(rng, b):
  p = rng.uniform(0.0, 1.0, (b, 5))
  p[rng.random((b, 5)) < 0.15] = 0.0  # zeros in target add 0
  p[:, 0] += 0.05
  q = rng.uniform(0.05, 1.0, (b, 5))
  return {
    "preds": q.astype(np.float32),
    "target": p.astype(np.float32),
    "weights": rng.uniform(0.1, 2.0, b).astype(np.float32),
  }


def _log_distributions(rng, b):
  logits = rng.standard_normal((2, b, 4)) * 1.5
  log_probs = logits - np.log(np.sum(np.exp(logits), -1, keepdims=True))
  return {
    "preds": log_probs[0].astype(np.float32),
    "target": log_probs[1].astype(np.float32),
    "weights": rng.uniform(0.1, 2.0, b).astype(np.float32),
  }


def tweedie_fields(power):
  """Targets and predictions in the domain of ``power`` (zeros where allowed), weighted."""

  def fields(rng, b):
    y = rng.gamma(2.0, 1.0, b)
    if power < 0:
      y = y - 1.5  # any real target
    elif power < 2:
      y[rng.random(b) < 0.2] = 0.0  # zeros allowed for 1 <= p < 2
    mu = np.abs(y) * rng.uniform(0.7, 1.4, b) + 0.1
    return {
      "preds": mu.astype(np.float32),
      "target": y.astype(np.float32),
      "weights": rng.uniform(0.1, 2.0, b).astype(np.float32),
    }

  return fields


def _sk_tweedie(fn, power):
  def reference(bs):
    y, mu, w = real(bs, "target"), real(bs, "preds"), real(bs, "weights")
    return fn(y, mu, sample_weight=w, power=power)

  return reference


def _ev_constant_column(rng, b):
  target = (0.5 + 2.0 * rng.standard_normal((b, 3))).astype(np.float32)
  target[:, 1] = 0.0  # a constant target output
  preds = (target + rng.standard_normal((b, 3))).astype(np.float32)
  preds[:, 2] = target[:, 2] + 1.0  # residuals that do not vary
  return {"preds": preds, "target": target, "weights": rng.uniform(0.1, 2.0, b).astype(np.float32)}


def _sk_ev(multioutput, force_finite):
  def reference(bs):
    weights = np.array(multioutput) if isinstance(multioutput, tuple) else multioutput
    with np.errstate(divide="ignore", invalid="ignore"):
      return skm.explained_variance_score(
        real(bs, "target"),
        real(bs, "preds"),
        sample_weight=real(bs, "weights"),
        multioutput=weights,
        force_finite=force_finite,
      )

  return reference


RANK_CASES = [
  MetricCase(
    "spearman_ties",
    lambda: M.SpearmanCorrelation(capacity=ROWS),
    lambda rng: padded_batches(rng, _tied_pair()),
    _per_column(scipy.stats.spearmanr),
    rtol=1e-6,
    atol=1e-6,
  ),
  MetricCase(
    "spearman_outputs",
    lambda: M.SpearmanCorrelation(capacity=ROWS, num_outputs=3),
    lambda rng: padded_batches(rng, _tied_pair(3)),
    _per_column(scipy.stats.spearmanr, 3),
    rtol=1e-6,
    atol=1e-6,
  ),
  MetricCase(
    "kendall_tau_b_ties",
    lambda: M.KendallTau(capacity=ROWS),
    lambda rng: padded_batches(rng, _tied_pair()),
    _per_column(scipy.stats.kendalltau),
    rtol=1e-6,
    atol=1e-6,
  ),
  MetricCase(
    "kendall_tau_b_outputs",
    lambda: M.KendallTau(capacity=ROWS, num_outputs=3),
    lambda rng: padded_batches(rng, _tied_pair(3)),
    _per_column(scipy.stats.kendalltau, 3),
    rtol=1e-6,
    atol=1e-6,
  ),
]
REGRESSION_CASES = [
  MetricCase(
    "cosine_similarity_mean_weighted",
    lambda: M.CosineSimilarity(),
    lambda rng: padded_batches(
      rng,
      {
        "preds": lambda r, b: r.standard_normal((b, 6)).astype(np.float32),
        "target": lambda r, b: r.standard_normal((b, 6)).astype(np.float32),
        "weights": lambda r, b: r.uniform(0.1, 2.0, b).astype(np.float32),
      },
    ),
    _cosine,
    rtol=1e-6,
    atol=1e-6,
  ),
  MetricCase(
    "cosine_similarity_sum_tokens",
    lambda: M.CosineSimilarity(reduction="sum"),
    lambda rng: padded_batches(
      rng,
      {
        "preds": lambda r, b: (1e-20 * r.standard_normal((b, 4, 3))).astype(np.float32),
        "target": lambda r, b: (1e18 * r.standard_normal((b, 4, 3))).astype(np.float32),
      },
      token_axis=4,
    ),
    lambda bs: _cosine(bs, "sum"),
    rtol=1e-6,
    atol=1e-5,
  ),
  MetricCase(
    "kl_divergence_weighted",
    lambda: M.KLDivergence(),
    lambda rng: padded_batches(rng, _distributions),
    _kl,
    rtol=1e-6,
    atol=1e-6,
  ),
  MetricCase(
    "kl_divergence_log_prob_weighted",
    lambda: M.KLDivergence(log_prob=True),
    lambda rng: padded_batches(rng, _log_distributions),
    lambda bs: _kl(bs, log_prob=True),
    rtol=1e-6,
    atol=1e-6,
  ),
]
REGRESSION_CASES += [
  MetricCase(
    f"tweedie_deviance_power_{power}_weighted",
    lambda power=power: M.TweedieDevianceScore(power=power),
    lambda rng, power=power: padded_batches(rng, tweedie_fields(power)),
    _sk_tweedie(skm.mean_tweedie_deviance, power),
    rtol=1e-6,
    atol=1e-7,
  )
  for power in (-1.0, 0, 1, 1.5, 2, 3)
]
REGRESSION_CASES += [
  MetricCase(
    f"d2_tweedie_power_{power}_weighted",
    lambda power=power: M.D2TweedieScore(power=power),
    lambda rng, power=power: padded_batches(rng, tweedie_fields(power)),
    _sk_tweedie(skm.d2_tweedie_score, power),
    rtol=1e-5,
    atol=2e-6,
  )
  for power in (-1.0, 0, 1, 1.5, 2, 3)
]
REGRESSION_CASES += [
  MetricCase(
    f"explained_variance_{label}_finite_{force_finite}",
    lambda mo=mo, ff=force_finite: M.ExplainedVariance(
      num_outputs=3, multioutput=mo, force_finite=ff
    ),
    lambda rng: padded_batches(rng, _ev_constant_column),
    _sk_ev(mo, force_finite),
    rtol=1e-6,
    atol=1e-6,
    # compute options only: the update path is checked on the first row
    same_update_as=""
    if (label, force_finite) == ("raw", True)
    else "explained_variance_raw_finite_True",
  )
  for label, mo in (
    ("raw", "raw_values"),
    ("variance_weighted", "variance_weighted"),
    ("array", (0.2, 0.5, 1.3)),
  )
  for force_finite in (True, False)
]
