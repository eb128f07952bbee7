"""Regressions of issue 12 (classification) and the shared formatter of issue 13.

Each test failed on the code before the fix. References are scikit-learn or numpy in
float64 on the real rows only; padded rows hold NaN, inf and ints far outside any range
(they must change no result and no invalid count).
"""

from __future__ import annotations

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sklearn.metrics as skm
from metric_checks import with_garbage_rows

import padded_eval as pe
from padded_eval.metrics.classification._formatting import LOGIT_EVIDENCE

M = pe.metrics
C = 4
PAD = 5
_FLOAT_GARBAGE = np.array([np.nan, np.inf, -np.inf, 7.0, -3.0, 0.5], np.float32)


def _padded(rng, **arrays):
  """``arrays`` plus ``PAD`` garbage rows each, and the ``[n + PAD]`` row mask."""
  return with_garbage_rows(rng, arrays, PAD, _FLOAT_GARBAGE, 2**30)


_jit_update = jax.jit(lambda m, b: m.update(**b))  # one program per metric, options and shapes
_jit_compute = jax.jit(lambda m: m.compute())


def _update(metric, batch, jit):
  if jit:
    return _jit_update(metric, batch)
  return metric.update(**batch)


def _compute(metric, jit=True):
  return np.asarray(_jit_compute(metric) if jit else metric.compute())


# --- 1. Matthews correlation without cancellation ------------------------------------------


@pytest.mark.parametrize("n", [41, 47, 55, 61, 82])
@pytest.mark.parametrize("task", ["binary", "multiclass", "multilabel"])
def test_mcc_of_constant_inputs_is_zero_under_jit(n, task):
  """Issue 12: all-zero preds and target gave 0.5 under jit (1 - dot(share, share))."""
  rng = np.random.default_rng(n)
  shape = (n, C) if task == "multilabel" else (n,)
  zeros = np.zeros(shape, np.int32)
  batch = _padded(rng, preds=zeros, target=zeros)
  metric = M.MatthewsCorrCoef(task=task, num_classes=None if task == "binary" else C)
  value = _compute(_update(metric, batch, jit=True))
  assert value == skm.matthews_corrcoef(zeros.reshape(-1), zeros.reshape(-1)) == 0.0


def _doubled(metric, batch, times):
  """``metric`` updated with ``batch`` repeated ``2**times`` times (exact merges)."""
  metric = metric.update(**batch)
  for _ in range(times):
    metric = metric.merge(metric)
  return metric


@pytest.mark.parametrize("task", ["binary", "multiclass"])
def test_mcc_and_kappa_on_1e7_rows_with_20_positives(task):
  """Issue 12: 5e-4 off scikit-learn (here 4e-3) on 1e7 rows with 20 positives."""
  rng = np.random.default_rng(0)
  negatives = _padded(rng, preds=np.zeros(10, np.int32), target=np.zeros(10, np.int32))
  preds = np.array([1] * 15 + [0] * 5 + [1] * 7, np.int32)
  target = np.array([1] * 20 + [0] * 7, np.int32)
  rare = _padded(rng, preds=preds, target=target)
  y_true = np.concatenate([np.zeros(10 << 20, np.int32), target])
  y_pred = np.concatenate([np.zeros(10 << 20, np.int32), preds])
  config = {"task": task, "num_classes": None if task == "binary" else 3}
  mcc = _doubled(M.MatthewsCorrCoef(**config), negatives, 20).update(**rare)
  kappa = _doubled(M.CohenKappa(**config), negatives, 20).update(**rare)
  want_mcc = skm.matthews_corrcoef(y_true, y_pred)
  want_kappa = skm.cohen_kappa_score(y_true, y_pred)
  np.testing.assert_allclose(_compute(mcc), want_mcc, rtol=1e-6)
  np.testing.assert_allclose(_compute(kappa), want_kappa, rtol=1e-6)


