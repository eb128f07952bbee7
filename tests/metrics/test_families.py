"""Issue 29's non-text families beyond the generic grid (``tests/metric_cases.py`` rows):
``masked_eval`` on every backend with one trace, invalid counts, ``report()`` against
scikit-learn, configuration errors and the docstring examples.

The data has 45 rows (divides neither the batch of 16 nor the 8 devices); padded rows
hold NaN, inf and garbage. References are float64 (``tests/family_references.py``).
"""

from __future__ import annotations

import doctest

import family_references as fam
import jax.numpy as jnp
import numpy as np
import pytest
import skimage.metrics
import sklearn.metrics as skm

import padded_eval as pe
from padded_eval.metrics import images, ranking
from padded_eval.metrics.classification import report, segmentation
from padded_eval.metrics.regression import errors as regression

N, BATCH, LIST, CLASSES = 45, 16, 7, 4


def _dataset(rng):
  lengths = rng.integers(0, LIST + 1, N)
  target = rng.random((N, 12, 11, 2)).astype(np.float32)
  labels = rng.integers(0, CLASSES, N).astype(np.int32)
  return {
    "scores": np.round(rng.standard_normal((N, LIST)), 1).astype(np.float32),
    "relevance": rng.integers(0, 4, (N, LIST)).astype(np.float32),
    "candidates": np.arange(LIST)[None, :] < lengths[:, None],
    "image": target,
    "noisy": np.clip(target + 0.1 * rng.standard_normal(target.shape), 0, 1).astype(np.float32),
    "y": rng.uniform(0.2, 3.0, N).astype(np.float32),
    "y_hat": rng.uniform(0.2, 3.0, N).astype(np.float32),
    "label": labels,
    "logits": rng.standard_normal((N, CLASSES)).astype(np.float32),
  }


def _garbage_batches(data, rng):
  batches = []
  for start in range(0, N, BATCH):
    real = min(BATCH, N - start)
    batch = {"mask": np.arange(BATCH) < real}
    for key, value in data.items():
      pad = (BATCH - real,) + value.shape[1:]
      if value.dtype == np.float32:
        garbage = rng.choice(np.array([np.nan, np.inf, -1e30, 7.0], np.float32), pad)
      elif value.dtype == np.bool_:
        garbage = rng.random(pad) < 0.5
      else:
        garbage = rng.integers(-99, 99, pad).astype(value.dtype)
      batch[key] = np.concatenate([value[start : start + real], garbage])
    batches.append(batch)
  return batches


def _collection():
  lists = {"preds": "scores", "target": "relevance", "mask": "list_mask"}
  pixels = {"preds": "noisy", "target": "image"}
  return pe.Metrics(
    {
      "recall@3": pe.metrics.RecallAtK(3).map_arg(**lists),
      "precision@3": pe.metrics.PrecisionAtK(3).map_arg(**lists),
      "mrr": pe.metrics.MRR().map_arg(**lists),
      "map@4": pe.metrics.MAPAtK(4).map_arg(**lists),
      "ndcg@3": pe.metrics.NDCGAtK(3).map_arg(**lists),
      "psnr": pe.metrics.PSNR(1.0).map_arg(**pixels),
      "ssim": pe.metrics.SSIM(1.0).map_arg(**pixels),
      "ssim_valid": pe.metrics.SSIM(1.0, padding="valid").map_arg(**pixels),
      "mape": pe.metrics.MAPE().map_arg(preds="y_hat", target="y"),
      "msle": pe.metrics.MSLE().map_arg(preds="y_hat", target="y"),
      "explained_variance": pe.metrics.ExplainedVariance().map_arg(preds="y_hat", target="y"),
      "dice": pe.metrics.Dice(num_classes=CLASSES).map_arg(preds="logits", target="label"),
      "report": pe.metrics.ClassificationReport(CLASSES).map_arg(preds="logits", target="label"),
    }
  )


