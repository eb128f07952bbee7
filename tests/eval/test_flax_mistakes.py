"""Mistakes made converting Flax's examples (issue 33) give a message that says the fix, or just work.

Each test runs the mistaken call and, where the library accepts it, checks the numbers against numpy
float64 over every row (203 rows: a multiple of neither the batch nor the 8 devices, padding full of NaN).
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from flax import jax_utils

import padded_eval as pe

ROWS = 203


def _data(seed=0):
  rng = np.random.default_rng(seed)
  return {
    "x": rng.standard_normal((ROWS, 4)).astype(np.float32),
    "y": rng.integers(0, 3, ROWS).astype(np.int32),
  }


def _linear_step(params, batch):
  logits = batch["x"] @ params["w"] + params["b"][None, :]
  metric = pe.metrics.Accuracy()
  return metric.batch_updates(preds=logits, target=batch["y"], mask=batch["mask"])


def _params(seed=1):
  rng = np.random.default_rng(seed)
  return {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": np.zeros(3, np.float32)}


def test_pmap_replicated_params_say_unreplicate():
  """wmt's state after ``jax_utils.replicate``: broadcasting error before, now named."""
  data, params = _data(), _params()
  batches = pe.pad_batches(data, 32, pad_value={"x": np.nan, "y": -7})
  with pytest.raises(ValueError, match=r"replicated.*jax_utils\.unreplicate"):
    pe.masked_eval(_linear_step, jax_utils.replicate(params), batches)
  unreplicated = jax_utils.unreplicate(jax_utils.replicate(params))
  results = pe.masked_eval(
    _linear_step, unreplicated, pe.pad_batches(data, 32, pad_value={"x": np.nan, "y": -7})
  )
  logits = data["x"].astype(np.float64) @ params["w"] + params["b"]
  np.testing.assert_allclose(
    results["accuracy"], np.mean(logits.argmax(-1) == data["y"]), rtol=1e-6
  )


def test_params_with_a_leading_axis_of_the_device_count_are_not_mistaken_for_replicated():
  rng = np.random.default_rng(2)
  data = {"x": rng.standard_normal((ROWS, 8)).astype(np.float32), "y": _data()["y"]}
  params = {"w": rng.standard_normal((8, 3)).astype(np.float32), "b": np.zeros(3, np.float32)}
  results = pe.masked_eval(_linear_step, params, pe.pad_batches(data, 32))
  logits = data["x"].astype(np.float64) @ params["w"]
  np.testing.assert_allclose(
    results["accuracy"], np.mean(logits.argmax(-1) == data["y"]), rtol=1e-6
  )


def _decode_step(params, batch):
  return {"argmax": (batch["x"] @ params["w"]).argmax(-1), "score": batch["x"].sum(-1)}


@pytest.mark.parametrize("backend", ["pmap", "shard_map", "jit"])
def test_step_may_return_per_row_outputs_alone(backend):
  """A decode needs no metric: the outputs of every real row come back, in order."""
  data, params = _data(), _params()
  batches = pe.pad_batches(data, 32, pad_value={"x": np.nan, "y": -7})
  results, outputs = pe.masked_eval(_decode_step, params, batches, outputs=True, backend=backend)
  assert dict(results) == {"num_examples": ROWS}
  x = data["x"].astype(np.float64)
  np.testing.assert_array_equal(outputs["argmax"], (x @ params["w"]).argmax(-1))
  np.testing.assert_allclose(outputs["score"], x.sum(-1), rtol=1e-6)


@pytest.mark.parametrize("kind", ["list_iterator", "generator"])
def test_pad_batches_over_a_consumed_iterator_says_already_consumed(kind):
  chunks = [{"x": np.ones((5, 2), np.float32)} for _ in range(3)]
  source = iter(chunks) if kind == "list_iterator" else (c for c in chunks)
  assert len(list(source)) == 3  # e.g. a first evaluation loop read it
  for batch_size in (8, None):
    with pytest.raises(ValueError, match="already consumed"):
      pe.pad_batches(source, batch_size)


def test_a_fresh_generator_is_read():
  chunks = [{"x": np.ones((5, 2), np.float32)} for _ in range(3)]
  assert sum(int(b["mask"].sum()) for b in pe.pad_batches((c for c in chunks), 8)) == 15


