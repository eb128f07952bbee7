"""A weight-0 element changes nothing (DESIGN.md, "Trust"): invalid counts included.

An element of weight 0 holding a bad value (NaN, inf, a target out of range, a value outside a
deviance's domain, probabilities passed as logits) is not seen: the value and
``invalid_counts()`` equal those of the same batch with that element masked out. The same bad
value at a nonzero weight is still counted (each test checks that it is, so it tests something).
"""

import jax
import numpy as np
import pytest

import padded_eval as pe

B = 8


def _value(metric) -> np.ndarray:
  return np.asarray(jax.device_get(metric.compute()), np.float64)


def _assert_unseen_at_weight_zero(make, batch, bad_row):
  """Row 0 of ``batch`` gets ``bad_row``'s values: counted at weight 1, unseen at weight 0."""
  bad = {key: np.array(value, copy=True) for key, value in batch.items()}
  for key, value in bad_row.items():
    bad[key][0] = value
  weights = np.array(bad.pop("weights"), np.float32, copy=True)
  weights[0] = 1.0
  seen = make().update(**bad, weights=weights, mask=np.ones(B, bool))
  assert sum(seen.invalid_counts().values()) > 0, "the bad row is not invalid at weight 1"
  weights[0] = 0.0
  got = make().update(**bad, weights=weights, mask=np.ones(B, bool))
  want = make().update(**bad, weights=weights, mask=np.arange(B) != 0)
  assert got.invalid_counts() == want.invalid_counts()
  np.testing.assert_array_equal(_value(got), _value(want))


def _positive_pair(rng, *tail):
  shape = (B,) + tail
  return {
    "preds": rng.uniform(0.5, 2.0, shape).astype(np.float32),
    "target": rng.uniform(0.5, 2.0, shape).astype(np.float32),
    "weights": rng.uniform(0.5, 2.0, B).astype(np.float32),
  }


# --- deviances: MSLE, TweedieDevianceScore, D2TweedieScore ("outside the domain") ----------

_DOMAIN = [
  ("msle", lambda: pe.metrics.MSLE(), {"preds": -2.0}),
  ("msle", lambda: pe.metrics.MSLE(), {"target": np.nan}),
  ("tweedie_0", lambda: pe.metrics.TweedieDevianceScore(power=0), {"preds": np.nan}),
  ("tweedie_1", lambda: pe.metrics.TweedieDevianceScore(power=1), {"preds": -1.0}),
  ("tweedie_1.5", lambda: pe.metrics.TweedieDevianceScore(power=1.5), {"target": -3.0}),
  ("tweedie_2", lambda: pe.metrics.TweedieDevianceScore(power=2), {"target": 0.0}),
  ("tweedie_-1", lambda: pe.metrics.TweedieDevianceScore(power=-1.0), {"preds": 0.0}),
  ("d2_tweedie_0", lambda: pe.metrics.D2TweedieScore(power=0), {"target": np.nan}),
  ("d2_tweedie_1.5", lambda: pe.metrics.D2TweedieScore(power=1.5), {"preds": -np.inf}),
  ("d2_tweedie_2", lambda: pe.metrics.D2TweedieScore(power=2), {"target": 0.0}),
  ("d2_tweedie_3", lambda: pe.metrics.D2TweedieScore(power=3), {"preds": -1.0}),
]


@pytest.mark.parametrize(("name", "make", "bad_row"), _DOMAIN, ids=[c[0] for c in _DOMAIN])
def test_deviance_domain_at_weight_zero(name, make, bad_row):
  """Before: counted ("value <= -1", "outside the domain of power"), so masked_eval raised."""
  _assert_unseen_at_weight_zero(make, _positive_pair(np.random.default_rng(0)), bad_row)


# --- row reductions: CosineSimilarity, KLDivergence (a NaN row) ---------------------------

_ROWS = [
  ("cosine_zero", lambda: pe.metrics.CosineSimilarity(), {"preds": 0.0}),
  ("cosine_nan_sum", lambda: pe.metrics.CosineSimilarity(reduction="sum"), {"target": np.nan}),
  ("kl_negative", lambda: pe.metrics.KLDivergence(), {"preds": -1.0}),
  ("kl_log_prob_nan", lambda: pe.metrics.KLDivergence(log_prob=True), {"target": np.nan}),
]


@pytest.mark.parametrize(("name", "make", "bad_row"), _ROWS, ids=[c[0] for c in _ROWS])
def test_row_reduction_at_weight_zero(name, make, bad_row):
  """Before: counted ("zero vector or nan", "not a distribution"), so masked_eval raised."""
  _assert_unseen_at_weight_zero(make, _positive_pair(np.random.default_rng(1), 5), bad_row)


# --- Perplexity: every kind, not only "nan value" -----------------------------------------