def _references(data):
  lists = [{"preds": data["scores"], "target": data["relevance"], "mask": data["candidates"]}]
  pixels = [{"preds": data["noisy"], "target": data["image"], "mask": np.ones(N, bool)}]
  y, y_hat = data["y"].astype(np.float64), data["y_hat"].astype(np.float64)
  predicted = np.argmax(data["logits"], -1)
  classes = [{"preds": data["logits"], "target": data["label"], "mask": np.ones(N, bool)}]
  return {
    "recall@3": fam.ranking_reference("recall", 3)(lists),
    "precision@3": fam.ranking_reference("precision", 3)(lists),
    "mrr": fam.ranking_reference("mrr")(lists),
    "map@4": fam.ranking_reference("map", 4)(lists),
    "ndcg@3": fam.ranking_reference("ndcg", 3)(lists),
    "psnr": fam.psnr_reference(1.0)(pixels),
    "ssim": fam.ssim_reference(1.0)(pixels),
    "ssim_valid": fam.ssim_reference(1.0, fam.ssim_skimage)(pixels),
    "mape": skm.mean_absolute_percentage_error(y, y_hat),
    "msle": skm.mean_squared_log_error(y, y_hat),
    "explained_variance": skm.explained_variance_score(y, y_hat),
    "dice": skm.f1_score(data["label"], predicted, average="macro"),
    "report": fam.report_table(classes, CLASSES),
  }


