"""Confusion-count metrics against scikit-learn on padded batches full of garbage.

Every row of ``CASES`` is checked eagerly (and with fresh garbage in the padding); one
row per metric family also runs every generic check of ``tests/metric_checks.py``
(jit traced once, ``lax.scan``, pmap + reduce, all_gather, shard_map, empty state).
References see only the real elements (``metric_cases.real``) and drop the ignored ones
themselves, then ask scikit-learn; padded rows hold NaN, inf and ints far outside
``[0, C)``.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import pytest
import sklearn.metrics as skm
from _metrics_shared import CHECKS
from metric_cases import MetricCase, padded_batches, real
from metric_checks import check_eager

import padded_eval as pe

M = pe.metrics
C = 5  # classes / labels
IGNORE = -1  # an ignore_index outside [0, C)


# --- data --------------------------------------------------------------------------------


def _with_ignored(labels, rng, value):
  return np.where(rng.random(labels.shape) < 0.15, value, labels).astype(np.int32)


def _data(task, *, ids=False, ignore=None, classes=C, spatial=None):
  """Padded batches for ``task``; ``ignore`` marks ~15% of real targets with it."""
  tail = () if spatial is None else spatial

  def fields(rng, b):
    if task == "binary":
      preds = rng.random((b,) + tail).astype(np.float32)
      target = rng.integers(0, 2, (b,) + tail)
    elif task == "multilabel":
      preds = rng.random((b,) + tail + (C,)).astype(np.float32)
      target = (rng.random((b,) + tail + (C,)) < 0.4).astype(np.int32)
    elif ids:
      preds = rng.integers(0, classes, (b,) + tail).astype(np.int32)
      target = rng.integers(0, classes, (b,) + tail)
    else:
      preds = rng.standard_normal((b,) + tail + (C,)).astype(np.float32)
      target = rng.integers(0, classes, (b,) + tail)
    if ignore is not None:
      target = _with_ignored(target, rng, ignore)
    return {"preds": preds, "target": target.astype(np.int32)}

  return lambda rng: padded_batches(rng, fields, batch_size=16)


# --- references: the real elements, filtered, then scikit-learn ---------------------------


def _elements(bs, task, *, ignore=None, top_k=1, threshold=0.5, from_logits=False):
  """binary / multiclass: (y_true [n], y_pred [n] or top-k [n, k]); multilabel:
  (Y_true [n, C], Y_pred [n, C], kept [n, C]) with ignored elements set to 0 in both."""
  preds, target = real(bs, "preds"), real(bs, "target")
  if task == "multiclass":
    target = target.reshape(-1)
    if preds.ndim > target.ndim and preds.size == target.size * C:
      order = np.argsort(-preds.reshape(-1, C), axis=-1, kind="stable")
      predicted = order[:, :top_k] if top_k > 1 else order[:, 0]
    else:
      predicted = preds.reshape(-1)
    keep = (target >= 0) & (target < C) & (target != ignore)
    return target[keep], predicted[keep]
  prob = 1 / (1 + np.exp(-preds)) if from_logits else preds
  guess = (prob > threshold).astype(np.int32)
  keep = ((target == 0) | (target == 1)) & (target != ignore)
  if task == "binary":
    return target[keep].astype(np.int32), guess[keep]
  return np.where(keep, target, 0), np.where(keep, guess, 0), keep


SKLEARN_SCORES = {
  "precision": lambda yt, yp, **kw: skm.precision_score(yt, yp, **kw),
  "recall": lambda yt, yp, **kw: skm.recall_score(yt, yp, **kw),
  "f1": lambda yt, yp, **kw: skm.f1_score(yt, yp, **kw),
  "f0.5": lambda yt, yp, **kw: skm.fbeta_score(yt, yp, beta=0.5, **kw),
  "jaccard": lambda yt, yp, **kw: skm.jaccard_score(yt, yp, **kw),
}


def _specificity(mcm, average, included, multilabel=False):
  """numpy on scikit-learn's per-class [[tn, fp], [fn, tp]] (sklearn has no specificity)."""
  tn, fp, fn, tp = (mcm[:, i, j].astype(np.float64) for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)))

  def ratio(a, b):
    return np.where(b > 0, a / np.where(b > 0, b, 1), 0.0)

  per = ratio(tn, tn + fp)
  if average == "micro":
    return ratio(tn[included].sum(), (tn + fp)[included].sum())
  if average is None:
    return np.where(included, per, np.nan)
  if average == "macro":  # multiclass: classes seen; multilabel: every label
    present = included & (tp + fp + fn > 0) if not multilabel else included
    return per[present].mean() if present.any() else 0.0
  support = np.where(included, tp + fn, 0)
  return np.sum(support * per) / support.sum() if support.sum() else 0.0


