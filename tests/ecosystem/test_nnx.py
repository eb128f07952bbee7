"""``pe.nnx.Metric`` inside ``nnx.MultiMetric``, beside nnx's own metrics, under ``nnx.jit``.

203 rows (dividing neither the batch of 16 nor the 8 devices) in padded batches whose padded
rows hold NaN/inf logits and garbage labels; every value is checked against scikit-learn /
numpy float64 over the real rows.
"""

import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import sklearn.metrics
from flax import nnx

import padded_eval as pe

NUM, BATCH, C = 203, 16, 5
rng = np.random.default_rng(11)
LOGITS = rng.standard_normal((NUM, C)).astype(np.float32)
LABELS = rng.integers(0, C, NUM).astype(np.int32)
LOSS = rng.exponential(size=NUM).astype(np.float32)


def padded_batches(num=NUM):
  data = {"logits": LOGITS[:num], "labels": LABELS[:num], "loss": LOSS[:num]}
  batches = []
  for batch in pe.pad_batches(data, BATCH, index_key="index"):
    batch = {k: np.array(v) for k, v in batch.items()}
    pad = ~batch["mask"]
    batch["logits"][pad] = np.where(rng.random((pad.sum(), C)) < 0.5, np.nan, -np.inf)
    batch["labels"][pad] = rng.integers(0, C, pad.sum())  # in range: nnx's Accuracy reads them
    batch["loss"][pad] = np.nan
    batches.append(batch)
  return batches


def make_metrics():
  renamed = dict(preds="logits", target="labels")
  return nnx.MultiMetric(
    accuracy=pe.nnx.Metric(pe.metrics.Accuracy().map_arg(**renamed)),
    f1=pe.nnx.Metric(pe.metrics.F1Score(num_classes=C).map_arg(**renamed)),
    group=pe.nnx.Metric(
      pe.Metrics(
        {
          "loss": pe.metrics.Mean("loss"),
          "boot": pe.metrics.Bootstrap(pe.metrics.Accuracy().map_arg(**renamed), 4),
        }
      )
    ),
    nnx_accuracy=nnx.metrics.Accuracy(),  # nnx's own, beside (it multiplies by the mask)
  )


def references(num=NUM):
  predicted = np.argmax(LOGITS[:num], -1)
  return {
    "accuracy": sklearn.metrics.accuracy_score(LABELS[:num], predicted),
    "f1": sklearn.metrics.f1_score(LABELS[:num], predicted, average="macro"),
    "loss": np.mean(LOSS[:num].astype(np.float64)),
  }


def check(computed, expected):
  np.testing.assert_allclose(float(computed["accuracy"]), expected["accuracy"], rtol=1e-6)
  np.testing.assert_allclose(float(computed["f1"]), expected["f1"], rtol=1e-5)
  np.testing.assert_allclose(float(computed["group"]["loss"]), expected["loss"], rtol=1e-6)
  np.testing.assert_allclose(float(computed["group"]["boot"]), expected["accuracy"], rtol=1e-6)
  np.testing.assert_allclose(float(computed["nnx_accuracy"]), expected["accuracy"], rtol=1e-6)


def test_in_multimetric_under_nnx_jit_equals_sklearn():
  metrics = make_metrics()
  traces = []

  @nnx.jit
  def eval_step(metrics, batch):
    traces.append(1)
    metrics.update(**{k: jnp.asarray(v) for k, v in batch.items()})

  for batch in padded_batches():
    eval_step(metrics, batch)
  check(metrics.compute(), references())
  assert len(traces) == 1  # one trace for every batch
  held = metrics.accuracy.metric  # the padded_eval metric itself
  assert isinstance(held, pe.metrics.Accuracy) and held.example_count() == NUM
  assert metrics.accuracy.higher_is_better is True

  metrics.reset()
  assert np.isnan(float(metrics.compute()["accuracy"]))
  for batch in padded_batches(num=37):
    eval_step(metrics, batch)
  check(metrics.compute(), references(num=37))
  assert len(traces) == 1


def test_eager_updates_equal_the_jitted_ones():
  metrics = make_metrics()
  for batch in padded_batches():
    metrics.update(**batch)
  check(metrics.compute(), references())


def test_refuses_what_is_not_a_padded_eval_metric():
  with pytest.raises(ValueError, match="pe.nnx.Metric wraps a padded_eval metric"):
    pe.nnx.Metric(nnx.metrics.Average())
  with pytest.raises(ValueError, match="needs the keyword"):
    pe.nnx.Metric(pe.metrics.Accuracy()).update(logits=LOGITS)


def test_importing_padded_eval_imports_neither_flax_nor_clu():
  script = (
    "import sys, padded_eval as pe\n"
    "assert 'flax' not in sys.modules and 'clu' not in sys.modules, 'imported'\n"
    "pe.nnx.Metric\n"
    "assert 'flax' in sys.modules and 'clu' not in sys.modules\n"
    "pe.clu.metric\n"
    "assert 'clu' in sys.modules\n"
    "print('ok')\n"
  )
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
  assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]
