"""AUROC / AUPRC ``weighted=True`` (issue 31) against scikit-learn's ``sample_weight`` of
``roc_auc_score`` / ``average_precision_score``, on garbage-padded uneven batches (NaN / inf /
huge weights on padded rows; the real rows divide neither the batch nor 8) and on 8 devices.

Grid scores (``k / 100``, ``binning="linear"`` with 101 bins) each get a bin of their own, so
the binned value is scikit-learn's up to float32 rounding; on continuous scores the error is
within ``error_bound()``. Integer weights give the value of repeated rows, bit for bit.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import sklearn.metrics as skm
from metric_cases import MetricCase, padded_batches, real
from metric_checks import check_eager, check_jit_traces_once, check_pmap, check_shard_map
from sklearn.preprocessing import label_binarize

import padded_eval as pe
from padded_eval.metrics.curves.weighted import INVALID_WEIGHT

M = pe.metrics
C = 4
GRID = {"num_thresholds": 101, "binning": "linear"}
REFERENCES = {"AUROC": skm.roc_auc_score, "AUPRC": skm.average_precision_score}


def _grid(rng, shape):
  return (rng.integers(0, 101, shape) / 100).astype(np.float32)


def _fields(task, integer_weights, grid=True):
  def fields(rng, b):
    if task == "multiclass":
      cuts = np.sort(rng.integers(0, 101, (b, C - 1)), -1)
      edges = np.concatenate([np.zeros((b, 1), int), cuts, np.full((b, 1), 100)], -1)
      out = {"preds": (np.diff(edges, axis=-1) / 100).astype(np.float32)}
      out["target"] = rng.integers(0, C, b)
    else:
      shape = (b, C) if task == "multilabel" else (b,)
      target = rng.random(shape) < 0.4
      if grid:
        preds = _grid(rng, shape)
      else:  # continuous, informative scores
        preds = 1 / (1 + np.exp(-(1.5 * target - 0.75 + rng.standard_normal(shape))))
      out = {"preds": preds.astype(np.float32), "target": target}
    out["target"] = out["target"].astype(np.int32)
    w = rng.integers(0, 5, b) if integer_weights else rng.uniform(0.0, 3.0, b)
    out["weights"] = w.astype(np.float32)
    return out

  return fields


def _batches(task, integer_weights=False, grid=True, seed=0):
  rng = np.random.default_rng(seed)
  batches = padded_batches(rng, _fields(task, integer_weights, grid), num_batches=4)
  if sum(int(b["mask"].sum()) for b in batches) % 8 == 0:  # uneven: divide neither 16 nor 8
    first = batches[0]["mask"]
    first[np.argmax(first)] = False  # a padded row of real-looking values
  assert sum(int(b["mask"].sum()) for b in batches) % 8
  return batches


def _reference(name, task, average, max_fpr=None):
  def reference(bs):
    target, preds, w = real(bs, "target"), real(bs, "preds"), real(bs, "weights")
    if task == "multiclass":
      target = label_binarize(target, classes=range(C))  # one-vs-rest
    kwargs = {"max_fpr": max_fpr} if max_fpr is not None else {}
    if task == "binary":
      return REFERENCES[name](target, preds, sample_weight=w, **kwargs)
    return REFERENCES[name](target, preds, average=average, sample_weight=w, **kwargs)

  return reference


def _make(name, task, average, max_fpr=None, **options):
  num_classes = None if task == "binary" else C
  kwargs = {"max_fpr": max_fpr} if max_fpr is not None else {}
  cls = getattr(M, name)
  return lambda: cls(
    task=task, num_classes=num_classes, average=average, weighted=True, **options, **kwargs
  )


def _case(name, task, average="macro", integer_weights=False, max_fpr=None):
  return MetricCase(
    f"{name}_{task}_{average}_int{int(integer_weights)}_fpr{max_fpr}",
    _make(name, task, average, max_fpr, **GRID),
    lambda rng: _batches(task, integer_weights, seed=int(rng.integers(2**31))),
    _reference(name, task, average, max_fpr),
  )


CASES = (
  [_case(name, "binary", integer_weights=i) for name in REFERENCES for i in (False, True)]
  + [
    _case(name, task, average)
    for name in REFERENCES
    for task in ("multiclass", "multilabel")
    for average in ("macro", "weighted", "micro", None)
  ]
  + [_case("AUROC", task, max_fpr=0.3) for task in ("binary", "multilabel")]
)


EXACT = {"exact": True, "capacity": 64}  # 4 batches of 16 rows


def _exact_case(name, task, average="macro", max_fpr=None):
  """exact=True on continuous scores rounded to 0.05 (ties across classes and batches)."""

  def data(rng):
    batches = _batches(task, grid=False, seed=int(rng.integers(2**31)))
    with np.errstate(over="ignore", invalid="ignore"):
      _round_real_scores(batches, task)
    return batches

  return MetricCase(
    f"exact_{name}_{task}_{average}_fpr{max_fpr}",
    _make(name, task, average, max_fpr, **EXACT),
    data,
    _reference(name, task, average, max_fpr),
    rtol=1e-6,
    atol=1e-7,
  )


def _round_real_scores(batches, task):
  if task == "multiclass":  # grid probabilities already
    return
  for b in batches:  # padded rows keep their garbage
    real_rows = b["mask"].reshape(-1, *[1] * (b["preds"].ndim - 1))
    rounded = np.round(b["preds"] * 20) / 20
    b["preds"] = np.where(real_rows, rounded, b["preds"]).astype(np.float32)


EXACT_CASES = (
  [_exact_case(name, "binary") for name in REFERENCES]
  + [
    _exact_case(name, task, average)
    for name in REFERENCES
    for task in ("multiclass", "multilabel")
    for average in ("macro", "weighted", "micro", None)
  ]
  + [_exact_case("AUROC", task, max_fpr=0.3) for task in ("binary", "multilabel")]
)


@pytest.mark.parametrize("case", CASES + EXACT_CASES, ids=lambda c: c.name)
def test_matches_sklearn_sample_weight(case):
  check_eager(case)


@pytest.mark.parametrize(
  "name", ["AUPRC_multilabel_weighted_int0_fprNone", "exact_AUROC_multilabel_micro_fprNone"]
)
def test_device_checks(name):
  case = next(c for c in CASES + EXACT_CASES if c.name == name)
  check_pmap(case)
  check_shard_map(case)
  check_jit_traces_once(case)


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("mode", [GRID, EXACT], ids=["binned", "exact"])
def test_through_masked_eval_on_8_devices(backend, name, mode):
  assert jax.local_device_count() == 8
  make = _make(name, "multilabel", "macro", **mode)

  def step(params, batch):
    return make().batch_updates(**batch)

  batches = _batches("multilabel", seed=3)
  logs = pe.masked_eval(step, None, batches, backend=backend)
  expected = _reference(name, "multilabel", "macro")(batches)
  np.testing.assert_allclose(logs[make().name], expected, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("options", [GRID, {"num_thresholds": 65}, {"exact": True}])
def test_integer_weights_equal_repeated_rows(name, options):
  batches = _batches("binary", integer_weights=True, grid=False, seed=2)
  repeats = real(batches, "weights").astype(np.int64)
  if options.get("exact"):
    weighted_options = {**options, "capacity": 64}
    options = {**options, "capacity": int(repeats.sum())}
  else:
    weighted_options = options
  weighted = getattr(M, name)(weighted=True, **weighted_options)
  for b in batches:
    weighted = weighted.update(**b)
  preds, target = real(batches, "preds"), real(batches, "target")
  repeated = getattr(M, name)(**options).update(
    preds=np.repeat(preds, repeats).astype(np.float32), target=np.repeat(target, repeats)
  )
  if options.get("exact"):  # float32 weight sums against int counts: one rounding apart
    np.testing.assert_allclose(float(weighted.compute()), float(repeated.compute()), rtol=1e-6)
  else:
    assert float(weighted.compute()) == float(repeated.compute())
  for got, want in zip(weighted.curve(), repeated.curve()):
    np.testing.assert_array_equal(got, want)
  if name == "AUROC":  # AUPRC's weighted bound lets a weight be as small as it likes
    assert float(weighted.error_bound()) == float(repeated.error_bound())


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("seed", [1, 4])
@pytest.mark.parametrize("bins", [17, 257, None])
def test_error_bound_holds_on_continuous_scores(name, seed, bins):
  batches = _batches("binary", grid=False, seed=seed)
  metric = getattr(M, name)(bins, weighted=True)
  for b in batches:
    metric = metric.update(**b)
  target, preds, w = real(batches, "target"), real(batches, "preds"), real(batches, "weights")
  error = abs(float(metric.compute()) - REFERENCES[name](target, preds, sample_weight=w))
  assert error <= float(metric.error_bound()) + 1e-6


def test_partial_auc_bound_holds_on_continuous_scores():
  batches = _batches("binary", grid=False, seed=5)
  metric = M.AUROC(33, weighted=True, max_fpr=0.2)
  for b in batches:
    metric = metric.update(**b)
  target, preds, w = real(batches, "target"), real(batches, "preds"), real(batches, "weights")
  expected = skm.roc_auc_score(target, preds, sample_weight=w, max_fpr=0.2)
  assert abs(float(metric.compute()) - expected) <= float(metric.error_bound()) + 1e-6


def test_shared_bin_bound_in_weighted_terms():
  """Scores 0.5 and 0.5001 share a bin: the value is the tie's 0.5 and the bound the
  weighted share of the tied pair, 0.5 (scikit-learn: 1.0)."""
  m = M.AUROC(weighted=True).update(
    preds=np.array([0.5, 0.5001], np.float32),
    target=np.array([0, 1]),
    weights=np.array([3.0, 0.25]),
  )
  assert float(m.compute()) == 0.5 and float(m.error_bound()) == 0.5


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_bad_weights_in_real_rows_are_counted_not_used(name):
  rng = np.random.default_rng(9)
  n = 37
  preds, target = _grid(rng, (n,)), (rng.random(n) < 0.5).astype(np.int32)
  weights = rng.uniform(0.5, 2.0, n).astype(np.float32)
  bad = np.array([3, 10, 11, 30])
  weights[bad] = [np.nan, -1.0, np.inf, -np.inf]
  mask = np.ones(n, bool)
  mask[[0, 5]] = False  # padded rows: their weights are never read
  weights[[0, 5]] = [np.nan, -3e38]
  metric = getattr(M, name)(weighted=True, **GRID).update(
    preds=preds, target=target, weights=weights, mask=mask
  )
  assert metric.invalid_counts()[INVALID_WEIGHT] == len(bad)
  assert (metric.name, INVALID_WEIGHT, len(bad)) in metric.invalid_report()
  keep = mask.copy()
  keep[bad] = False
  expected = REFERENCES[name](target[keep], preds[keep], sample_weight=weights[keep])
  np.testing.assert_allclose(float(metric.compute()), expected, rtol=2e-6)


def test_multiclass_bad_weight_counts_its_row_once():
  preds = np.full((3, 3), 1 / 3, np.float32)
  m = M.AUROC(task="multiclass", num_classes=3, weighted=True).update(
    preds=preds, target=np.array([0, 1, 2]), weights=np.array([1.0, -2.0, 1.0])
  )
  assert m.invalid_counts()[INVALID_WEIGHT] == 1


def test_multilabel_weights_per_label():
  """Multilabel ``weights`` may be ``[B, C]`` (one per label): each column's sklearn value
  with that column's weights."""
  rng = np.random.default_rng(3)
  n = 45
  preds, target = _grid(rng, (n, C)), (rng.random((n, C)) < 0.5).astype(np.int32)
  weights = rng.uniform(0.0, 2.0, (n, C)).astype(np.float32)
  m = M.AUPRC(task="multilabel", num_classes=C, average=None, weighted=True, **GRID)
  got = np.asarray(m.update(preds=preds, target=target, weights=weights).compute())
  expected = [
    skm.average_precision_score(target[:, c], preds[:, c], sample_weight=weights[:, c])
    for c in range(C)
  ]
  np.testing.assert_allclose(got, expected, rtol=2e-6)