def _score_reference(score, task, average, *, ignore=None, top_k=1, **kw):
  def reference(bs):
    if task == "binary":
      yt, yp = _elements(bs, task, ignore=ignore, **kw)
      if score == "specificity":
        return _specificity(
          skm.multilabel_confusion_matrix(yt, yp, labels=[1]), "micro", np.array([True])
        )
      return SKLEARN_SCORES[score](yt, yp, average="binary", zero_division=0)
    if task == "multilabel":
      yt, yp, kept = _elements(bs, task, ignore=ignore, **kw)
    else:
      yt, yp = _elements(bs, task, ignore=ignore, top_k=top_k)
      if top_k > 1:  # indicator form: the target class vs the top-k classes
        yt, yp = np.eye(C, dtype=int)[yt], np.eye(C, dtype=int)[yp].max(axis=1)
    included = np.arange(C) != ignore
    if score == "specificity":
      if task == "multilabel":
        mcm = np.stack(
          [
            skm.multilabel_confusion_matrix(yt[kept[:, j], j], yp[kept[:, j], j], labels=[1])[0]
            for j in range(C)
          ]
        )
      else:
        mcm = skm.multilabel_confusion_matrix(yt, yp, labels=list(range(C)))
      return _specificity(mcm, average, included, multilabel=task == "multilabel")
    labels = [c for c in range(C) if included[c]]
    if average == "macro" and task == "multiclass":  # classes in target or preds (sklearn)
      if yt.ndim == 1:
        seen = set(np.unique(yt)) | set(np.unique(yp))
      else:  # top-k indicator form
        seen = set(np.flatnonzero(yt.any(0) | yp.any(0)))
      labels = [c for c in labels if c in seen]
    value = SKLEARN_SCORES[score](yt, yp, labels=labels, average=average, zero_division=0)
    if average is None:
      full = np.full(C, np.nan)
      full[labels] = value
      return full
    return value

  return reference


METRICS = {
  "precision": M.Precision,
  "recall": M.Recall,
  "f1": M.F1Score,
  "f0.5": functools.partial(M.FBetaScore, 0.5),
  "jaccard": M.JaccardIndex,
  "specificity": M.Specificity,
}


def _score_case(score, task, average, *, ignore=None, top_k=1, ids=False, suffix="", **kw):
  num_classes = None if task == "binary" else C
  make = lambda: METRICS[score](
    task=task, num_classes=num_classes, average=average, ignore_index=ignore, top_k=top_k, **kw
  )
  name = f"{score}_{task}_{average}{suffix}"
  return MetricCase(
    name,
    make,
    _data(task, ids=ids, ignore=ignore),
    _score_reference(score, task, average, ignore=ignore, top_k=top_k, **kw),
  )


SCORE_CASES = (
  [_score_case(s, "binary", "macro") for s in METRICS]
  + [
    _score_case(s, t, a)
    for s in METRICS
    for t in ("multiclass", "multilabel")
    for a in ("micro", "macro", "weighted", None)
  ]
  + [
    _score_case(s, "multiclass", a, ignore=2, suffix="_ignore_class")
    for s in METRICS
    for a in ("micro", "macro", "weighted", None)
  ]
  + [
    _score_case(s, "multiclass", "macro", ignore=IGNORE, ids=True, suffix="_ids_ignore")
    for s in ("precision", "recall", "f1")
  ]
  + [
    _score_case(s, "multiclass", a, top_k=2, suffix="_top2")
    for s in ("precision", "recall", "f1")
    for a in ("micro", "macro")
  ]
  + [
    _score_case("f1", "multilabel", a, ignore=IGNORE, suffix="_ignore")
    for a in ("micro", "macro", "weighted")
  ]
  + [
    _score_case("specificity", "multilabel", "macro", ignore=IGNORE, suffix="_ignore"),
    _score_case("f1", "binary", None, ignore=IGNORE, suffix="_ignore_threshold", threshold=0.3),
    _score_case("recall", "binary", None, suffix="_logits", from_logits=True),
    _score_case("precision", "multilabel", "macro", suffix="_logits", from_logits=True),
  ]
)