def test_mcc_counts_past_2_to_31_match_sklearn():
  """Multiclass tables doubled to counts > 2**31: the ratio of the small table."""
  rng = np.random.default_rng(1)
  target = rng.integers(0, C, 60).astype(np.int32)
  preds = np.where(rng.random(60) < 0.6, target, rng.integers(0, C, 60)).astype(np.int32)
  batch = _padded(rng, preds=preds, target=target)
  metric = _doubled(M.MatthewsCorrCoef(num_classes=C), batch, 30)
  assert metric.confusion.to_numpy().sum() == 60 << 30
  np.testing.assert_allclose(_compute(metric), skm.matthews_corrcoef(target, preds), rtol=2e-6)


# --- 2. multilabel macro averages every label ----------------------------------------------

_ML_TARGET = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 0]], np.int32)
_ML_PREDS = np.array([[0.9, 0.2, 0.1], [0.3, 0.8, 0.0], [0.7, 0.4, 0.2]], np.float32)
_SKLEARN_SCORES = {
  M.Precision: skm.precision_score,
  M.Recall: skm.recall_score,
  M.F1Score: skm.f1_score,
  functools.partial(M.FBetaScore, 2.0): functools.partial(skm.fbeta_score, beta=2.0),
  M.JaccardIndex: skm.jaccard_score,
}


def _specificity(y_true, y_pred, average):
  """numpy: per label tn / (tn + fp); macro over every label, weighted by support."""
  tn = np.sum((y_true == 0) & (y_pred == 0), 0).astype(np.float64)
  fp = np.sum((y_true == 0) & (y_pred == 1), 0)
  per_label = np.where(tn + fp > 0, tn / np.maximum(tn + fp, 1), 0.0)
  if average == "macro":
    return per_label.mean()
  support = np.sum(y_true == 1, 0)
  return np.sum(support * per_label) / support.sum()


@pytest.mark.parametrize("average", ["macro", "weighted"])
def test_multilabel_macro_averages_every_label(average):
  """Issue 12: label 2 is absent from target and preds; F1 macro 0.833 vs sklearn 0.556."""
  batch = _padded(np.random.default_rng(2), preds=_ML_PREDS, target=_ML_TARGET)
  guess = (_ML_PREDS > 0.5).astype(np.int32)
  metrics = {**_SKLEARN_SCORES, M.Specificity: None}
  for make, score in metrics.items():
    metric = make(task="multilabel", num_classes=3, average=average).update(**batch)
    if score is None:
      want = _specificity(_ML_TARGET, guess, average)
    else:
      want = score(_ML_TARGET, guess, average=average, zero_division=0)
    np.testing.assert_allclose(_compute(metric), want, rtol=1e-6, err_msg=str(make))


# --- 3. Specificity with top_k > 1 ----------------------------------------------------------


@pytest.mark.parametrize("top_k", [2, 3])
@pytest.mark.parametrize("average", ["micro", "macro", "weighted", None])
def test_specificity_top_k_counts_tn_once_per_element(top_k, average):
  """Issue 12: tn was N * k - tp - fp - fn; it is N - tp - fp - fn (torchmetrics' rule)."""
  rng = np.random.default_rng(top_k)
  scores = rng.standard_normal((40, C)).astype(np.float32)
  target = rng.integers(0, C, 40).astype(np.int32)
  top = np.argsort(-scores, axis=-1, kind="stable")[:, :top_k]
  predicted = np.zeros((40, C), bool)
  np.put_along_axis(predicted, top, True, axis=-1)
  truth = np.eye(C, dtype=bool)[target]
  tp, fp = np.sum(predicted & truth, 0), np.sum(predicted & ~truth, 0)
  fn, tn = np.sum(~predicted & truth, 0), np.sum(~predicted & ~truth, 0)
  per_class = tn / (tn + fp)
  want = {
    "micro": tn.sum() / (tn + fp).sum(),
    "macro": per_class[tp + fp + fn > 0].mean(),
    "weighted": np.sum((tp + fn) * per_class) / np.sum(tp + fn),
    None: per_class,
  }[average]
  batch = _padded(rng, preds=scores, target=target)
  metric = M.Specificity(num_classes=C, top_k=top_k, average=average).update(**batch)
  np.testing.assert_allclose(_compute(metric), want, rtol=1e-6)