def _perplexity_step(params, batch, softmax):
  scores = batch["x"] @ params["w"]  # [B, T, V]
  if softmax:
    scores = jax.nn.softmax(scores)  # the mistake: probabilities where logits are expected
  tokens = batch["mask"][:, None] & (batch["y"] >= 0)
  return pe.metrics.Perplexity().batch_updates(preds=scores, target=batch["y"], mask=tokens)


def test_softmax_outputs_into_perplexity_are_reported():
  rng = np.random.default_rng(3)
  x = rng.standard_normal((ROWS, 5, 4)).astype(np.float32)
  y = rng.integers(0, 6, (ROWS, 5)).astype(np.int32)
  w = rng.standard_normal((4, 6)).astype(np.float32)
  batches = lambda: pe.pad_batches({"x": x, "y": y}, 32, pad_value={"x": np.nan, "y": -1})
  logits = np.einsum("btd,dv->btv", x.astype(np.float64), w)
  log_probs = logits - scipy.special.logsumexp(logits, -1, keepdims=True)
  nll = -np.take_along_axis(log_probs, y[..., None], -1)[..., 0]
  right = pe.masked_eval(
    partial(_perplexity_step, softmax=False), {"w": w}, batches(), backend="jit"
  )
  np.testing.assert_allclose(right["perplexity"], np.exp(nll.mean()), rtol=1e-5)
  with pytest.raises(
    ValueError, match=r"\d+ x 'preds look like probabilities, not logits'"
  ) as info:
    pe.masked_eval(partial(_perplexity_step, softmax=True), {"w": w}, batches(), backend="jit")
  assert f"{ROWS * 5} x 'preds look like probabilities" in str(info.value)
  with pytest.warns(pe.InvalidValuesWarning, match="probabilities"):
    pe.masked_eval(
      partial(_perplexity_step, softmax=True), {"w": w}, batches(), backend="jit", on_invalid="warn"
    )


def _recall_step(params, batch):
  recall = pe.metrics.Recall(task="binary", from_logits=True)
  return recall.batch_updates(preds=batch["score"], target=batch["y"], mask=batch["mask"])


def test_probabilities_into_from_logits_recall_are_reported():
  """sigmoid(p) >= 0.5 for every probability p: recall 1.0 instead of the logits' value."""
  rng = np.random.default_rng(5)
  logits = rng.standard_normal(ROWS).astype(np.float32)
  y = (rng.random(ROWS) < 0.5).astype(np.int32)
  batches = lambda score: pe.pad_batches(
    {"score": score, "y": y}, 32, pad_value={"score": np.nan, "y": -1}
  )
  right = pe.masked_eval(_recall_step, None, batches(logits), backend="jit")
  np.testing.assert_allclose(right["recall"], np.mean(logits[y == 1] > 0), rtol=1e-6)
  probs = 1 / (1 + np.exp(-logits.astype(np.float64)))
  with pytest.raises(ValueError, match=f"{ROWS} x 'preds look like probabilities, not logits'"):
    pe.masked_eval(_recall_step, None, batches(probs.astype(np.float32)), backend="jit")