def test_unweighted_state_is_unchanged():
  """weighted=False keeps the integer histograms and the score kinds (four reported, and the
  logits' evidence); weighted=True adds the weights' kind and float sums."""
  plain, weighted = M.AUROC(), M.AUROC(weighted=True)
  assert isinstance(plain.empty().positives, pe.exact.ExactCount)
  assert isinstance(weighted.empty().positives, pe.exact.ExactSum)
  assert plain.empty().invalid.shape == (5,) and INVALID_WEIGHT not in plain.invalid_kinds
  assert weighted.empty().invalid.shape == (6,)


@pytest.mark.parametrize(
  ("options", "word"),
  [
    ({"thresholds": 5}, "thresholds"),
    ({"task": "multilabel", "num_classes": 3, "average": "samples"}, "samples"),
    ({"task": "multiclass", "num_classes": 3, "multi_class": "ovo"}, "ovo"),
  ],
)
def test_refused_combinations_say_why(options, word):
  with pytest.raises(ValueError, match=f"weighted=True.*{word}"):
    M.AUROC(weighted=True, **options)


def test_weights_need_weighted_true():
  with pytest.raises(ValueError, match="mask elements out instead"):
    M.AUPRC().update(preds=np.array([0.2, 0.7]), target=np.array([0, 1]), weights=np.ones(2))
  with pytest.raises(ValueError, match="weighted must be True or False"):
    M.AUPRC(weighted="yes")
  with pytest.raises(ValueError, match="weights"):  # not a prefix of target's shape
    M.AUPRC(weighted=True).update(
      preds=np.array([0.2, 0.7]), target=np.array([0, 1]), weights=np.ones(3)
    )


