"""``EvalResults.scalars()`` / ``write(writer, step)`` for metric writers, and ``pe.best``.

Results come from ``masked_eval`` over 203 rows (a size dividing neither the batch of 16 nor
the 8 devices) whose padded rows hold NaN/inf garbage; every value is checked against
scikit-learn. ``write`` is checked with CLU's own ``SummaryWriter`` (TensorBoard event files,
read back with TensorBoard's reader) and ``LoggingWriter``, and with an in-memory writer.
"""

import math

import numpy as np
import pytest
import sklearn.metrics

import padded_eval as pe

NUM, BATCH, C = 203, 16, 3
rng = np.random.default_rng(3)
FEATURES = rng.standard_normal((NUM, 4)).astype(np.float32)
LABELS = rng.integers(0, C, NUM).astype(np.int32)


def padded_batches():
  """pad_batches' batches with the padded rows overwritten by NaN/inf garbage."""
  batches = []
  for batch in pe.pad_batches({"x": FEATURES, "label": LABELS}, BATCH):
    batch = {k: np.array(v) for k, v in batch.items()}
    pad = ~batch["mask"]
    batch["x"][pad] = np.where(rng.random((pad.sum(), 4)) < 0.5, np.nan, np.inf)
    batch["label"][pad] = rng.integers(-(2**30), 2**30, pad.sum())
    batches.append(batch)
  return batches


def metric():
  return pe.Metrics(
    {
      "accuracy": pe.metrics.Accuracy(),
      "f1": pe.metrics.F1Score(num_classes=C, average=None),
      "confusion": pe.metrics.ConfusionMatrix(num_classes=C),
      "mse": pe.metrics.MSE().map_arg(target="onehot"),
    }
  )


def evaluate(weights):
  def step(w, batch):
    logits = batch["x"][:, :C] @ w
    onehot = (batch["label"][:, None] == np.arange(C)[None, :]).astype(np.float32)
    return metric().batch_updates(
      preds=logits, target=batch["label"], onehot=onehot, mask=batch["mask"]
    )

  return pe.masked_eval(step, weights, padded_batches())


def references(weights):
  logits = FEATURES[:, :C].astype(np.float64) @ weights
  predicted = np.argmax(logits, -1)
  return {
    "accuracy": sklearn.metrics.accuracy_score(LABELS, predicted),
    "f1": sklearn.metrics.f1_score(LABELS, predicted, average=None),
    "confusion": sklearn.metrics.confusion_matrix(LABELS, predicted),
    "mse": sklearn.metrics.mean_squared_error(np.eye(C)[LABELS], logits),
  }


WEIGHTS = [rng.standard_normal((C, C)).astype(np.float32) for _ in range(3)]


@pytest.fixture(scope="module")
def results():
  return [evaluate(w) for w in WEIGHTS]


def test_scalars_are_flat_floats_with_arrays_expanded(results):
  scalars = results[0].scalars()
  expected = references(WEIGHTS[0])
  assert all(type(k) is str and type(v) is float for k, v in scalars.items())
  assert scalars["num_examples"] == NUM
  np.testing.assert_allclose(scalars["accuracy"], expected["accuracy"], rtol=1e-6)
  np.testing.assert_allclose(scalars["mse"], expected["mse"], rtol=1e-5)
  for i in range(C):
    np.testing.assert_allclose(scalars[f"f1/{i}"], expected["f1"][i], rtol=1e-5)
    for j in range(C):
      assert scalars[f"confusion/{i}/{j}"] == expected["confusion"][i, j]
  assert "f1" not in scalars and "confusion" not in scalars
  assert len(scalars) == 1 + 1 + 1 + C + C * C


def test_scalars_keep_nan_and_refuse_what_is_not_a_number():
  scalars = pe.EvalResults({"a": np.float32("nan"), "b": {"c": np.arange(2)}}).scalars()
  assert math.isnan(scalars["a"]) and scalars == {"a": scalars["a"], "b/c/0": 0.0, "b/c/1": 1.0}
  with pytest.raises(ValueError, match="'name' is not numeric"):
    pe.EvalResults({"name": "x"}).scalars()


class MemoryWriter:
  """A writer keeping what it is given (the one method of CLU's interface that write calls)."""

  def __init__(self):
    self.written = []

  def write_scalars(self, step, scalars):
    self.written.append((step, dict(scalars)))


def test_write_calls_write_scalars_once_with_the_flat_values(results):
  writer = MemoryWriter()
  results[1].write(writer, step=1200)
  assert writer.written == [(1200, results[1].scalars())]
  with pytest.raises(ValueError, match="writer must have write_scalars"):
    results[1].write(object(), 0)
  with pytest.raises(ValueError, match="step must be an int >= 0"):
    results[1].write(writer, -1)