def _matrix_reference(kind, task, **kw):
  def reference(bs):
    if task == "multilabel":
      yt, yp, kept = _elements(bs, task, ignore=kw.get("ignore"))
      if kind == "mcc":
        return skm.matthews_corrcoef(yt[kept], yp[kept])
      return np.stack(
        [
          skm.multilabel_confusion_matrix(yt[kept[:, j], j], yp[kept[:, j], j], labels=[1])[0]
          for j in range(C)
        ]
      )
    yt, yp = _elements(bs, task, ignore=kw.get("ignore"))
    labels = [0, 1] if task == "binary" else list(range(C))
    if kind == "mcc":
      return skm.matthews_corrcoef(yt, yp)
    if kind == "kappa":
      return skm.cohen_kappa_score(yt, yp, labels=labels, weights=kw.get("weights"))
    return skm.confusion_matrix(yt, yp, labels=labels, normalize=kw.get("normalize"))

  return reference


def _matrix_case(kind, task, *, ignore=None, ids=False, suffix="", **kw):
  num_classes = None if task == "binary" else C
  cls = {"mcc": M.MatthewsCorrCoef, "kappa": M.CohenKappa, "confmat": M.ConfusionMatrix}[kind]
  make = lambda: cls(num_classes=num_classes, task=task, ignore_index=ignore, **kw)
  return MetricCase(
    f"{kind}_{task}{suffix}",
    make,
    _data(task, ids=ids, ignore=ignore),
    _matrix_reference(kind, task, ignore=ignore, **kw),
  )


MATRIX_CASES = [
  _matrix_case("mcc", "binary"),
  _matrix_case("mcc", "multiclass"),
  _matrix_case("mcc", "multiclass", ignore=0, ids=True, suffix="_ids_ignore_class"),
  _matrix_case("mcc", "multilabel", ignore=IGNORE, suffix="_ignore"),
  _matrix_case("kappa", "binary"),
  _matrix_case("kappa", "multiclass"),
  _matrix_case("kappa", "multiclass", suffix="_linear", weights="linear"),
  _matrix_case(
    "kappa", "multiclass", ignore=IGNORE, suffix="_quadratic_ignore", weights="quadratic"
  ),
  _matrix_case("confmat", "binary"),
  _matrix_case("confmat", "multiclass"),
  _matrix_case("confmat", "multiclass", ids=True, ignore=3, suffix="_ids_ignore_class"),
  _matrix_case("confmat", "multiclass", suffix="_normalize_true", normalize="true"),
  _matrix_case("confmat", "multiclass", suffix="_normalize_pred", normalize="pred"),
  _matrix_case("confmat", "multiclass", suffix="_normalize_all", normalize="all"),
  _matrix_case("confmat", "multilabel", ignore=IGNORE, suffix="_ignore"),
]

CASES = SCORE_CASES + MATRIX_CASES
_OTHER_CHECKS = {c.__name__.removeprefix("check_"): c for c in CHECKS if c is not check_eager}
# Every generic check (jit, scan, pmap, shard_map, ...) on one row per state layout
# (per-class counts from class ids, the [C, C] matrix); fewer on the label layout.
PROTOCOL = (
  [("f1_multiclass_macro_ignore_class", c) for c in _OTHER_CHECKS]
  + [
    ("confmat_multiclass", c)
    for c in ("jit_traces_once", "scan", "pmap", "shard_map", "empty_state", "merge_laws")
  ]
  + [("specificity_multilabel_weighted", c) for c in ("scan", "pmap")]
  + [("kappa_binary", "jit_traces_once")]
)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_matches_sklearn_eager(case):
  check_eager(case)