# --- 4. NaN scores rank worst ---------------------------------------------------------------


def _nan_scores(rng, n=48):
  scores = rng.standard_normal((n, C)).astype(np.float32)
  scores[rng.random((n, C)) < 0.3] = np.nan
  scores[:3] = np.nan  # rows with no number: no class is predicted
  return scores, rng.integers(0, C, n).astype(np.int32)


def _ranked(scores, k):
  """numpy: the k best ids, NaN worst; a pick that falls on NaN is C (no class)."""
  order = np.argsort(-np.where(np.isnan(scores), -np.inf, scores), axis=-1, kind="stable")[:, :k]
  return np.where(np.isnan(np.take_along_axis(scores, order, -1)), C, order)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_nan_scores_rank_worst_and_are_counted(jit):
  """Issue 12: argmax / top_k ranked NaN best, contrary to the docstring."""
  rng = np.random.default_rng(4)
  scores, target = _nan_scores(rng)
  batch = _padded(rng, preds=scores, target=target)
  nan_rows = int(np.isnan(scores).any(-1).sum())
  top1, top2 = _ranked(scores, 1)[:, 0], _ranked(scores, 2)
  labels = list(range(C))
  cases = [
    (M.Accuracy(), skm.accuracy_score(target, top1)),
    (M.Accuracy(top_k=2), np.mean(np.any(top2 == target[:, None], -1))),
    (
      M.Recall(num_classes=C, average="macro"),
      skm.recall_score(target, top1, labels=labels, average="macro", zero_division=0),
    ),
    (
      M.Precision(num_classes=C, average=None),
      skm.precision_score(target, top1, labels=labels, average=None, zero_division=0),
    ),
    (
      M.Recall(num_classes=C, average="micro", top_k=2),
      np.mean(np.any(top2 == target[:, None], -1)),
    ),
    (M.ConfusionMatrix(C), skm.confusion_matrix(target, top1, labels=labels)),
    (M.MatthewsCorrCoef(num_classes=C), skm.matthews_corrcoef(target, top1)),
  ]
  for metric, want in cases:
    updated = _update(metric, batch, jit)
    np.testing.assert_allclose(_compute(updated), want, rtol=1e-6, err_msg=repr(metric))
    assert updated.invalid_counts()["nan score"] == nan_rows


# --- 5. invalid values are counted (never silently dropped) ---------------------------------


def _binary_case(rng):
  target = rng.choice(np.array([0, 1, 2, -1], np.int32), 40)
  preds = rng.random(40).astype(np.float32)
  preds[rng.random(40) < 0.15] = np.nan
  preds[rng.random(40) < 0.15] = 2.5  # a logit passed as a probability
  expected = {
    "target out of range": np.sum((target != 0) & (target != 1)),
    "nan score": np.sum(np.isnan(preds)),
    "probability outside [0, 1]": np.sum(preds > 1),
  }
  return {"preds": preds, "target": target}, expected


def _multilabel_case(rng):
  target = rng.choice(np.array([0, 1, 5], np.int32), (20, C))
  preds = rng.uniform(-0.5, 1.5, (20, C)).astype(np.float32)
  preds[rng.random((20, C)) < 0.1] = np.nan
  expected = {
    "target out of range": np.sum(target == 5),
    "nan score": np.sum(np.isnan(preds)),
    "probability outside [0, 1]": np.sum((preds < 0) | (preds > 1)),
  }
  return {"preds": preds, "target": target}, expected


def _class_id_case(rng):
  target = rng.integers(-1, C + 2, 40).astype(np.int32)
  preds = rng.integers(-2, C + 1, 40).astype(np.int32)
  expected = {
    "target out of range": np.sum((target < 0) | (target >= C)),
    "pred id out of range": np.sum((preds < 0) | (preds >= C)),
  }
  return {"preds": preds, "target": target}, expected