def test_write_to_clus_summary_writer_reads_back_from_tensorboard(results, tmp_path):
  from clu import metric_writers
  from tensorboard.backend.event_processing import event_accumulator

  writer = metric_writers.SummaryWriter(str(tmp_path))
  for step, result in zip((100, 200, 300), results):
    result.write(writer, step)
  writer.flush()
  writer.close()
  events = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
  events.Reload()
  for key in ("accuracy", "mse", "f1/2", "confusion/1/0"):
    read = [(e.step, float(np.asarray(_tensor(e)))) for e in events.Tensors(key)]
    expected = [(s, r.scalars()[key]) for s, r in zip((100, 200, 300), results)]
    np.testing.assert_allclose(np.array(read), np.array(expected), rtol=1e-6)
  truth = references(WEIGHTS[2])
  np.testing.assert_allclose(float(_tensor(events.Tensors("accuracy")[-1])), truth["accuracy"])


def _tensor(event):
  from tensorboard.util import tensor_util

  return tensor_util.make_ndarray(event.tensor_proto)


def test_best_picks_the_checkpoint_by_the_metrics_direction(results):
  truth = [references(w) for w in WEIGHTS]
  assert pe.best(results, "accuracy") == int(np.argmax([t["accuracy"] for t in truth]))
  assert pe.best(results, "mse") == int(np.argmin([t["mse"] for t in truth]))
  assert pe.best(results, "f1/1") == int(np.argmax([t["f1"][1] for t in truth]))
  by_step = dict(zip((100, 200, 300), results))
  assert pe.best(by_step, "mse") == (100, 200, 300)[int(np.argmin([t["mse"] for t in truth]))]
  assert pe.best(results, "mse", higher_is_better=True) == int(np.argmax([t["mse"] for t in truth]))


def test_best_refuses_what_it_cannot_rank(results):
  with pytest.raises(ValueError, match="direction of 'confusion/0/0' is not known"):
    pe.best(results, "confusion/0/0")
  with pytest.raises(ValueError, match="has no value 'auroc'"):
    pe.best(results, "auroc")
  with pytest.raises(ValueError, match="results is empty"):
    pe.best([], "accuracy")
  nan = pe.EvalResults({"accuracy": float("nan")})
  assert (
    pe.best([nan, {"accuracy": 0.5}, {"accuracy": 0.7}], "accuracy", higher_is_better=True) == 2
  )
  with pytest.raises(ValueError, match="every result's 'accuracy' is NaN"):
    pe.best([nan], "accuracy", higher_is_better=True)
  with pytest.raises(ValueError, match="direction of 'accuracy' is not known"):
    pe.best([{"accuracy": 0.5}], "accuracy")  # values alone: no metric to ask


def test_direction_of_a_key_follows_the_member_that_logs_it():
  collection = pe.LossesAndMetrics(
    metrics={"group": [pe.metrics.Accuracy()], "boot": pe.metrics.Bootstrap(pe.metrics.MAE(), 3)},
    losses=[pe.losses.Crossentropy()],
  )
  direction = pe.results.direction_of
  assert direction(collection, "loss") is False
  assert direction(collection, "crossentropy") is False
  assert direction(collection, "group/accuracy") is True
  assert direction(collection, "boot_low") is False and direction(collection, "boot") is False
  assert direction(collection, "num_examples") is None


def test_direction_of_a_renamed_or_nested_key():
  """A metric whose key collides with a loss is logged as ``crossentropy2`` (`unique_name`):
  ``crossentropy`` is the loss's (lower is better), ``crossentropy2`` the metric's; a nested
  ``LossesAndMetrics`` logs its ``"loss"`` under its key, still lower is better. Each key is
  read from the collection's own ``compute_logs``, so the test follows what is logged."""
  both = pe.LossesAndMetrics(
    metrics={"crossentropy": pe.metrics.Accuracy()}, losses=[pe.losses.Crossentropy()]
  )
  nested = pe.Metrics({"lam": both, "mse": pe.metrics.MSE()})
  logs = nested.compute_logs()
  assert {"lam/loss", "lam/crossentropy", "lam/crossentropy2", "mse"} <= set(logs)
  direction = pe.results.direction_of
  assert direction(both, "crossentropy") is False and direction(both, "crossentropy2") is True
  assert direction(nested, "lam/loss") is False and direction(nested, "lam/crossentropy") is False
  assert direction(nested, "lam/crossentropy2") is True and direction(nested, "mse") is False
  runs = {
    "a": pe.EvalResults({"loss": 0.2, "crossentropy": 0.2, "crossentropy2": 0.9}, metric=both),
    "b": pe.EvalResults({"loss": 2.0, "crossentropy": 2.0, "crossentropy2": 0.1}, metric=both),
  }
  assert pe.best(runs, "crossentropy") == "a" and pe.best(runs, "crossentropy2") == "a"
  nested_runs = [pe.EvalResults({"lam/loss": v}, metric=nested) for v in (3.0, 1.0, 2.0)]
  assert pe.best(nested_runs, "lam/loss") == 1


def test_write_to_clus_logging_writer(results, caplog):
  from clu import metric_writers

  with caplog.at_level("INFO"):
    results[0].write(metric_writers.LoggingWriter(), 7)
  logged = " ".join(r.getMessage() for r in caplog.records)
  assert "[7]" in logged and "accuracy=" in logged and "confusion/2/1=" in logged
