"""float64 numpy references for the loss tests (independent of padded_eval)."""

import numpy as np

EPS = 1e-7


def log_softmax(logits):
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(axis=-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def categorical_xent(preds, target, *, from_logits=True, smoothing=0.0, dense=False):
  """Per-element categorical cross entropy, shape preds.shape[:-1]."""
  preds = np.asarray(preds, np.float64)
  num_classes = preds.shape[-1]
  log_probs = log_softmax(preds) if from_logits else np.log(np.clip(preds, EPS, 1 - EPS))
  if dense:
    t = np.asarray(target, np.float64) * (1 - smoothing) + smoothing / num_classes
  else:
    t = np.eye(num_classes)[np.asarray(target)] * (1 - smoothing) + smoothing / num_classes
  return -(t * log_probs).sum(axis=-1)


def binary_xent(preds, target, *, from_logits=True, smoothing=0.0):
  preds = np.asarray(preds, np.float64)
  t = np.asarray(target, np.float64) * (1 - smoothing) + 0.5 * smoothing
  p = 1 / (1 + np.exp(-preds)) if from_logits else np.clip(preds, EPS, 1 - EPS)
  if from_logits:
    # log(sigmoid(x)) = -log1p(exp(-x)), computed stably
    log_p = -np.logaddexp(0, -preds)
    log_1mp = -np.logaddexp(0, preds)
  else:
    log_p, log_1mp = np.log(p), np.log1p(-p)
  return -(t * log_p + (1 - t) * log_1mp)


def masked_mean(values, mask=None, weights=None):
  """Weighted mean of ``values`` over real elements (mask/weights a prefix of its shape)."""
  values = np.asarray(values, np.float64)

  def expand(x):
    x = np.asarray(x)
    return np.broadcast_to(x.reshape(x.shape + (1,) * (values.ndim - x.ndim)), values.shape)

  real = np.ones(values.shape, bool) if mask is None else expand(mask)
  w = np.ones(values.shape) if weights is None else expand(np.asarray(weights, np.float64))
  w = np.where(real, w, 0.0)
  return float(np.where(real, values * w, 0.0).sum() / w.sum())


def with_garbage(x, real_rows, rng, value=np.nan):
  """``x`` with the rows where ``real_rows`` is False replaced by garbage."""
  x = np.array(x, copy=True)
  pad = ~np.asarray(real_rows)
  if x.dtype.kind == "f":
    x[pad] = value
  else:
    x[pad] = rng.integers(-1000, 1000, size=x[pad].shape)
  return x
