"""Property suite, scores: AUROC and AUPRC (exact ``binning="linear"`` mode on grid
scores), CalibrationError and Perplexity, against scikit-learn / numpy in float64.

Random data go through a random padded batching, merge tree and device count
(``metric_checks.evaluate_randomly``).

Tolerances, from float32 analysis (``EPS = 2**-24``):

* AUROC / AUPRC: the histograms are exact counts; the area is a float32 sum of
  ``num_thresholds`` non-negative terms, each a product or ratio of exact counts (two or
  three roundings): ``rtol = (num_thresholds + 4) EPS``.
* CalibrationError: per-bin confidence totals are float32 sums of at most 16 values per
  batch (``16 EPS`` relative), then ``gap = (hits - confidence) / count`` and a weighted
  sum over ``n_bins``: ``atol = (n_bins + 24) EPS`` (every term is at most 1).
* Perplexity: a float32 log-softmax over ``V`` logits loses ``(V + 4) EPS (1 + CE)`` per
  token, the float32 batch sum of ``16 T`` token losses ``16 T EPS`` relative; the
  relative error of ``exp(mean CE)`` is the absolute error of the mean:
  ``rtol = (V + 4 + 16 T) EPS (1 + mean CE)``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import scipy.special
import sklearn.metrics as skm
from hypothesis import given
from hypothesis import strategies as st
from metric_checks import assert_close, evaluate_randomly

import padded_eval as pe

EPS = 2.0**-24
SEEDS = st.integers(0, 2**32 - 1)
GRID = 100  # scores k / GRID; num_thresholds = GRID + 1 gives each grid value its own bin
C = 3
CURVE_RTOL = (GRID + 1 + 4) * EPS


def _grid_scores(rng, shape, separation, target, step=1):
  """Scores on the grid k / GRID, higher for positives by ``separation`` grid steps; only
  multiples of ``step`` (a coarse step makes many real ties between the classes)."""
  k = rng.integers(0, GRID // step + 1, size=shape) * step + separation * target
  return (np.clip(k, 0, GRID) / GRID).astype(np.float32)


def _curves(**config):
  kw = dict(config, num_thresholds=GRID + 1, binning="linear")
  return pe.Metrics({"auroc": pe.metrics.AUROC(**kw), "auprc": pe.metrics.AUPRC(**kw)})


@given(
  seed=SEEDS,
  n=st.integers(2, 40),
  separation=st.sampled_from([0, 20, 200]),
  step=st.sampled_from([1, 10, 50]),
)
def test_binary_curves_match_sklearn(seed, n, separation, step):
  rng = np.random.default_rng(seed)
  target = (rng.random(n) < 0.4).astype(np.int32)
  target[:2] = [0, 1]  # both classes occur
  preds = _grid_scores(rng, n, separation, target, step)
  got = evaluate_randomly(_curves(), {"preds": preds, "target": target}, rng)
  scores = preds.astype(np.float64)
  assert_close(got["auroc"], skm.roc_auc_score(target, scores), rtol=CURVE_RTOL, atol=0.0)
  expected = skm.average_precision_score(target, scores)
  assert_close(got["auprc"], expected, rtol=CURVE_RTOL, atol=0.0)


@given(
  seed=SEEDS,
  n=st.integers(4, 40),
  average=st.sampled_from(["micro", "macro", "weighted", None]),
  task=st.sampled_from(["multilabel", "multiclass"]),
)
def test_multilabel_and_multiclass_curves_match_sklearn(seed, n, average, task):
  """Multiclass is one-vs-rest: sklearn on the one-hot target (every class occurs)."""
  rng = np.random.default_rng(seed)
  if task == "multilabel":
    target = (rng.random((n, C)) < 0.5).astype(np.int32)
    target[:2] = [[0] * C, [1] * C]
    truth = target
    preds = _grid_scores(rng, (n, C), 30, target, step=10)
  else:
    target = rng.integers(0, C, n).astype(np.int32)
    target[:C] = np.arange(C)
    truth = np.eye(C, dtype=np.int32)[target]
    counts = rng.multinomial(GRID, [1 / C] * C, size=n) + 10 * truth
    counts[np.arange(n), np.argmax(counts, -1)] -= counts.sum(-1) - GRID  # rows sum to 1
    preds = (np.clip(counts, 0, GRID) / GRID).astype(np.float32)
  metric = _curves(task=task, num_classes=C, average=average)
  fields = {"preds": preds, "target": target}
  got = evaluate_randomly(metric, fields, rng)
  scores = preds.astype(np.float64)
  auroc = skm.roc_auc_score(truth, scores, average=average)
  auprc = skm.average_precision_score(truth, scores, average=average)
  assert_close(got["auroc"], auroc, rtol=CURVE_RTOL, atol=0.0, what=f"auroc {average}")
  assert_close(got["auprc"], auprc, rtol=CURVE_RTOL, atol=0.0, what=f"auprc {average}")


# --- CalibrationError --------------------------------------------------------------------------


def _calibration(confidence, hit, n_bins, norm):
  """torchmetrics' binned calibration error, bins from float32 ``confidence * n_bins``."""
  bins = np.minimum(np.floor(confidence * np.float32(n_bins)), n_bins - 1).astype(int)
  count = np.bincount(bins, minlength=n_bins).astype(np.float64)
  hits = np.bincount(bins, weights=hit.astype(np.float64), minlength=n_bins)
  conf = np.bincount(bins, weights=confidence.astype(np.float64), minlength=n_bins)
  filled = count > 0
  gap = (hits[filled] - conf[filled]) / count[filled]
  share = count[filled] / np.sum(count)
  if norm == "l1":
    return np.sum(share * np.abs(gap))
  if norm == "l2":
    return np.sqrt(np.sum(share * gap**2))
  return np.max(np.abs(gap))