def _class_score_case(rng):
  target = rng.integers(0, C + 1, 40).astype(np.int32)
  preds = rng.uniform(-0.2, 1.2, (40, C)).astype(np.float32)
  preds[rng.random((40, C)) < 0.1] = np.nan
  expected = {
    "target out of range": np.sum(target >= C),
    "nan score": np.sum(np.isnan(preds).any(-1)),
    "probability outside [0, 1]": np.sum(((preds < 0) | (preds > 1)).any(-1)),
  }
  return {"preds": preds, "target": target}, expected


INVALID_CASES = [
  ("precision_binary", lambda: M.Precision(task="binary"), _binary_case),
  ("auroc_binary", lambda: M.AUROC(11), _binary_case),
  ("ece_binary", lambda: M.CalibrationError(5), _binary_case),
  ("f1_multilabel", lambda: M.F1Score(task="multilabel", num_classes=C), _multilabel_case),
  ("auprc_multilabel", lambda: M.AUPRC(11, task="multilabel", num_classes=C), _multilabel_case),
  ("recall_ids", lambda: M.Recall(num_classes=C), _class_id_case),
  ("confmat_ids", lambda: M.ConfusionMatrix(C), _class_id_case),
  ("accuracy_ids", lambda: M.Accuracy(), _class_id_case),
  ("auroc_multiclass", lambda: M.AUROC(11, task="multiclass", num_classes=C), _class_score_case),
  (
    "ece_multiclass",
    lambda: M.CalibrationError(5, task="multiclass", num_classes=C),
    _class_score_case,
  ),
]


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name,make,case", INVALID_CASES, ids=[c[0] for c in INVALID_CASES])
def test_invalid_counts_match_numpy(name, make, case, jit):
  rng = np.random.default_rng(len(name))
  fields, expected = case(rng)
  if name == "accuracy_ids":  # no num_classes: only negative ids are out of range
    expected = {
      "target out of range": np.sum(fields["target"] < 0),
      "pred id out of range": np.sum(fields["preds"] < 0),
    }
  half = len(fields["target"]) // 2
  first = _padded(rng, **{k: v[:half] for k, v in fields.items()})
  second = _padded(rng, **{k: v[half:] for k, v in fields.items()})
  metric = _update(_update(make(), first, jit), second, jit)
  counts = metric.invalid_counts()
  # every declared kind but the logits' evidence, which is counted and never reported
  want = {kind: 0 for kind in metric.invalid_kinds if kind != LOGIT_EVIDENCE}
  want.update({kind: int(n) for kind, n in expected.items()})
  assert counts == want
  # curves name probabilities outside [0, 1] as the logits they usually are (issue 26)
  curves = isinstance(metric, (M.AUROC, M.AUPRC))
  hint = {
    "probability outside [0, 1]": "probability outside [0, 1] (logits? pass from_logits=True)"
  }
  reported = lambda kind: hint.get(kind, kind) if curves else kind
  assert sorted(metric.invalid_report()) == sorted(
    (metric.name, reported(kind), n) for kind, n in want.items() if n
  )


