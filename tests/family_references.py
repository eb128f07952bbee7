"""Batches and float64 references for the ranking, image, regression-extra and report rows
of ``tests/metric_cases.py`` (kept apart so the table stays one list of rows).

Every reference reads only the real parts of the batches: the real rows, and in a
ranking row the real candidates (a ``[B, L]`` mask), in their order in the list.
"""

from __future__ import annotations

import numpy as np
import scipy.ndimage
import skimage.metrics
import sklearn.metrics

BATCH_SIZE = 16
NUM_BATCHES = 3
LIST_LENGTH = 7  # divides neither the batch (16) nor the device count (8)


# --- ranking ------------------------------------------------------------------------------


def ranking_batches(rng, *, graded=False, weighted=False, row_mask=False):
  """Batches of queries: ``preds`` ``[B, L]`` scores with ties (one decimal), ``target``
  ``[B, L]`` relevance (0/1, or 0..3 if ``graded``), a ``[B, L]`` mask of real candidates
  (random lengths, some rows empty; the last batch has 3 real rows) or a ``[B]`` mask."""
  batches = []
  for step in range(NUM_BATCHES):
    rows = BATCH_SIZE if step < NUM_BATCHES - 1 else 3
    lengths = rng.integers(0, LIST_LENGTH + 1, size=BATCH_SIZE)
    lengths[rows:] = 0
    if row_mask:
      mask = lengths > 0
    else:
      mask = np.arange(LIST_LENGTH)[None, :] < lengths[:, None]
    high = 4 if graded else 2
    target = rng.integers(0, high, size=(BATCH_SIZE, LIST_LENGTH))
    if not graded:
      target = (rng.random((BATCH_SIZE, LIST_LENGTH)) < 0.3).astype(np.int32)
    batch = {
      "preds": np.round(rng.standard_normal((BATCH_SIZE, LIST_LENGTH)), 1).astype(np.float32),
      "target": target.astype(np.float32 if graded else np.int32),
      "mask": mask,
    }
    if weighted:
      batch["weights"] = rng.uniform(0.1, 2.0, size=BATCH_SIZE).astype(np.float32)
    batches.append(batch)
  return batches


def queries(batches):
  """``(scores, relevance, weight)`` of every real query: float64 arrays of its real
  candidates in list order."""
  out = []
  for batch in batches:
    mask = np.asarray(batch["mask"])
    if mask.ndim == 1:
      mask = np.broadcast_to(mask[:, None], batch["preds"].shape)
    for i in range(mask.shape[0]):
      if mask[i].any():
        weight = 1.0 if "weights" not in batch else float(batch["weights"][i])
        keep = mask[i]
        scores = batch["preds"][i][keep].astype(np.float64)
        out.append((scores, batch["target"][i][keep].astype(np.float64), weight))
  return out


def _stable_relevance(scores, relevance):
  return relevance[np.argsort(-scores, kind="stable")]  # ties: earlier candidate first


def _recall(scores, relevance, k):
  ranked = _stable_relevance(scores, relevance) > 0
  total = ranked.sum()
  return ranked[:k].sum() / total if total else 0.0


def _precision(scores, relevance, k):
  ranked = _stable_relevance(scores, relevance) > 0
  if not ranked.any():
    return 0.0
  return ranked[:k].sum() / (len(ranked) if k is None else k)


def _reciprocal_rank(scores, relevance, k=None):
  ranked = _stable_relevance(scores, relevance) > 0
  return 1.0 / (np.argmax(ranked) + 1) if ranked.any() else 0.0


def _average_precision(scores, relevance, k):
  ranked = (_stable_relevance(scores, relevance) > 0)[:k]
  if not ranked.any():
    return 0.0
  precision = np.cumsum(ranked) / np.arange(1, len(ranked) + 1)
  return precision[ranked].mean()


def _ndcg(scores, relevance, k):
  if len(scores) == 1:  # scikit-learn refuses one document: DCG == ideal DCG
    return 1.0 if relevance[0] > 0 else 0.0
  return sklearn.metrics.ndcg_score(relevance[None], scores[None], k=k)


RANKING_SCORES = {
  "recall": _recall,
  "precision": _precision,
  "mrr": _reciprocal_rank,
  "map": _average_precision,
  "ndcg": _ndcg,
}