@pytest.mark.parametrize("name,check", PROTOCOL, ids=[f"{c}-{n}" for n, c in PROTOCOL])
def test_protocol(name, check):
  _OTHER_CHECKS[check](next(case for case in CASES if case.name == name))


# --- semantics beyond the table ----------------------------------------------------------


def test_ignored_class_is_left_out_of_macro_averages():
  """torchmetrics #1691: a perfect predictor with ignore_index=0 scores 1, not 2/3."""
  target = jnp.array([0, 1, 2, 0, 1, 2])
  for cls in (M.Precision, M.Recall, M.F1Score, M.JaccardIndex):
    metric = cls(task="multiclass", num_classes=3, average="macro", ignore_index=0)
    assert float(metric.update(preds=target, target=target).compute()) == 1.0
  per_class = (
    M.Recall(num_classes=3, average=None, ignore_index=0)
    .update(preds=target, target=target)
    .compute()
  )
  np.testing.assert_array_equal(np.asarray(per_class), [np.nan, 1.0, 1.0])
  # torchmetrics #2441: class 0 ignored, one of two class-1 rows right -> recall 0.5.
  recall = M.Recall(num_classes=2, average="macro", ignore_index=0).update(
    preds=jnp.array([0, 0, 0, 1]), target=jnp.array([0, 0, 1, 1])
  )
  assert float(recall.compute()) == 0.5


def _segmentation_batches(rng, pixel_mask):
  batches = []
  for step in range(3):
    target = rng.integers(0, C, (8, 6, 6)).astype(np.int32)
    target[rng.random(target.shape) < 0.2] = 255
    scores = rng.standard_normal((8, 6, 6, C)).astype(np.float32)
    rows = np.arange(8) < (8 if step < 2 else 3)
    mask = (rows[:, None, None] & (rng.random((8, 6, 6)) < 0.8)) if pixel_mask else rows
    full = np.broadcast_to(mask.reshape(mask.shape + (1,) * (3 - mask.ndim)), target.shape)
    target = np.where(full, target, rng.choice([-1, C + 5, 2**30], target.shape))
    scores = np.where(full[..., None], scores, np.nan).astype(np.float32)
    batches.append({"preds": scores, "target": target.astype(np.int32), "mask": mask})
  return batches


@pytest.mark.parametrize("pixel_mask", [False, True], ids=["mask_B", "mask_BHW"])
def test_segmentation_miou(pixel_mask):
  """Dataset-level IoU / mIoU of [B, H, W] maps (scores and ids) with ignore_index 255."""
  batches = _segmentation_batches(np.random.default_rng(3), pixel_mask)
  full = [
    np.broadcast_to(
      b["mask"].reshape(b["mask"].shape + (1,) * (3 - b["mask"].ndim)), b["target"].shape
    )
    for b in batches
  ]
  yt = np.concatenate([b["target"][f] for b, f in zip(batches, full)])
  yp = np.concatenate([np.argmax(b["preds"][f], -1) for b, f in zip(batches, full)])
  keep = yt != 255
  for average in ("macro", None, "micro", "weighted"):
    metric = M.JaccardIndex(num_classes=C, average=average, ignore_index=255)
    ids = metric
    for b in batches:
      metric = metric.update(**b)
      ids = ids.update(
        preds=np.argmax(np.nan_to_num(b["preds"]), -1).astype(np.int32),
        target=b["target"],
        mask=b["mask"],
      )
    want = skm.jaccard_score(
      yt[keep], yp[keep], labels=list(range(C)), average=average, zero_division=0
    )
    np.testing.assert_allclose(np.asarray(metric.compute()), want, rtol=2e-6)
    np.testing.assert_allclose(np.asarray(ids.compute()), want, rtol=2e-6)