def test_masked_eval_every_backend_one_trace(backend):
  rng = np.random.default_rng(29)
  data = _dataset(rng)
  traces = []
  metrics = _collection()

  def step_fn(params, batch):
    del params
    traces.append(1)
    list_mask = batch["mask"][:, None] & batch["candidates"]
    return metrics.batch_updates(**batch, list_mask=list_mask)

  result = pe.masked_eval(step_fn, None, _garbage_batches(data, rng), backend=backend)
  assert len(traces) == 1 and result["num_examples"] == N
  for name, want in _references(data).items():
    rtol = 1e-5 if name.startswith("ssim") else 1e-6
    np.testing.assert_allclose(result[name], want, rtol=rtol, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("data_range", [1e-25, 1e21])
def test_psnr_at_any_scale(data_range):
  # the squared errors neither underflow (1e-26 errors) nor overflow (1e20 errors)
  rng = np.random.default_rng(7)
  target = (data_range * rng.random((3, 8, 8, 2))).astype(np.float32)
  preds = (target + 0.1 * data_range * rng.standard_normal(target.shape)).astype(np.float32)
  got = pe.metrics.PSNR(data_range).update(preds=preds, target=target).compute()
  want = np.mean(
    [
      skimage.metrics.peak_signal_noise_ratio(t, p, data_range=data_range)
      for t, p in zip(target.astype(np.float64), preds.astype(np.float64))
    ]
  )
  np.testing.assert_allclose(float(got), want, rtol=1e-5)


@pytest.mark.parametrize("padding", ["reflect", "valid"])
@pytest.mark.parametrize("data_range", [1e-25, 1e18])
def test_ssim_at_any_scale(data_range, padding):
  # SSIM of images scaled with their data_range is scale-free: the float32 squares and
  # products of 1e-25 (underflow) or 1e18 (overflow) pixels must not turn it into NaN
  rng = np.random.default_rng(11)
  target = (data_range * rng.random((2, 13, 12, 2))).astype(np.float32)
  noisy = target + 0.1 * data_range * rng.standard_normal(target.shape)
  preds = np.stack([noisy[0], target[1]]).astype(np.float32)  # one noisy, one equal image
  got = pe.metrics.SSIM(data_range, padding=padding).update(preds=preds, target=target)
  per_image = fam.ssim_skimage if padding == "valid" else fam.ssim_numpy
  want = fam.ssim_reference(data_range, per_image)(
    [{"preds": preds, "target": target, "mask": np.ones(2, bool)}]
  )
  np.testing.assert_allclose(float(got.compute()), want, rtol=1e-5)


@pytest.mark.parametrize("sigma", [0.8, 1.0, 2.0, 2.5])
def test_ssim_valid_equals_scikit_image_at_other_sigmas_with_its_window(sigma):
  # scikit-image's Gaussian window is 2 * int(3.5 sigma + 0.5) + 1 wide whatever its win_size;
  # with that kernel_size the "valid" map is scikit-image's at any sigma (padded rows: garbage)
  rng = np.random.default_rng(13)
  size = 2 * int(3.5 * sigma + 0.5) + 1
  target = rng.random((3, size + 6, size + 3, 2))
  preds = np.clip(target + 0.1 * rng.standard_normal(target.shape), 0.0, 1.0)
  garbage = np.full((2,) + target.shape[1:], np.nan)
  metric = pe.metrics.SSIM(1.0, kernel_size=size, sigma=sigma, padding="valid")
  got = metric.update(
    preds=np.concatenate([preds, garbage]).astype(np.float32),
    target=np.concatenate([target, -garbage]).astype(np.float32),
    mask=np.arange(5) < 3,
  )
  want = np.mean(
    [
      skimage.metrics.structural_similarity(
        p,
        t,
        gaussian_weights=True,
        sigma=sigma,
        use_sample_covariance=False,
        data_range=1.0,
        channel_axis=-1,
      )
      for p, t in zip(preds.astype(np.float32).astype(np.float64), target.astype(np.float32))
    ]
  )
  np.testing.assert_allclose(float(got.compute()), want, rtol=1e-5)


# --- invalid values -----------------------------------------------------------------------


def test_ranking_counts_invalid_candidates_and_drops_them():
  preds = np.array([[0.9, 0.8, np.nan, 0.1], [0.5, 0.4, 0.3, 0.2]], np.float32)
  target = np.array([[-1.0, 1.0, 1.0, 0.0], [np.nan, 0.0, 2.0, -3.0]], np.float32)
  mask = np.array([[True, True, True, True], [True, True, True, False]])
  metric = pe.metrics.NDCGAtK().update(preds=preds, target=target, mask=mask)
  assert metric.invalid_counts() == {
    "negative relevance": 1,
    "nan relevance": 1,
    "nan score": 1,
    "infinite relevance": 0,
  }
  # the dropped candidates are gone; the NaN score ranks last among the real candidates
  first = skm.ndcg_score([[1.0, 1.0, 0.0]], [[0.8, -1e9, 0.1]])
  second = skm.ndcg_score([[0.0, 2.0]], [[0.4, 0.3]])
  np.testing.assert_allclose(float(metric.compute()), (first + second) / 2, rtol=1e-6)


def test_ndcg_counts_infinite_relevance_and_drops_it():
  # +inf relevance makes a query's DCG and ideal DCG both inf (NDCG NaN, as scikit-learn's):
  # counted, kind "infinite relevance", and dropped as if masked; binary-relevance metrics read
  # it as relevant (target > 0), as torchmetrics does, and count nothing
  preds = np.array([[0.9, 0.8, 0.3, 0.1], [0.5, 0.4, 0.3, 0.2]], np.float32)
  target = np.array([[0.0, np.inf, 1.0, 2.0], [1.0, 0.0, 2.0, 0.0]], np.float32)
  mask = np.array([[True, True, True, True], [True, True, True, False]])
  metric = pe.metrics.NDCGAtK().update(preds=preds, target=target, mask=mask)
  assert metric.invalid_counts() == {
    "negative relevance": 0,
    "nan relevance": 0,
    "nan score": 0,
    "infinite relevance": 1,
  }
  first = skm.ndcg_score([[0.0, 1.0, 2.0]], [[0.9, 0.3, 0.1]])
  second = skm.ndcg_score([[1.0, 0.0, 2.0]], [[0.5, 0.4, 0.3]])
  np.testing.assert_allclose(float(metric.compute()), (first + second) / 2, rtol=1e-6)
  batches = pe.pad_batches({"preds": preds, "target": target, "candidates": mask}, 8)

  def step(params, batch):
    del params
    candidates = batch["mask"][:, None] & batch["candidates"]
    return pe.metrics.NDCGAtK().batch_updates(
      preds=batch["preds"], target=batch["target"], mask=candidates
    )

  with pytest.raises(ValueError, match="1 x 'infinite relevance'"):
    pe.masked_eval(step, None, batches, backend="jit")
  recall = pe.metrics.RecallAtK(2).update(preds=preds, target=target, mask=mask)
  assert sum(recall.invalid_counts().values()) == 0
  np.testing.assert_allclose(float(recall.compute()), (1 / 3 + 1 / 2) / 2, rtol=1e-6)


@pytest.mark.parametrize("name", ["RecallAtK", "PrecisionAtK", "MRR", "MAPAtK", "NDCGAtK"])
@pytest.mark.parametrize("bad", [-1.0, np.nan, np.inf])
def test_a_query_whose_candidates_are_all_dropped_is_not_a_query(name, bad):
  """Invalid candidates are dropped as if masked, so a query left with none is not a query (as
  one whose candidates are all masked): before, it counted as a query scoring 0 (an all-padding
  TF-Ranking query, relevance -1 everywhere, halved MRR here). Its candidates are still counted.
  Queries weighted, one of them of weight 0; padded rows garbage; eager and through masked_eval."""
  rng = np.random.default_rng(3)
  n, lists = 9, 5
  preds = rng.standard_normal((n, lists)).astype(np.float32)
  target = rng.integers(0, 3, (n, lists)).astype(np.float32)
  target[:, 0] = 1.0  # every usable query has a relevant candidate
  weights = rng.uniform(0.5, 2.0, n).astype(np.float32)
  weights[4] = 0.0
  dropped = [2, 4, 7]  # every candidate invalid (row 4: also of weight 0)
  target[dropped] = bad
  metric = getattr(pe.metrics, name)(*([2] if name in ("RecallAtK", "PrecisionAtK") else []))
  unusable = bad < 0 or np.isnan(bad) or name == "NDCGAtK"  # +inf: relevant for the others
  kept = np.ones(n, bool)
  if unusable:
    kept[dropped] = False
  got = metric.update(preds=preds, target=target, weights=weights)
  masked = metric.update(
    preds=preds, target=target, weights=weights, mask=np.broadcast_to(kept[:, None], (n, lists))
  )
  np.testing.assert_allclose(float(got.compute()), float(masked.compute()), rtol=1e-6)
  counted = sum(got.invalid_counts().values())
  assert counted == (2 * lists if unusable else 0)  # rows 2 and 7 (row 4 has weight 0)
  padded = {
    "preds": np.concatenate([preds, np.full((7, lists), np.nan, np.float32)]),
    "target": np.concatenate([target, rng.integers(-5, 5, (7, lists)).astype(np.float32)]),
    "weights": np.concatenate([weights, np.full(7, np.nan, np.float32)]),
  }
  batches = [
    {**{k: v[i : i + 8] for k, v in padded.items()}, "mask": np.arange(i, i + 8) < n}
    for i in (0, 8)
  ]

  def step(params, batch):
    del params
    return metric.batch_updates(
      preds=batch["preds"], target=batch["target"], weights=batch["weights"], mask=batch["mask"]
    )

  results = pe.masked_eval(step, None, batches, backend="jit", on_invalid="ignore")
  np.testing.assert_allclose(float(results[metric.name]), float(masked.compute()), rtol=1e-6)


def test_masked_eval_reports_negative_relevance():
  batch = {
    "preds": np.ones((8, 3), np.float32),
    "target": np.full((8, 3), -1.0, np.float32),
    "mask": np.ones(8, bool),
  }
  with pytest.raises(ValueError, match="negative relevance"):
    pe.masked_eval(lambda p, b: pe.metrics.MRR().batch_updates(**b), None, [batch], backend="jit")


def test_msle_counts_values_at_or_below_minus_one_and_leaves_them_out():
  preds = np.array([1.0, -1.0, 2.0, np.nan], np.float32)
  target = np.array([0.5, 1.0, -2.0, 1.0], np.float32)
  metric = pe.metrics.MSLE().update(preds=preds, target=target)
  assert metric.invalid_counts() == {"value <= -1": 3}
  np.testing.assert_allclose(
    float(metric.compute()), skm.mean_squared_log_error([0.5], [1.0]), rtol=1e-6
  )


@pytest.mark.parametrize(
  "metric, kind, inputs",
  [
    (pe.metrics.PSNR(1.0), "nan pixel", {"preds": np.zeros((3, 4, 4, 1)), "target": "nan"}),
    (pe.metrics.SSIM(1.0), "nan pixel", {"preds": np.zeros((3, 12, 12)), "target": "nan"}),
    (pe.metrics.MAPE(), "nan value", {"preds": np.zeros(3), "target": "nan"}),
    (pe.metrics.ExplainedVariance(), "nan value", {"preds": np.zeros(3), "target": "nan"}),
  ],
  ids=["psnr", "ssim", "mape", "explained_variance"],
)
def test_nan_in_real_rows_is_counted_and_not_dropped(metric, kind, inputs):
  target = np.ones_like(inputs["preds"]) + np.arange(3).reshape(
    (3,) + (1,) * (inputs["preds"].ndim - 1)
  )
  target.reshape(-1)[1] = np.nan  # one NaN element in the first real row
  target[2] = np.nan  # padding: never counted
  batch = {"preds": inputs["preds"], "target": target, "mask": np.array([True, True, False])}
  updated = metric.update(**batch)
  assert updated.invalid_counts() == {kind: 1}
  assert np.isnan(float(updated.compute()))


def test_ranking_query_weights_with_candidate_mask():
  rng = np.random.default_rng(3)
  batch = fam.ranking_batches(rng, graded=True)[0]
  batch["weights"] = rng.uniform(0.1, 2.0, len(batch["preds"])).astype(np.float32)
  got = pe.metrics.NDCGAtK(4).update(**batch).compute()
  np.testing.assert_allclose(float(got), fam.ranking_reference("ndcg", 4)([batch]), rtol=1e-6)


@pytest.mark.parametrize("k", [None, 1, 3])
def test_ndcg_of_one_candidate_lists(k):
  # L = 1: a query whose one candidate is relevant is ranked ideally (NDCG 1). scikit-learn
  # refuses one document, so each list gets a candidate of relevance 0 ranked after it,
  # which changes neither its DCG nor its ideal DCG.
  preds = np.array([[0.3], [-2.0], [0.7]], np.float32)
  target = np.array([[1.0], [2.0], [0.0]], np.float32)
  got = pe.metrics.NDCGAtK(k).update(preds=preds, target=target).compute()
  padded_target = np.concatenate([target, np.zeros_like(target)], axis=1)
  padded_preds = np.concatenate([preds, np.full_like(preds, -1e9)], axis=1)
  want = np.mean(
    [skm.ndcg_score(t[None], p[None], k=k) for t, p in zip(padded_target, padded_preds)]
  )
  np.testing.assert_allclose(float(got), want, rtol=1e-6)


# --- the classification report ------------------------------------------------------------


def _assert_same_report(got: dict, want: dict) -> None:
  """Same keys in the same order, every value within 1e-12 relative."""
  assert list(got) == list(want)
  for key, value in want.items():
    if isinstance(value, dict):
      assert list(got[key]) == list(value), key
      np.testing.assert_allclose(list(got[key].values()), list(value.values()), rtol=1e-12)
    else:
      np.testing.assert_allclose(got[key], value, rtol=1e-12, err_msg=key)


@pytest.mark.parametrize("all_classes", [False, True])
def test_report_equals_sklearn_classification_report(all_classes):
  rng = np.random.default_rng(5)
  target = rng.integers(0, 4, 61)  # class 4 and 5 never occur; 5 is predicted
  preds = np.where(rng.random(61) < 0.5, target, rng.integers(0, 6, 61))
  garbage = {"preds": rng.integers(-9, 99, 11), "target": rng.integers(-9, 99, 11)}
  metric = pe.metrics.ClassificationReport(6)
  for part in (slice(0, 30), slice(30, 61)):
    metric = metric.update(preds=preds[part], target=target[part])
  metric = metric.update(**garbage, mask=np.zeros(11, bool))
  labels = np.arange(6) if all_classes else None
  want = skm.classification_report(target, preds, labels=labels, output_dict=True, zero_division=0)
  _assert_same_report(metric.report(all_classes=all_classes), want)


def test_report_names_ignore_index_and_empty():
  metric = pe.metrics.ClassificationReport(3, ignore_index=1)
  assert metric.report() == {}
  metric = metric.update(preds=jnp.array([0, 1, 2, 0]), target=jnp.array([0, 1, 2, 2]))
  keep = np.array([0, 1, 2, 2]) != 1
  want = skm.classification_report(
    np.array([0, 1, 2, 2])[keep],
    np.array([0, 1, 2, 0])[keep],
    labels=[0, 2],
    target_names=["cat", "dog"],
    output_dict=True,
    zero_division=0,
  )
  _assert_same_report(metric.report(target_names=["cat", "dog"]), want)
  assert np.isnan(np.asarray(metric.compute())[1]).all()
  with pytest.raises(ValueError, match="target_names"):
    metric.report(target_names=["only one"])


# --- configuration and input errors -------------------------------------------------------


@pytest.mark.parametrize(
  "make, argname",
  [
    (lambda: pe.metrics.RecallAtK(0), "k"),
    (lambda: pe.metrics.NDCGAtK(2.5), "k"),
    (lambda: pe.metrics.PSNR(-1.0), "data_range"),
    (lambda: pe.metrics.SSIM(1.0, kernel_size=4), "kernel_size"),
    (lambda: pe.metrics.SSIM(1.0, sigma=0), "sigma"),
    (lambda: pe.metrics.SSIM(1.0, padding="same"), "padding"),
    (
      lambda: pe.metrics.ExplainedVariance(multioutput="median"),
      "multioutput",
    ),  # issue 31: variance_weighted is a choice now
    (lambda: pe.metrics.ClassificationReport(1), "num_classes"),
  ],
)
def test_bad_configuration_names_the_argument(make, argname):
  with pytest.raises(ValueError, match=argname):
    make()


def test_bad_inputs_say_what_was_expected():
  with pytest.raises(ValueError, match=r"preds \[B, L\]"):
    pe.metrics.MRR().update(preds=np.ones(4, np.float32), target=np.ones(4))
  with pytest.raises(ValueError, match="weights"):
    pe.metrics.MRR().update(preds=np.ones((2, 3)), target=np.ones((2, 3)), weights=np.ones((2, 3)))
  with pytest.raises(ValueError, match="kernel_size=11"):
    pe.metrics.SSIM(1.0, padding="valid").update(
      preds=np.ones((1, 8, 20, 1)), target=np.ones((1, 8, 20, 1))
    )
  with pytest.raises(ValueError, match="at least 6"):
    pe.metrics.SSIM(1.0).update(preds=np.ones((1, 5, 20)), target=np.ones((1, 5, 20)))
  with pytest.raises(ValueError, match="one shape"):
    pe.metrics.PSNR(1.0).update(preds=np.ones((1, 4, 4)), target=np.ones((1, 4, 5)))


@pytest.mark.parametrize("module", [ranking, images, regression, report, segmentation])
def test_docstring_examples(module):
  result = doctest.testmod(module)
  assert result.attempted > 0 and result.failed == 0