def _tokens(rng):
  return {
    "preds": rng.standard_normal((B, 3, 5)).astype(np.float32),
    "target": rng.integers(0, 5, (B, 3)).astype(np.int32),
    "weights": rng.uniform(0.5, 2.0, B).astype(np.float32),
  }


_PERPLEXITY = [
  ("target_out_of_range", {"target": 7}),
  ("negative_target", {"target": -1}),
  ("probabilities", {"preds": 0.2}),
  ("nan_logit", {"preds": np.nan}),
]


@pytest.mark.parametrize(("name", "bad_row"), _PERPLEXITY, ids=[c[0] for c in _PERPLEXITY])
def test_perplexity_at_weight_zero(name, bad_row):
  """Before: "target out of range" and "preds look like probabilities, not logits" were counted
  whatever the weight (only "nan value" left weight 0 out)."""
  _assert_unseen_at_weight_zero(pe.metrics.Perplexity, _tokens(np.random.default_rng(2)), bad_row)


# --- ranking: a query of weight 0 --------------------------------------------------------


def _queries(rng):
  return {
    "preds": rng.standard_normal((B, 6)).astype(np.float32),
    "target": rng.integers(0, 4, (B, 6)).astype(np.float32),
    "weights": rng.uniform(0.5, 2.0, B).astype(np.float32),
  }


_RANKING = [
  ("recall_nan_score", lambda: pe.metrics.RecallAtK(k=3), {"preds": np.nan}),
  ("precision_negative", lambda: pe.metrics.PrecisionAtK(k=2), {"target": -1.0}),
  ("mrr_nan_relevance", lambda: pe.metrics.MRR(), {"target": np.nan}),
  ("map_nan_score", lambda: pe.metrics.MAPAtK(k=4), {"preds": np.nan}),
  ("ndcg_negative", lambda: pe.metrics.NDCGAtK(k=3), {"target": -2.0}),
]


@pytest.mark.parametrize(("name", "make", "bad_row"), _RANKING, ids=[c[0] for c in _RANKING])
def test_ranking_at_weight_zero(name, make, bad_row):
  """Before: "negative relevance", "nan relevance", "nan score" were counted at weight 0."""
  _assert_unseen_at_weight_zero(make, _queries(np.random.default_rng(3)), bad_row)


def test_ndcg_query_of_weight_zero_with_a_nan_score():
  """A query of weight 0 whose score is NaN (an infinite relevance: inf / inf) is not seen;
  before, ``0 * NaN`` made the mean NaN."""
  batch = _queries(np.random.default_rng(4))
  batch["target"][0, 0] = np.inf
  batch["weights"][0] = 0.0
  mask = np.ones(B, bool)
  got = pe.metrics.NDCGAtK(k=3).update(**batch, mask=mask)
  want = pe.metrics.NDCGAtK(k=3).update(**batch, mask=np.arange(B) != 0)
  assert np.isfinite(_value(want))
  np.testing.assert_array_equal(_value(got), _value(want))


# --- classification: the one input formatter's kinds ---------------------------------------

M = pe.metrics


def _binary(rng, logits=False):
  scores = rng.standard_normal(B) if logits else rng.uniform(0.0, 1.0, B)
  return {
    "preds": scores.astype(np.float32),
    "target": rng.integers(0, 2, B).astype(np.int32),
    "weights": rng.uniform(0.5, 2.0, B).astype(np.float32),
  }


def _multiclass(rng, classes=4, probabilities=False):
  scores = rng.standard_normal((B, classes))
  if probabilities:
    scores = np.exp(scores) / np.sum(np.exp(scores), -1, keepdims=True)
  return {
    "preds": scores.astype(np.float32),
    "target": rng.integers(0, classes, B).astype(np.int32),
    "weights": rng.uniform(0.5, 2.0, B).astype(np.float32),
  }


def _multilabel(rng, labels=3):
  return {
    "preds": rng.uniform(0.0, 1.0, (B, labels)).astype(np.float32),
    "target": rng.integers(0, 2, (B, labels)).astype(np.int32),
    "weights": rng.uniform(0.5, 2.0, B).astype(np.float32),
  }