def test_logits_in_unit_on_one_device_are_not_taken_for_probabilities(backend):
  """Whether the scores look like probabilities is decided over the whole evaluation: under pmap
  and shard_map, a device whose rows hold only logits in [0, 1] must not make a logit model raise
  (it did: the check ran on each device's shard of 2 rows)."""
  rows = 19
  logits = np.array([0.3, 0.7] + [-2.0, 3.0] * 7 + [0.5, -0.25, 2.5], np.float32)
  y = (np.arange(rows) % 3 == 0).astype(np.int32)
  batches = pe.pad_batches({"score": logits, "y": y}, 16, pad_value={"score": np.nan, "y": -1})
  result = pe.masked_eval(_recall_step, None, batches, backend=backend)
  np.testing.assert_allclose(result["recall"], np.mean(logits[y == 1] > 0), rtol=1e-6)
  # probabilities in every row, on any device layout, are still reported (every element)
  probs = (1 / (1 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
  probabilities = pe.pad_batches({"score": probs, "y": y}, 16, pad_value={"score": np.nan, "y": -1})
  with pytest.raises(ValueError, match=f"{rows} x 'preds look like probabilities, not logits'"):
    pe.masked_eval(_recall_step, None, probabilities, backend=backend)


def _multiclass_calibration_step(params, batch):
  metric = pe.metrics.CalibrationError(task="multiclass", num_classes=3, from_logits=True)
  return metric.batch_updates(preds=batch["score"], target=batch["y"], mask=batch["mask"])


def test_softmax_outputs_into_a_multiclass_from_logits_metric_are_reported():
  """softmax(p) of probabilities p flattens them toward uniform: the calibration error of other scores."""
  data, params = _data(6), _params(7)
  logits = data["x"] @ params["w"]
  batches = lambda score: pe.pad_batches(
    {"score": score, "y": data["y"]}, 32, pad_value={"score": np.nan, "y": -1}
  )
  right = pe.masked_eval(_multiclass_calibration_step, None, batches(logits), backend="jit")
  probs = scipy.special.softmax(logits.astype(np.float64), -1)  # float64 reference, 15 bins
  confidence, correct = probs.max(-1), probs.argmax(-1) == data["y"]
  bins = np.minimum((confidence * 15).astype(int), 14)
  ece = sum(
    abs(confidence[bins == b].mean() - correct[bins == b].mean()) * np.mean(bins == b)
    for b in np.unique(bins)
  )
  np.testing.assert_allclose(
    right[next(k for k in right if k != "num_examples")], ece, rtol=1e-5, atol=1e-6
  )
  with pytest.raises(ValueError, match=f"{ROWS} x 'preds look like probabilities, not logits'"):
    pe.masked_eval(
      _multiclass_calibration_step, None, batches(probs.astype(np.float32)), backend="jit"
    )


def _loss_rows(params, batch):
  """Per-row cross entropy of a linear model (NaN on padding rows, whose x is NaN)."""
  logits = batch["x"] @ params["w"] + params["b"][None, :]
  log_probs = jax.nn.log_softmax(logits)
  labels = jnp.clip(batch["y"], 0, 2)
  return -jnp.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0]


def _batch_mean_step(params, batch):  # the Flax issue's pattern: one value per batch
  return pe.metrics.Mean("loss").batch_updates(loss=jnp.mean(_loss_rows(params, batch)))


def _per_row_step(params, batch):
  return pe.metrics.Mean("loss").batch_updates(loss=_loss_rows(params, batch), mask=batch["mask"])


def _weighted_batch_mean_step(params, batch):  # the opt-in: batch means weighted by real rows
  real = batch["mask"]
  n = jnp.sum(real)
  mean = jnp.sum(jnp.where(real, _loss_rows(params, batch), 0.0)) / jnp.maximum(n, 1)
  return pe.metrics.Mean("loss", per_batch=True).batch_updates(loss=mean, weights=n)


@pytest.mark.parametrize("backend", ["pmap", "jit"])
def test_a_batch_level_scalar_into_mean_is_refused(backend):
  """Issue 65: ``Mean("loss").batch_updates(loss=jnp.mean(per_row_loss))`` (one value per batch, no
  mask) returned a mean of batch means without a word; now masked_eval names the metric and the fix.
  The per-row update, and the documented opt-in (``per_batch=True`` with the batch's real rows as
  weights), equal numpy's float64 mean over every real row."""
  data, params = _data(65), _params(66)
  batches = lambda: pe.pad_batches(data, 48, pad_value={"x": np.nan, "y": -7})
  with pytest.raises(ValueError, match=r"'mean' got one value per batch .* held 203 real rows"):
    pe.masked_eval(_batch_mean_step, params, batches(), backend=backend)
  logits = data["x"].astype(np.float64) @ params["w"] + params["b"]
  nll = scipy.special.logsumexp(logits, -1) - logits[np.arange(ROWS), data["y"]]
  for step in (_per_row_step, _weighted_batch_mean_step):
    got = pe.masked_eval(step, params, batches(), backend=backend)
    np.testing.assert_allclose(got["mean"], nll.mean(), rtol=1e-5)
    assert got["num_examples"] == ROWS
