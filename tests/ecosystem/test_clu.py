"""``pe.clu.metric`` inside a CLU ``Collection``: single, and gathered under pmap.

203 rows (dividing neither the batch of 16 nor the 8 devices) in padded batches whose padded
rows hold NaN/inf logits and garbage labels; every value is checked against scikit-learn /
numpy float64 over the real rows, beside CLU's own Accuracy.
"""

import functools

import flax
import jax
import numpy as np
import pytest
import sklearn.metrics
from clu import metrics

import padded_eval as pe

NUM, BATCH, C = 203, 16, 5
rng = np.random.default_rng(5)
LOGITS = rng.standard_normal((NUM, C)).astype(np.float32)
LABELS = rng.integers(0, C, NUM).astype(np.int32)
LOSS = rng.exponential(size=NUM).astype(np.float32)
RENAMED = dict(preds="logits", target="labels")

Metrics = metrics.Collection.create(
  accuracy=pe.clu.metric(pe.metrics.Accuracy().map_arg(**RENAMED)),
  f1=pe.clu.metric(pe.metrics.F1Score(num_classes=C, average="weighted").map_arg(**RENAMED)),
  confusion=pe.clu.metric(pe.metrics.ConfusionMatrix(num_classes=C).map_arg(**RENAMED)),
  group=pe.clu.metric(pe.Metrics({"loss": pe.metrics.Mean("loss")})),
  clu_accuracy=metrics.Accuracy,  # CLU's own, beside
)


def padded_batches(num=NUM):
  data = {"logits": LOGITS[:num], "labels": LABELS[:num], "loss": LOSS[:num]}
  batches = []
  for batch in pe.pad_batches(data, BATCH):
    batch = {k: np.array(v) for k, v in batch.items()}
    pad = ~batch["mask"]
    batch["logits"][pad] = np.where(rng.random((pad.sum(), C)) < 0.5, np.nan, np.inf)
    batch["labels"][pad] = rng.integers(0, C, pad.sum())  # in range: CLU's Accuracy reads them
    batch["loss"][pad] = np.nan
    batches.append(batch)
  return batches


def check(computed, num=NUM):
  predicted = np.argmax(LOGITS[:num], -1)
  accuracy = sklearn.metrics.accuracy_score(LABELS[:num], predicted)
  np.testing.assert_allclose(float(computed["accuracy"]), accuracy, rtol=1e-6)
  np.testing.assert_allclose(float(computed["clu_accuracy"]), accuracy, rtol=1e-6)
  f1 = sklearn.metrics.f1_score(LABELS[:num], predicted, average="weighted")
  np.testing.assert_allclose(float(computed["f1"]), f1, rtol=1e-5)
  confusion = sklearn.metrics.confusion_matrix(LABELS[:num], predicted, labels=range(C))
  np.testing.assert_array_equal(np.asarray(computed["confusion"]), confusion)
  mean = np.mean(LOSS[:num].astype(np.float64))
  np.testing.assert_allclose(float(computed["group"]["loss"]), mean, rtol=1e-6)


def test_single_from_model_output_and_merge_equal_sklearn():
  collection = Metrics.empty()
  for batch in padded_batches():
    collection = collection.merge(Metrics.single_from_model_output(**batch))
  check(collection.compute())
  assert type(collection.accuracy).higher_is_better is True


def test_gather_from_model_output_under_pmap_equals_sklearn():
  devices = jax.local_device_count()

  @functools.partial(jax.pmap, axis_name="batch")
  def eval_step(collection, batch):
    return collection.merge(Metrics.gather_from_model_output(**batch))

  collection = flax.jax_utils.replicate(Metrics.empty())
  for batch in padded_batches():
    sharded = {k: v.reshape((devices, -1) + v.shape[1:]) for k, v in batch.items()}
    collection = jax.block_until_ready(eval_step(collection, sharded))  # one collective at a time
  check(collection.unreplicate().compute())


def test_jitted_single_updates_and_reduce_over_a_stacked_axis():
  step = jax.jit(lambda c, b: c.merge(Metrics.single_from_model_output(**b)))
  halves = [Metrics.empty(), Metrics.empty()]
  for i, batch in enumerate(padded_batches(num=150)):
    halves[i % 2] = step(halves[i % 2], batch)
  stacked = jax.tree.map(lambda a, b: np.stack([a, b]), *halves)
  check(stacked.reduce().compute(), num=150)


def test_refuses_what_is_not_a_padded_eval_metric():
  with pytest.raises(ValueError, match="pe.clu.metric wraps a padded_eval metric"):
    pe.clu.metric(metrics.Accuracy)