def test_out_of_range_pred_ids_are_wrong_predictions():
  """Issue 12: a class id outside [0, C) dropped the element: recall 1.0, sklearn 0.5."""
  recall = M.Recall(num_classes=2, average="macro").update(
    preds=jnp.array([0, 5]), target=jnp.array([0, 1])
  )
  assert (
    float(recall.compute())
    == skm.recall_score([0, 1], [0, 5], labels=[0, 1], average="macro")
    == 0.5
  )
  rng = np.random.default_rng(5)
  target = rng.integers(0, C, 50).astype(np.int32)
  preds = np.where(rng.random(50) < 0.2, rng.choice([-1, C, 99], 50), target).astype(np.int32)
  preds = np.where(rng.random(50) < 0.3, rng.integers(0, C, 50), preds).astype(np.int32)
  batch = _padded(rng, preds=preds, target=target)
  labels = list(range(C))
  other = np.where((preds >= 0) & (preds < C), preds, C)  # one "no class" label
  for cls, score in ((M.Precision, skm.precision_score), (M.Recall, skm.recall_score)):
    for average in ("micro", "macro", None):
      metric = cls(num_classes=C, average=average).update(**batch)
      want = score(target, preds, labels=labels, average=average, zero_division=0)
      np.testing.assert_allclose(_compute(metric), want, rtol=1e-6)
  mcc = M.MatthewsCorrCoef(num_classes=C).update(**batch)
  np.testing.assert_allclose(_compute(mcc), skm.matthews_corrcoef(target, other), rtol=1e-6)
  for weights in (None, "linear", "quadratic"):
    kappa = M.CohenKappa(num_classes=C, weights=weights).update(**batch)
    want = skm.cohen_kappa_score(target, other, labels=list(range(C + 1)), weights=weights)
    np.testing.assert_allclose(_compute(kappa), want, rtol=1e-5)
  confmat = M.ConfusionMatrix(C).update(**batch)
  np.testing.assert_array_equal(
    confmat.counts(), skm.confusion_matrix(target, preds, labels=labels)
  )


# --- 6. eager refusals --------------------------------------------------------------------

FLOAT_TARGETS = [
  (lambda: M.Accuracy(), {"preds": np.eye(3, dtype=np.float32), "target": np.array([0, 1.5, 2])}),
  (
    lambda: M.Precision(task="binary"),
    {"preds": np.array([0.2, 0.9]), "target": np.array([0.0, 0.7])},
  ),
  (lambda: M.F1Score(num_classes=3), {"preds": np.array([0, 1]), "target": np.array([0.0, 1.0])}),
  (lambda: M.ConfusionMatrix(3), {"preds": np.array([0, 1]), "target": np.array([0.0, 1.0])}),
  (
    lambda: M.MatthewsCorrCoef(task="multilabel", num_classes=2),
    {"preds": np.ones((2, 2), np.float32), "target": np.ones((2, 2), np.float32)},
  ),
  (lambda: M.AUROC(11), {"preds": np.array([0.2, 0.9]), "target": np.array([0.0, 1.0])}),
  (lambda: M.AUPRC(11), {"preds": np.array([0.2, 0.9]), "target": np.array([1.0, 2.0])}),
  (
    lambda: M.CalibrationError(task="multiclass", num_classes=2),
    {"preds": np.eye(2, dtype=np.float32), "target": np.array([0.0, 1.0])},
  ),
]


@pytest.mark.parametrize("make,batch", FLOAT_TARGETS)
def test_float_targets_are_refused(make, batch):
  with pytest.raises(ValueError, match="target"):
    make().update(**batch)
  with pytest.raises(ValueError, match="target"):  # the dtype is known inside jit too
    jax.jit(lambda m, b: m.update(**b))(make(), batch)


def test_accuracy_refuses_float_preds_shaped_like_the_target():
  with pytest.raises(ValueError, match="preds"):
    M.Accuracy().update(preds=np.array([0.2, 0.9], np.float32), target=np.array([0, 1]))