def test_counts_are_exact_past_2_to_31():
  batch = {"preds": jnp.array([0, 1, 2, 2]), "target": jnp.array([0, 1, 1, 2])}
  metric = M.ConfusionMatrix(3).update(**batch)
  once = metric.counts()
  for _ in range(40):  # 2**40 copies of the batch
    metric = metric.merge(metric)
  np.testing.assert_array_equal(metric.counts(), once * 2**40)
  assert metric.counts().dtype == np.int64
  np.testing.assert_allclose(np.asarray(metric.compute()), once * 2.0**40, rtol=1e-7)
  f1 = M.F1Score(num_classes=3).update(**batch)
  big = functools.reduce(lambda m, _: m.merge(m), range(34), f1)
  assert float(big.compute()) == pytest.approx(float(f1.compute()), rel=1e-6)
  binary = M.ConfusionMatrix(None, task="binary").update(
    preds=jnp.array([0.9, 0.2, 0.7]), target=jnp.array([1, 1, 0])
  )
  np.testing.assert_array_equal(binary.counts(), [[0, 1], [1, 1]])


def test_scatter_and_matmul_counts_agree():
  from padded_eval.metrics.classification import _inputs as ci

  rng = np.random.default_rng(0)
  labels = jnp.asarray(rng.integers(0, 7, 64), jnp.int32)
  predicted = jnp.asarray(rng.integers(0, 7, (64, 1)), jnp.int32)
  valid = jnp.asarray(rng.random(64) < 0.7)
  np.testing.assert_array_equal(
    ci.matrix_counts(labels, predicted, valid, 7, "scatter"),
    ci.matrix_counts(labels, predicted, valid, 7, "matmul"),
  )


BAD_CONFIGS = [
  (lambda: M.Precision(task="binary", num_classes=3), "num_classes"),
  (lambda: M.Precision(task="multiclass"), "num_classes"),
  (lambda: M.Precision(task="multi-class", num_classes=3), "task"),
  (lambda: M.Recall(num_classes=3, average="macro "), "average"),
  (lambda: M.F1Score(num_classes=3, average="samples"), "average"),
  (lambda: M.F1Score(task="binary", threshold=1.5), "threshold"),
  (lambda: M.FBetaScore(-1.0, num_classes=3), "beta"),
  (lambda: M.Precision(num_classes=3, top_k=4), "top_k"),
  (lambda: M.Precision(task="multilabel", num_classes=3, top_k=2), "top_k"),
  (lambda: M.MatthewsCorrCoef(num_classes=3, top_k=2), "top_k"),
  (lambda: M.CohenKappa(task="multilabel", num_classes=3), "task"),
  (lambda: M.CohenKappa(num_classes=3, weights="squared"), "weights"),
  (lambda: M.ConfusionMatrix(3, normalize="rows"), "normalize"),
  (lambda: M.JaccardIndex(num_classes=3, ignore_index=0.5), "ignore_index"),
  (lambda: M.Precision(num_classes=3, from_logits=1), "from_logits"),
  (lambda: M.Precision(num_classes=3, top_k=True), "top_k"),
  (lambda: M.Accuracy(top_k=True), "top_k"),
]


@pytest.mark.parametrize("make,argname", BAD_CONFIGS, ids=[a for _, a in BAD_CONFIGS])
def test_bad_config_names_the_argument(make, argname):
  with pytest.raises(ValueError, match=argname):
    make()


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match="weights"):
    M.F1Score(num_classes=3).update(
      preds=jnp.array([0, 1]), target=jnp.array([0, 1]), weights=jnp.ones(2)
    )
  with pytest.raises(ValueError, match="preds"):
    M.F1Score(num_classes=3).update(preds=jnp.ones((2, 4)), target=jnp.array([0, 1]))
  with pytest.raises(ValueError, match="class ids"):
    M.F1Score(num_classes=3).update(preds=jnp.array([0.2, 0.9]), target=jnp.array([0, 1]))
  with pytest.raises(ValueError, match="top_k"):
    M.Precision(num_classes=3, top_k=2).update(preds=jnp.array([0, 1]), target=jnp.array([0, 1]))
  with pytest.raises(ValueError, match="target"):
    M.F1Score(task="binary").update(preds=jnp.array([0.2, 0.9]), target=jnp.array([0.0, 1.0]))
  with pytest.raises(ValueError, match="multilabel"):
    M.F1Score(task="multilabel", num_classes=3).update(
      preds=jnp.ones((2, 4)), target=jnp.ones((2, 4), jnp.int32)
    )