@given(
  seed=SEEDS,
  n=st.integers(1, 40),
  task=st.sampled_from(["binary", "multiclass"]),
  norm=st.sampled_from(["l1", "l2", "max"]),
)
def test_calibration_error_matches_numpy(seed, n, task, norm):
  rng = np.random.default_rng(seed)
  n_bins = 10
  if task == "binary":
    target = (rng.random(n) < 0.5).astype(np.int32)
    preds = rng.random(n).astype(np.float32)
    confidence, hit = preds, target == 1
  else:
    target = rng.integers(0, C, n).astype(np.int32)
    preds = scipy.special.softmax(2 * rng.standard_normal((n, C)), -1).astype(np.float32)
    confidence, hit = preds.max(-1), preds.argmax(-1) == target
  metric = pe.metrics.CalibrationError(
    n_bins=n_bins, task=task, num_classes=None if task == "binary" else C, norm=norm
  )
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  expected = _calibration(confidence, hit, n_bins, norm)
  assert_close(got, expected, atol=(n_bins + 24) * EPS)


# --- Perplexity --------------------------------------------------------------------------------


def _perplexity_case(rng, n, offset, dtype, ignore):
  """``(logits [n, 3, 7], target [n, 3], ignore_index, float64 perplexity, rtol)``."""
  tokens, vocab = 3, 7
  dtype = np.float32 if dtype == "float32" else getattr(ml_dtypes, dtype, np.float16)
  logits = (offset + 3 * rng.standard_normal((n, tokens, vocab))).astype(dtype)
  target = rng.integers(0, vocab, (n, tokens)).astype(np.int32)
  if ignore:
    target[rng.random((n, tokens)) < 0.3] = -100
    target[0, 0] = 1  # at least one counted token
  z = np.asarray(logits).astype(np.float32).astype(np.float64)
  keep = target != -100
  log_probs = z - scipy.special.logsumexp(z, axis=-1, keepdims=True)
  losses = -np.take_along_axis(log_probs, np.where(keep, target, 0)[..., None], -1)[..., 0]
  mean_loss = np.mean(losses[keep])
  rtol = (vocab + 4 + 16 * tokens) * EPS * (1 + mean_loss)
  return logits, target, -100 if ignore else None, np.exp(mean_loss), rtol


@given(
  seed=SEEDS,
  n=st.integers(1, 24),
  offset=st.sampled_from([0.0, 30.0]),
  dtype=st.sampled_from(["float32", "bfloat16", "float16"]),
  ignore=st.booleans(),
)
def test_perplexity_matches_numpy(seed, n, offset, dtype, ignore):
  rng = np.random.default_rng(seed)
  logits, target, ignore_index, expected, rtol = _perplexity_case(rng, n, offset, dtype, ignore)
  metric = pe.metrics.Perplexity(ignore_index=ignore_index)
  got = evaluate_randomly(metric, {"preds": logits, "target": target}, rng)
  assert_close(got, expected, rtol=rtol, atol=0.0)


@given(seed=SEEDS, n=st.integers(8, 24), offset=st.sampled_from([1e4, 1e6]))
def test_perplexity_is_shift_invariant(seed, n, offset):
  """Softmax ignores a common shift of the logits; so must the perplexity."""
  rng = np.random.default_rng(seed)
  logits, target, _, expected, rtol = _perplexity_case(rng, n, offset, "float32", False)
  got = evaluate_randomly(pe.metrics.Perplexity(), {"preds": logits, "target": target}, rng)
  assert_close(got, expected, rtol=rtol, atol=0.0)


# --- exact mode: any scores, close ones included ------------------------------------------------


@given(
  seed=SEEDS,
  n=st.integers(2, 40),
  spread=st.sampled_from([0.0, 1e-7, 1e-4, 0.3]),
  task=st.sampled_from(["binary", "multilabel"]),
)
def test_exact_curves_match_sklearn_on_close_scores(seed, n, spread, task):
  """Scores a few float32 ulps (or 1e-4) apart around shared centres, and exact ties:
  ``exact=True`` is scikit-learn's value within 1e-6 through any batching, merge tree and
  device count (the binned default merges such scores into one bin)."""
  rng = np.random.default_rng(seed)
  shape = (n,) if task == "binary" else (n, C)
  target = (rng.random(shape) < 0.4).astype(np.int32)
  target[:2] = [[0] * C, [1] * C] if task == "multilabel" else [0, 1]
  centres = rng.choice(np.array([0.1, 0.5, 0.9], np.float32), size=shape)
  preds = (centres + np.float32(spread) * rng.integers(-2, 3, size=shape)).astype(np.float32)
  config = dict(exact=True, capacity=n, task=task, num_classes=None if task == "binary" else C)
  metric = pe.Metrics({"auroc": pe.metrics.AUROC(**config), "auprc": pe.metrics.AUPRC(**config)})
  got = evaluate_randomly(metric, {"preds": preds, "target": target}, rng)
  scores = preds.astype(np.float64)
  assert_close(got["auroc"], skm.roc_auc_score(target, scores), rtol=0.0, atol=1e-6)
  assert_close(got["auprc"], skm.average_precision_score(target, scores), rtol=0.0, atol=1e-6)