def test_curve_point_metrics_refuse_weighted():
  with pytest.raises(ValueError, match="takes no sample weights"):
    M.EER(weighted=True)


def test_exact_curve_is_sklearns_weighted_roc_curve():
  batches = _batches("binary", grid=False, seed=6)
  m = M.AUROC(weighted=True, **EXACT)
  for b in batches:
    m = m.update(**b)
  target, preds, w = real(batches, "target"), real(batches, "preds"), real(batches, "weights")
  fpr, tpr, thresholds = skm.roc_curve(target, preds, sample_weight=w, drop_intermediate=False)
  got = m.curve()
  np.testing.assert_allclose(got[0], fpr, rtol=1e-12)
  np.testing.assert_allclose(got[1], tpr, rtol=1e-12)
  np.testing.assert_allclose(got[2][1:], thresholds[1:].astype(np.float32))
  assert float(m.error_bound()) == 0.0


def _scaled_weights_data(scale):
  """64 rows of binary targets, uniform scores and weights of 1, 2 or 3 times ``scale``."""
  rng = np.random.default_rng(0)
  target = rng.integers(0, 2, 64)
  preds = rng.random(64).astype(np.float32)
  weights = (scale * rng.choice([1.0, 2.0, 3.0], 64)).astype(np.float32)
  return target, preds, weights


