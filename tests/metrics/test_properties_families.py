"""Property suite, issue 29's families: ranking, images, regression extras, the report.

Every property feeds random data through a random padded batching, merge tree and
device count (``metric_checks.evaluate_randomly``) and compares with float64 references
(``tests/family_references.py``: scikit-learn, scikit-image, numpy) on the values the
metric sees.

Tolerances (``EPS = 2**-24``): a query's or an image's value is formed in float32 from a
handful of rounded operations on its own candidates or pixels (ranking: a sum of at most
``L`` terms and one division, ``<= 16 EPS`` relative for the lists here; PSNR: the MSE's
sum and a log, ``<= 64 EPS`` of the value in dB; SSIM: the window sums, variances around
the image mean and a quotient per pixel, ``<= 1e-5`` of 1 as the issue allows); the mean
over queries or images adds ``<= 16 EPS`` per batch sum and double-float merges
(negligible). MAPE and MSLE follow the weighted means' bounds of
``test_properties_regression.py``; explained variance, R2's: ``64 EPS * max(1, ratio)``.
"""

from __future__ import annotations

import family_references as fam
import numpy as np
import sklearn.metrics
from hypothesis import given
from hypothesis import strategies as st
from metric_checks import assert_close, evaluate_randomly

import padded_eval as pe

EPS = 2.0**-24
SEEDS = st.integers(0, 2**32 - 1)
ROWS = st.integers(1, 40)
LIST = 7

RANKING = {
  "recall": lambda k: pe.metrics.RecallAtK(k),
  "precision": lambda k: pe.metrics.PrecisionAtK(k),
  "mrr": lambda k: pe.metrics.MRR(),
  "map": lambda k: pe.metrics.MAPAtK(k),
  "ndcg": lambda k: pe.metrics.NDCGAtK(k),
}


@given(
  seed=SEEDS,
  n=ROWS,
  name=st.sampled_from(sorted(RANKING)),
  k=st.sampled_from([None, 1, 3, 9]),
  decimals=st.sampled_from([0, 1, 4]),
  weighted=st.booleans(),
)
def test_ranking_any_batching_ties_and_list_lengths(seed, n, name, k, decimals, weighted):
  # lists of 0..7 candidates: the others carry relevance -1 (dropped, counted invalid); a list
  # left with none is not a query (as one whose candidates are masked)
  rng = np.random.default_rng(seed)
  preds = np.round(rng.standard_normal((n, LIST)), decimals).astype(np.float32)
  target = rng.integers(0, 4, size=(n, LIST)).astype(np.float32)
  lengths = rng.integers(0, LIST + 1, size=n)
  target[np.arange(LIST)[None, :] >= lengths[:, None]] = -1.0
  fields = {"preds": preds, "target": target}
  if weighted:
    fields["weights"] = rng.uniform(0.1, 2.0, n).astype(np.float32)
  got = evaluate_randomly(RANKING[name](k), fields, rng)
  batch = {**fields, "mask": np.ones(n, bool)}
  kept = [(s[r >= 0], r[r >= 0], w) for s, r, w in fam.queries([batch])]
  kept = [(s, r, w) for s, r, w in kept if len(r)]
  values = np.array([fam.RANKING_SCORES[name](s, r, k) for s, r, _ in kept])
  weights = np.array([w for _, _, w in kept])
  expected = np.sum(weights * values) / np.sum(weights) if kept else np.nan
  assert_close(got, expected, rtol=64 * EPS, atol=64 * EPS)


@given(
  seed=SEEDS,
  n=st.integers(1, 20),
  data_range=st.sampled_from([1.0, 255.0]),
  noise=st.sampled_from([1e-3, 0.1, 0.5]),
)
def test_psnr_any_batching(seed, n, data_range, noise):
  rng = np.random.default_rng(seed)
  target = (data_range * rng.random((n, 6, 5, 3))).astype(np.float32)
  preds = (target + noise * data_range * rng.standard_normal(target.shape)).astype(np.float32)
  got = evaluate_randomly(pe.metrics.PSNR(data_range), {"preds": preds, "target": target}, rng)
  want = fam.psnr_reference(data_range)(
    [{"preds": preds, "target": target, "mask": np.ones(n, bool)}]
  )
  assert_close(got, want, rtol=64 * EPS, atol=0.0)


@given(
  seed=SEEDS,
  n=st.integers(1, 12),
  offset=st.sampled_from([0.0, 100.0]),
  noise=st.sampled_from([0.01, 0.2]),
  padding=st.sampled_from(["reflect", "valid"]),
)
def test_ssim_any_batching_and_offset(seed, n, offset, noise, padding):
  # images far from 0 (offset 100, data_range 1): the variances do not cancel
  rng = np.random.default_rng(seed)
  target = (offset + rng.random((n, 12, 11, 2))).astype(np.float32)
  preds = (target + noise * rng.standard_normal(target.shape)).astype(np.float32)
  metric = pe.metrics.SSIM(1.0, padding=padding)
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  p, t = preds.astype(np.float64), target.astype(np.float64)
  per_image = fam.ssim_skimage if padding == "valid" else fam.ssim_numpy
  want = np.mean([per_image(a, b, 1.0) for a, b in zip(p, t)])
  assert_close(got, want, rtol=1e-5, atol=1e-6)


@given(
  seed=SEEDS,
  n=ROWS,
  scale=st.sampled_from([1e-3, 1.0, 1e3]),
  weighted=st.booleans(),
)
def test_mape_msle_explained_variance_any_batching(seed, n, scale, weighted):
  rng = np.random.default_rng(seed)
  target = (scale * rng.uniform(0.1, 3.0, n)).astype(np.float32)
  preds = (target * rng.uniform(0.5, 1.5, n)).astype(np.float32)
  weights = rng.uniform(0.1, 2.0, n).astype(np.float32) if weighted else None
  fields = {"preds": preds, "target": target}
  if weighted:
    fields["weights"] = weights
  p, t = preds.astype(np.float64), target.astype(np.float64)
  w = None if weights is None else weights.astype(np.float64)
  mape = evaluate_randomly(pe.metrics.MAPE(), fields, rng)
  want = sklearn.metrics.mean_absolute_percentage_error(t, p, sample_weight=w)
  assert_close(mape, want, rtol=32 * EPS, atol=16 * EPS * want)
  msle = evaluate_randomly(pe.metrics.MSLE(), fields, rng)
  want = sklearn.metrics.mean_squared_log_error(t, p, sample_weight=w)
  assert_close(msle, want, rtol=64 * EPS, atol=0.0)
  explained = evaluate_randomly(pe.metrics.ExplainedVariance(), fields, rng)
  want = sklearn.metrics.explained_variance_score(t, p, sample_weight=w)
  assert_close(explained, want, atol=64 * EPS * max(1.0, abs(1.0 - want)))


@given(seed=SEEDS, n=ROWS, num_classes=st.sampled_from([2, 5]))
def test_classification_report_any_batching(seed, n, num_classes):
  rng = np.random.default_rng(seed)
  target = rng.integers(0, num_classes, n).astype(np.int32)
  preds = np.where(rng.random(n) < 0.6, target, rng.integers(0, num_classes, n)).astype(np.int32)
  metric = pe.metrics.ClassificationReport(num_classes)
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  want = fam.report_table(
    [{"preds": preds, "target": target, "mask": np.ones(n, bool)}], num_classes
  )
  assert_close(got, want, rtol=4 * EPS, atol=0.0)
