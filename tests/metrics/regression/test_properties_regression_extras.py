"""Property suite, issue 31's regression half: rank correlations, deviances, similarities and
ExplainedVariance's options, through a random padded batching, merge tree and device count
(``metric_checks.evaluate_randomly``), against scipy / scikit-learn in float64.

Tolerances (``EPS = 2**-24``):

* Spearman, Kendall: the ranks and pair counts are exact integers (below ``2**23``), so the
  only roundings are Pearson's of the ranks (``64 EPS``, as ``PearsonCorrelation``) and tau's
  final division and square roots (``4 EPS``): ``atol = 64 EPS``. Ranks do not see the
  scale: values of scale 1e-25 or 1e18 give the same answer.
* Tweedie deviance: each unit deviance keeps its relative precision near the target (no
  cancellation of the textbook form, see ``padded_eval/metrics/regression/deviance.py``); far from it the
  two ``expm1`` terms, and ``y**(2 - p)``, cost about ``|2 - p|`` times a few ``EPS`` (2.9e-6
  measured at ``p = -1.5``); the mean of non-negative terms adds the weighted mean's ``20
  EPS``: ``rtol = 64 EPS * max(1, |2 - p|)``.
* Cosine similarity: each row's value to ``8 EPS`` (dot product of ``D <= 6`` scaled terms,
  two norms): ``atol = 16 EPS`` on the mean of values in ``[-1, 1]``.
* ExplainedVariance with ``force_finite=False``: as R2, ``64 EPS * max(1, ratio)``; the
  constant and non-varying outputs are exact (NaN / -inf / 1).
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.stats
import sklearn.metrics
from hypothesis import given
from hypothesis import strategies as st
from metric_checks import assert_close, evaluate_randomly

import padded_eval as pe

EPS = 2.0**-24
SEEDS = st.integers(0, 2**32 - 1)


@given(
  seed=SEEDS,
  n=st.integers(2, 40),
  levels=st.sampled_from([3, 10, 1000]),
  scale=st.sampled_from([1e-25, 1.0, 1e18]),
  kendall=st.booleans(),
)
def test_rank_correlations_match_scipy(seed, n, levels, scale, kendall):
  rng = np.random.default_rng(seed)
  x = rng.integers(0, levels, n).astype(np.float64)
  y = x + rng.integers(0, levels, n)
  preds, target = (scale * x).astype(np.float32), (scale * y).astype(np.float32)
  cls, ref = (
    (pe.metrics.KendallTau, scipy.stats.kendalltau)
    if kendall
    else (pe.metrics.SpearmanCorrelation, scipy.stats.spearmanr)
  )
  got = evaluate_randomly(cls(capacity=40), {"preds": preds, "target": target}, rng)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # scipy warns on a constant input (nan)
    expected = ref(preds.astype(np.float64), target.astype(np.float64)).statistic
  assert_close(got, expected, atol=64 * EPS)


@given(
  seed=SEEDS,
  n=st.integers(1, 40),
  power=st.sampled_from([-2.0, 0.0, 1.0, 1.2, 2.0, 2.5, 3.0]),
  weighted=st.booleans(),
  closeness=st.sampled_from([1e-4, 0.3]),
)
def test_tweedie_deviance_matches_sklearn(seed, n, power, weighted, closeness):
  rng = np.random.default_rng(seed)
  target = rng.gamma(2.0, 1.0, n) + (0.05 if power >= 2 else 0.0)
  if power < 0:
    target -= 1.0
  preds = np.abs(target) * np.exp(closeness * rng.standard_normal(n)) + 0.01
  target, preds = target.astype(np.float32), preds.astype(np.float32)
  weights = rng.uniform(0.1, 2.0, n).astype(np.float32) if weighted else None
  fields = {"preds": preds, "target": target, **({} if weights is None else {"weights": weights})}
  got = evaluate_randomly(pe.metrics.TweedieDevianceScore(power=power), fields, rng)
  expected = sklearn.metrics.mean_tweedie_deviance(
    target.astype(np.float64),
    preds.astype(np.float64),
    power=power,
    sample_weight=None if weights is None else weights.astype(np.float64),
  )
  assert_close(got, expected, rtol=64 * EPS * max(1.0, abs(2.0 - power)), atol=1e-30)


@given(
  seed=SEEDS, n=st.integers(1, 40), d=st.integers(1, 6), scale=st.sampled_from([1e-20, 1.0, 1e18])
)
def test_cosine_similarity_matches_numpy(seed, n, d, scale):
  rng = np.random.default_rng(seed)
  preds = (scale * rng.standard_normal((n, d))).astype(np.float32)
  target = rng.standard_normal((n, d)).astype(np.float32)
  got = evaluate_randomly(pe.metrics.CosineSimilarity(), {"preds": preds, "target": target}, rng)
  p, t = preds.astype(np.float64), target.astype(np.float64)
  rows = np.sum(p * t, -1) / (np.linalg.norm(p, axis=-1) * np.linalg.norm(t, axis=-1))
  assert_close(got, np.mean(rows), atol=16 * EPS)


@given(seed=SEEDS, n=st.integers(2, 40), weighted=st.booleans())
def test_explained_variance_not_forced_finite_matches_sklearn(seed, n, weighted):
  rng = np.random.default_rng(seed)
  target = rng.standard_normal((n, 3)).astype(np.float32)
  target[:, 1] = 0.0
  preds = (target + rng.standard_normal((n, 3))).astype(np.float32)
  preds[:, 2] = target[:, 2] - 2.0
  preds[: n // 2, 1] = 0.0 if rng.random() < 0.5 else preds[: n // 2, 1]
  weights = rng.uniform(0.1, 2.0, n).astype(np.float32) if weighted else None
  fields = {"preds": preds, "target": target, **({} if weights is None else {"weights": weights})}
  metric = pe.metrics.ExplainedVariance(num_outputs=3, multioutput="raw_values", force_finite=False)
  got = evaluate_randomly(metric, fields, rng)
  with np.errstate(divide="ignore", invalid="ignore"):
    expected = sklearn.metrics.explained_variance_score(
      target.astype(np.float64),
      preds.astype(np.float64),
      sample_weight=None if weights is None else weights.astype(np.float64),
      multioutput="raw_values",
      force_finite=False,
    )
  assert_close(got, expected, atol=64 * EPS * max(1.0, float(np.nanmax(np.abs(expected[:1])))))