def ranking_reference(name, k=None):
  """``reference(batches)``: the weighted mean over real queries of the per-query score."""
  score = RANKING_SCORES[name]

  def reference(batches):
    rows = queries(batches)
    values = np.array([score(s, r, k) for s, r, _ in rows])
    weights = np.array([w for _, _, w in rows])
    return np.sum(weights * values) / np.sum(weights) if len(rows) else np.nan

  return reference


# --- images -------------------------------------------------------------------------------


def image_batches(rng, shape, *, weighted=False):
  """Batches of ``[B, *shape]`` images in [0, 1] and noisy copies of them (``[B]`` mask)."""
  batches = []
  for step in range(NUM_BATCHES):
    target = rng.random((BATCH_SIZE,) + shape)
    preds = np.clip(target + 0.1 * rng.standard_normal(target.shape), 0.0, 1.0)
    mask = rng.random(BATCH_SIZE) < 0.7 if step < NUM_BATCHES - 1 else np.arange(BATCH_SIZE) < 3
    batch = {"preds": preds.astype(np.float32), "target": target.astype(np.float32), "mask": mask}
    if weighted:
      batch["weights"] = rng.uniform(0.1, 2.0, size=BATCH_SIZE).astype(np.float32)
    batches.append(batch)
  return batches


def _real_images(batches, key):
  return [np.asarray(b[key][b["mask"]], np.float64) for b in batches]


def psnr_reference(data_range):
  def reference(batches):
    preds = np.concatenate(_real_images(batches, "preds"))
    target = np.concatenate(_real_images(batches, "target"))
    mse = np.mean((preds - target) ** 2, axis=tuple(range(1, preds.ndim)))
    values = 10.0 * np.log10(data_range**2 / mse)
    weights = (
      np.concatenate([b["weights"][b["mask"]] for b in batches])
      if "weights" in batches[0]
      else np.ones(len(values))
    )
    return np.sum(weights * values) / np.sum(weights)

  return reference


def ssim_numpy(x, y, data_range, size=11, sigma=1.5, k1=0.01, k2=0.03, padding="reflect"):
  """float64 mean SSIM of one image pair ``[H, W, C]`` with scipy's Gaussian filter
  (truncated at ``(size - 1) / 2``): the map at every pixel of the image extended by
  reflection without edge repeat (scipy's ``mode="mirror"``, torch's ``"reflect"``), or
  with ``padding="valid"`` only where the window fits inside."""
  radius = (size - 1) // 2

  def blur(z):
    return scipy.ndimage.gaussian_filter(
      z, sigma=(sigma, sigma, 0), truncate=radius / sigma, mode="mirror"
    )

  mu_x, mu_y = blur(x), blur(y)
  var_x, var_y = blur(x * x) - mu_x**2, blur(y * y) - mu_y**2
  cov = blur(x * y) - mu_x * mu_y
  c1, c2 = (k1 * data_range) ** 2, (k2 * data_range) ** 2
  ssim = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / (
    (mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2)
  )
  if padding == "valid":
    ssim = ssim[radius:-radius, radius:-radius]
  return ssim.mean()


def ssim_skimage(x, y, data_range):
  """scikit-image's mean SSIM of one pair ``[H, W, C]`` with torchmetrics' defaults."""
  return skimage.metrics.structural_similarity(
    x,
    y,
    gaussian_weights=True,
    sigma=1.5,
    use_sample_covariance=False,
    data_range=data_range,
    channel_axis=-1,
  )


def ssim_reference(data_range, per_image=ssim_numpy):
  def reference(batches):
    preds = np.concatenate(_real_images(batches, "preds"))
    target = np.concatenate(_real_images(batches, "target"))
    if preds.ndim == 3:
      preds, target = preds[..., None], target[..., None]
    return np.mean([per_image(p, t, data_range) for p, t in zip(preds, target)])

  return reference


# --- classification report ----------------------------------------------------------------


def report_table(batches, num_classes):
  """float64 ``[C, 4]``: scikit-learn's precision, recall, F1 and support per class."""
  target = np.concatenate([b["target"][b["mask"]] for b in batches]).ravel()
  preds = np.concatenate([b["preds"][b["mask"]] for b in batches])
  if preds.ndim > target.ndim:
    preds = np.argmax(preds, axis=-1)
  scores = sklearn.metrics.precision_recall_fscore_support(
    target, preds.ravel(), labels=np.arange(num_classes), zero_division=0
  )
  return np.stack([np.asarray(s, np.float64) for s in scores], axis=-1)