@pytest.mark.parametrize("from_logits", [False, True])
@pytest.mark.parametrize("trailing_one", [False, True], ids=["B", "B1"])
def test_binary_accuracy_matches_sklearn(from_logits, trailing_one):
  rng = np.random.default_rng(6)
  target = rng.integers(0, 2, 30).astype(np.int32)
  logits = rng.normal(0.0, 2.0, 30).astype(np.float32)
  preds = (
    logits if from_logits else (1 / (1 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
  )
  guess = (logits > np.log(0.3 / 0.7)).astype(np.int32)  # probability > 0.3
  batch = _padded(rng, preds=preds[:, None] if trailing_one else preds, target=target)
  metric = M.Accuracy(task="binary", threshold=0.3, from_logits=from_logits).update(**batch)
  np.testing.assert_allclose(_compute(metric), skm.accuracy_score(target, guess), rtol=1e-6)
  assert sum(metric.invalid_counts().values()) == 0


BOOL_INTS = [
  (lambda: M.Accuracy(top_k=True), "top_k"),
  (lambda: M.Precision(num_classes=3, top_k=True), "top_k"),
  (lambda: M.F1Score(task="multilabel", num_classes=True), "num_classes"),
  (lambda: M.AUROC(num_thresholds=True), "num_thresholds"),
  (lambda: M.CalibrationError(n_bins=True), "n_bins"),
  (lambda: M.Accuracy(task="multilabel"), "task"),
  (lambda: M.Accuracy(task="binary", threshold=2.0), "threshold"),
  (lambda: M.FBetaScore(float("nan"), num_classes=3), "beta"),  # inf is recall (sklearn)
]


@pytest.mark.parametrize("make,argname", BOOL_INTS, ids=[a for _, a in BOOL_INTS])
def test_config_checks_go_through_validation(make, argname):
  """Issue 13: Accuracy(top_k=True) was accepted while Precision(top_k=True) was not."""
  with pytest.raises(ValueError, match=argname):
    make()


# --- 7. one formatter (issue 13) ------------------------------------------------------------


def test_inputs_are_parsed_once_for_every_classification_metric():
  """The formatter is the only parser: no _config or private input parser is left."""
  root = pathlib.Path(pe.__file__).parent / "metrics"
  for name in (
    "classification/confusion",
    "classification/scores",
    "classification/stat_scores",
    "curves/histogram",
    "curves/auc",
    "classification/calibration",
    "classification/accuracy",
    "classification/_inputs",
  ):
    source = (root / f"{name}.py").read_text()
    for private_parser in ("def _config", "def score_inputs", "def _elements", "def _in_top_k"):
      assert private_parser not in source, (name, private_parser)
  for cls in (M.Precision, M.ConfusionMatrix, M.AUROC, M.AUPRC, M.CalibrationError):
    assert issubclass(cls, pe.metrics.classification._inputs.ClassificationMetric)


def test_valid_inputs_with_garbage_padding_count_nothing_invalid():
  rng = np.random.default_rng(7)
  binary = _padded(rng, preds=rng.random(20).astype(np.float32), target=rng.integers(0, 2, 20))
  for make in (lambda: M.AUROC(11), lambda: M.Precision(task="binary"), M.CalibrationError):
    metric = make().update(**binary)
    reported = [kind for kind in metric.invalid_kinds if kind != LOGIT_EVIDENCE]
    assert metric.invalid_counts() == {kind: 0 for kind in reported}


@pytest.mark.parametrize("k", [1, 2, 3])
def test_top_k_reads_minus_zero_as_zero_and_nan_below_minus_inf(k):
  """The documented rules: ties go to the lower class, and a NaN score is never preferred to a
  number. Before, ``lax.top_k`` ranked +0.0 above -0.0 (top_k=1, an argmax, read them as a tie),
  and NaN, ranked as -inf, tied with a real -inf and could take its place. Reference: a stable
  numpy ranking of the float64 scores, -0.0 equal to 0.0, NaN after -inf."""
  rng = np.random.default_rng(k)
  values = np.array([-0.0, 0.0, -np.inf, np.nan, 1.0, -1.0], np.float32)
  scores = rng.choice(values, size=(400, 4)).astype(np.float32)
  target = rng.integers(0, 4, 400)
  order = np.array(  # -0.0 == 0.0 in float64 comparisons; NaN last; ties by class id
    [
      sorted(range(4), key=lambda j, r=r: (np.isnan(r[j]), 0.0 if np.isnan(r[j]) else -r[j], j))
      for r in scores.astype(np.float64)
    ]
  )
  top = order[:, :k]
  top_is_number = ~np.isnan(np.take_along_axis(scores, top, axis=-1))
  hit = np.any((top == target[:, None]) & top_is_number, axis=-1)
  got = pe.metrics.Accuracy(top_k=k, num_classes=4).update(preds=scores, target=target)
  np.testing.assert_allclose(float(got.compute()), hit.mean(), rtol=1e-6)