_CLASSIFICATION = [
  ("accuracy_binary_probability", lambda: M.Accuracy(task="binary"), _binary, {"preds": 1.5}),
  ("accuracy_binary_target", lambda: M.Accuracy(task="binary"), _binary, {"target": 2}),
  ("accuracy_top2_nan", lambda: M.Accuracy(top_k=2, num_classes=4), _multiclass, {"preds": np.nan}),
  ("accuracy_target", lambda: M.Accuracy(num_classes=4), _multiclass, {"target": 9}),
  (
    "accuracy_macro_target",
    lambda: M.Accuracy(num_classes=4, average="macro"),
    _multiclass,
    {"target": -1},
  ),
  (
    "accuracy_multilabel",
    lambda: M.Accuracy(task="multilabel", num_classes=3),
    _multilabel,
    {"preds": -0.5},
  ),
  (
    "f1_weighted_nan",
    lambda: M.F1Score(num_classes=4, average="weighted", weighted=True),
    _multiclass,
    {"preds": np.nan},
  ),
  (
    "precision_binary_weighted",
    lambda: M.Precision(task="binary", weighted=True),
    _binary,
    {"preds": 3.0},
  ),
  (
    "confusion_weighted_target",
    lambda: M.ConfusionMatrix(num_classes=4, weighted=True),
    _multiclass,
    {"target": 4},
  ),
  ("brier_target", lambda: M.BrierScore(num_classes=4), _multiclass, {"target": 5}),
  ("brier_binary_nan", lambda: M.BrierScore(task="binary"), _binary, {"preds": np.nan}),
  (
    "hinge_nan",
    lambda: M.HingeLoss(task="multiclass", num_classes=4),
    _multiclass,
    {"preds": np.nan},
  ),
  (
    "auroc_weighted_probability",
    lambda: M.AUROC(101, task="binary", weighted=True),
    _binary,
    {"preds": -1.0},
  ),
  (
    "auprc_multilabel_weighted_target",
    lambda: M.AUPRC(11, task="multilabel", num_classes=3, weighted=True),
    _multilabel,
    {"target": 2},
  ),
]


@pytest.mark.parametrize(
  ("name", "make", "data", "bad_row"), _CLASSIFICATION, ids=[c[0] for c in _CLASSIFICATION]
)
def test_classification_at_weight_zero(name, make, data, bad_row):
  """Before: every kind of the input formatter ("target out of range", "nan score",
  "probability outside [0, 1]", ...) was counted whatever the weight."""
  _assert_unseen_at_weight_zero(make, data(np.random.default_rng(5)), bad_row)


def test_probabilities_as_logits_at_weight_zero():
  """``from_logits=True``: a weight-0 row neither counts as probabilities passed as logits nor,
  holding a logit outside [0, 1], clears that report (it is evidence of nothing)."""
  rng = np.random.default_rng(6)
  batch = _multiclass(rng, probabilities=True)
  _assert_unseen_at_weight_zero(
    lambda: M.BrierScore(num_classes=4, from_logits=True), batch, {"target": 7}
  )
  batch = _binary(rng)  # every score in [0, 1]: reported as probabilities passed as logits
  weights = batch.pop("weights")
  weights[0] = 0.0
  batch["preds"][0] = 5.0  # a logit, of weight 0: no evidence that the others are logits
  metric = M.AUROC(101, task="binary", from_logits=True, weighted=True)
  got = metric.update(**batch, weights=weights, mask=np.ones(B, bool))
  want = metric.update(**batch, weights=weights, mask=np.arange(B) != 0)
  assert got.invalid_counts() == want.invalid_counts()
  assert got.invalid_counts()["preds look like probabilities, not logits"] == B - 1


# --- R2Score's count of observations -------------------------------------------------------


@pytest.mark.parametrize("adjusted", [0, 1])
@pytest.mark.parametrize("kept", [1, 3])
def test_r2_observations_of_weight_zero_are_not_counted(kept, adjusted):
  """Its fewer-than-two rule counts the observations of nonzero weight: with one such row the score is NaN, as with the others masked out (scikit-learn, which counts
  every sample given, scores weights [1, 0, ...] 0.0 or 1.0 there); with three, scikit-learn's
  score of those rows (``adjusted``'s ``n``, the total weight, as documented). Before, the
  weight-0 rows counted."""
  from sklearn.metrics import r2_score

  rng = np.random.default_rng(31 + kept)
  preds = rng.normal(size=B).astype(np.float32)
  target = rng.normal(size=B).astype(np.float32)
  weights = np.zeros(B, np.float32)
  weights[:kept] = rng.uniform(0.5, 2.0, kept)
  make = lambda: pe.metrics.R2Score(adjusted=adjusted)
  got = make().update(preds=preds, target=target, weights=weights)
  want = make().update(preds=preds, target=target, weights=weights, mask=weights != 0)
  np.testing.assert_array_equal(_value(got), _value(want))
  if kept == 1:
    assert np.isnan(_value(got))
  else:
    p, t, w = (x[:kept].astype(np.float64) for x in (preds, target, weights))
    r2 = r2_score(t, p, sample_weight=w)
    if adjusted:  # n is the total weight (documented)
      n = np.sum(w)
      r2 = 1 - (1 - r2) * (n - 1) / (n - adjusted - 1)
    np.testing.assert_allclose(_value(got), r2, rtol=1e-5)
