"""Guards against silent misuse (issue 20): float preds read as class ids, and a step
that forgets ``mask=`` so that padded rows are counted.

References are scikit-learn / numpy float64 over the real rows only; padded rows hold
NaN, inf and out-of-range garbage.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sklearn.metrics as skm
from metric_checks import with_garbage_rows

import padded_eval as pe
from padded_eval import metrics as M

PAD = 5
_FLOAT_GARBAGE = np.array([np.nan, np.inf, -np.inf, 7.5, -3.0, 1e30], np.float64)


def _padded(rng, **arrays):
  """``arrays`` plus ``PAD`` garbage rows each, and the ``[n + PAD]`` row mask."""
  return with_garbage_rows(rng, arrays, PAD, _FLOAT_GARBAGE, 2**20)


def _jit_update(metric, batch):
  return jax.jit(lambda m, b: m.update(**b))(metric, batch)


# --- 1. Accuracy: one score per row is not a class id ---------------------------------------

FLOAT_ONE_SCORE = [
  ((40,), (40,)),  # [B] probabilities against [B] labels
  ((40, 1), (40,)),  # a binary model's [B, 1] logits against [B] labels
  ((40, 1), (40, 1)),  # ... against [B, 1] labels
]


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("preds_shape,target_shape", FLOAT_ONE_SCORE)
def test_accuracy_refuses_one_float_score_per_row(preds_shape, target_shape, jit):
  rng = np.random.default_rng(0)
  batch = {
    "preds": rng.normal(size=preds_shape).astype(np.float32),
    "target": rng.integers(0, 2, target_shape).astype(np.int32),
  }
  update = _jit_update if jit else (lambda m, b: m.update(**b))
  with pytest.raises(ValueError, match=r'preds.*\[\.\.\., C\].*Accuracy\(task="binary", threshold'):
    update(M.Accuracy(), batch)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_accuracy_int_class_ids_of_the_targets_shape_still_work(jit):
  rng = np.random.default_rng(1)
  target = rng.integers(0, 4, 50).astype(np.int32)
  ids = rng.integers(0, 4, 50).astype(np.int32)
  batch = _padded(rng, preds=ids, target=target)
  metric = _jit_update(M.Accuracy(), batch) if jit else M.Accuracy().update(**batch)
  np.testing.assert_allclose(float(metric.compute()), skm.accuracy_score(target, ids), rtol=1e-6)


@pytest.mark.parametrize("threshold", [0.5, 0.3])
@pytest.mark.parametrize("from_logits", [False, True], ids=["probs", "logits"])
@pytest.mark.parametrize("layout", ["B", "B1_preds", "B1_both"])
def test_binary_accuracy_matches_sklearn(layout, from_logits, threshold):
  rng = np.random.default_rng(2)
  n = 60
  target = rng.integers(0, 2, n).astype(np.int32)
  logits = rng.normal(0.0, 2.0, n)
  probs = 1.0 / (1.0 + np.exp(-logits))
  scores = (logits if from_logits else probs).astype(np.float32)
  guess = (probs > threshold).astype(np.int32)  # float64 reference: probability > threshold
  preds = scores if layout == "B" else scores[:, None]
  labels = target[:, None] if layout == "B1_both" else target
  batch = _padded(rng, preds=preds, target=labels)
  metric = M.Accuracy(task="binary", threshold=threshold, from_logits=from_logits)
  metric = _jit_update(metric, batch)
  np.testing.assert_allclose(float(metric.compute()), skm.accuracy_score(target, guess), rtol=1e-6)
  assert sum(metric.invalid_counts().values()) == 0


# --- 2. example counts: rows, not elements ----------------------------------------------


def test_example_count_counts_rows_of_any_layout():
  rng = np.random.default_rng(3)
  tokens = rng.normal(size=(12, 7)).astype(np.float32)
  token_mask = rng.random((12, 7)) < 0.3
  token_mask[:3] = False  # rows without a real token are not counted
  want = int(np.sum(token_mask.any(axis=1)))
  assert M.Mean().update(values=tokens, mask=token_mask).example_count() == want
  assert M.Mean().update(values=tokens).example_count() == 12  # no mask: every row
  assert M.Mean().update(values=np.float32(2.0)).example_count() == 0  # a scalar: no rows
  weights = np.where(np.arange(12) < 5, 1.0, 0.0).astype(np.float32)
  assert M.Mean().update(values=tokens, weights=weights).example_count() == 5
  labels = rng.integers(0, 2, (12, 4)).astype(np.int32)
  probs = rng.random((12, 4)).astype(np.float32)
  row_mask = np.arange(12) < 9
  auprc = M.AUPRC(task="multilabel", num_classes=4, num_thresholds=64)
  assert auprc.update(preds=probs, target=labels, mask=row_mask).example_count() == 9


def test_collections_report_each_member():
  x = jnp.arange(6.0)
  mask = jnp.arange(6) < 4
  collection = pe.Metrics({"acc": M.Accuracy(), "mean": M.Mean()})
  collection = collection.update(
    preds=jnp.zeros(6, jnp.int32), target=jnp.zeros(6, jnp.int32), values=x, mask=mask
  )
  assert collection.example_count() is None
  assert sorted(collection.example_report()) == [("acc", 4), ("mean", 4)]


# --- 2. masked_eval refuses a step that forgot mask= ------------------------------------------

N, FEATURES, CLASSES, BATCH = 1003, 4, 3, 64


def _data_and_params():
  rng = np.random.default_rng(4)
  data = {
    "x": rng.normal(size=(N, FEATURES)).astype(np.float32),
    "label": rng.integers(0, CLASSES, N).astype(np.int32),
  }
  params = {"w": rng.normal(size=(FEATURES, CLASSES)).astype(np.float32)}
  return data, params


def _reference_accuracy(data, params):
  logits = data["x"].astype(np.float64) @ params["w"].astype(np.float64)
  return skm.accuracy_score(data["label"], logits.argmax(-1))


def _step(with_mask: bool, collection: bool = False):
  def step_fn(params, batch):
    logits = batch["x"] @ params["w"]
    inputs = {"preds": logits, "target": batch["label"]}
    if with_mask:
      inputs["mask"] = batch["mask"]
    if collection:
      good = M.Mean().batch_updates(values=batch["x"][:, 0], mask=batch["mask"])
      return pe.Metrics({"accuracy": M.Accuracy(), "x0": M.Mean()}).replace_state(
        children={"accuracy": M.Accuracy().batch_updates(**inputs), "x0": good}
      )
    return M.Accuracy().batch_updates(**inputs)

  return step_fn


def test_masked_eval_raises_when_the_step_forgets_the_mask(backend):
  data, params = _data_and_params()
  batches = pe.pad_batches(data, BATCH)  # padded rows: zeros, label 0
  with pytest.raises(
    ValueError, match=r"'accuracy' counted 1024 rows.*1003.*mask=batch\[\"mask\"\]"
  ):
    pe.masked_eval(_step(with_mask=False), params, batches, backend=backend)
  results = pe.masked_eval(_step(with_mask=True), params, batches, backend=backend)
  assert results["num_examples"] == N
  np.testing.assert_allclose(results["accuracy"], _reference_accuracy(data, params), rtol=1e-6)


def test_the_forgotten_mask_gives_a_wrong_number_that_now_warns():
  """on_invalid='warn' shows the (wrong) result the check protects against."""
  data, params = _data_and_params()
  batches = pe.pad_batches(data, BATCH)
  with pytest.warns(pe.InvalidValuesWarning, match="counted 1024 rows"):
    results = pe.masked_eval(_step(with_mask=False), params, batches, on_invalid="warn")
  logits = data["x"].astype(np.float64) @ params["w"].astype(np.float64)
  # the 21 padded rows are zeros: logits 0 predict class 0, their label 0: 21 hits
  wrong = (np.sum(logits.argmax(-1) == data["label"]) + 21) / 1024
  np.testing.assert_allclose(results["accuracy"], wrong, rtol=1e-6)
  assert results["accuracy"] != pytest.approx(_reference_accuracy(data, params), rel=1e-3)


@pytest.mark.parametrize("backend", ["pmap", "jit"])
def test_masked_eval_names_the_collection_member_that_forgot(backend):
  data, params = _data_and_params()
  batches = pe.pad_batches(data, BATCH)
  with pytest.raises(ValueError, match=r"'accuracy' counted 1024") as caught:
    pe.masked_eval(_step(with_mask=False, collection=True), params, batches, backend=backend)
  assert "x0" not in str(caught.value)


def test_losses_report_rows_too():
  preds, target = np.ones((6, 3), np.float32), np.zeros((6, 3), np.float32)
  mask = np.arange(6) < 4
  losses = pe.Losses([pe.losses.MeanSquaredError()])
  assert losses.update(preds=preds, target=target, mask=mask).example_report() == [
    ("meansquarederror", 4)
  ]
  assert losses.update(preds=preds, target=target).example_report() == [("meansquarederror", 6)]