@pytest.mark.parametrize("scale", [1e-25, 1e18])
def test_exact_areas_of_weights_on_any_scale(scale):
  # weights of 1e18 overflowed AUROC's w * W sums (NaN) and weights of 1e-25 underflowed
  # them (AUROC and AUPRC 0.0); the areas are ratios, the same on any scale
  target, preds, weights = _scaled_weights_data(scale)
  for name, reference in REFERENCES.items():
    m = getattr(M, name)(weighted=True, exact=True, capacity=64)
    got = m.update(preds=preds, target=target, weights=weights).compute()
    want = reference(target, preds.astype(float), sample_weight=weights.astype(float))
    np.testing.assert_allclose(float(got), want, rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("scale", [1e-25, 1e18])
def test_error_bound_holds_for_weights_on_any_scale(scale):
  # the shared-bin bound divided by P * N: it underflowed for weights of 1e-25 (NaN) and
  # overflowed for 1e18 (0.0, under the actual error 2e-4)
  target, preds, weights = _scaled_weights_data(scale)
  m = M.AUROC(num_thresholds=65, binning="linear", weighted=True)
  m = m.update(preds=preds, target=target, weights=weights)
  want = skm.roc_auc_score(target, preds.astype(float), sample_weight=weights.astype(float))
  bound = float(m.error_bound())
  assert 0 < bound < 0.1
  assert abs(float(m.compute()) - want) <= bound
