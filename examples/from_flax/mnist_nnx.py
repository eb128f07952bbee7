"""Flax's mnist example (nnx) converted to padded_eval.

Today's example batches the test split with ``drop_remainder=True`` and feeds an
``nnx.MultiMetric(accuracy=Accuracy(), loss=Average("loss"))`` the batch-mean loss from an
``nnx.jit`` eval step. The conversion keeps the model, the tf.data pipeline (without
``drop_remainder``) and ``model.eval()``, returns the per-example loss, and passes the nnx
Module itself as ``params`` to ``pe.masked_eval``.
"""

import numpy as np
import optax
import tensorflow as tf
from flax import nnx

import padded_eval as pe
from examples.from_flax import common

BATCH_SIZE = 128
IMAGE_SHAPE = (8, 8, 1)  # a tiny stand-in for 28 x 28 digits
NUM_CLASSES = 10


class TinyCNN(nnx.Module):
  """A stand-in for the example's CNN: linear, batch norm, relu, dropout, linear."""

  def __init__(self, rngs: nnx.Rngs):
    self.linear1 = nnx.Linear(int(np.prod(IMAGE_SHAPE)), 16, rngs=rngs)
    self.batch_norm = nnx.BatchNorm(16, rngs=rngs)
    self.dropout = nnx.Dropout(rate=0.25)
    self.linear2 = nnx.Linear(16, NUM_CLASSES, rngs=rngs)

  def __call__(self, x, rngs: nnx.Rngs | None = None):
    x = x.reshape(x.shape[0], -1)
    x = nnx.relu(self.batch_norm(self.linear1(x)))
    return self.linear2(self.dropout(x, rngs=rngs))


def make_model(seed: int = 0) -> TinyCNN:
  """A TinyCNN with non-trivial batch-norm statistics (so that eval mode matters)."""
  model = TinyCNN(nnx.Rngs(seed))
  rng = np.random.default_rng(seed)
  model.batch_norm.mean[...] = rng.normal(size=16).astype(np.float32)
  model.batch_norm.var[...] = rng.uniform(0.5, 2.0, size=16).astype(np.float32)
  return model


def make_test_split(num_rows: int = common.NUM_ROWS, seed: int = 1) -> dict[str, np.ndarray]:
  """The offline test split: uint8 images and int64 labels, like tfds mnist."""
  rng = np.random.default_rng(seed)
  return {
    "image": rng.integers(0, 256, size=(num_rows, *IMAGE_SHAPE), dtype=np.uint8),
    "label": rng.integers(0, NUM_CLASSES, size=num_rows).astype(np.int64),
  }


def normalize(sample):
  """Scales the uint8 image to [0, 1] floats, as the example's map does."""
  return {"image": tf.cast(sample["image"], tf.float32) / 255, "label": sample["label"]}


# --- before: today's example -------------------------------------------------------------------
ORIGINAL_TRACES = common.TraceCounter()


def original_test_ds(split, batch_size):
  """The example's test pipeline: normalized, batched with drop_remainder=True."""
  ds = tf.data.Dataset.from_tensor_slices(split).map(normalize)
  return ds.batch(batch_size, drop_remainder=True).prefetch(1)


@nnx.jit
@ORIGINAL_TRACES
def original_eval_step(model, metrics, batch):
  """The example's step: updates the MultiMetric in place with the batch-mean loss."""
  logits = model(batch["image"])
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
  metrics.update(loss=loss, logits=logits, labels=batch["label"])


def original_eval(model, split, batch_size=BATCH_SIZE):
  """The example's loop; returns (metrics, rows seen)."""
  metrics = nnx.MultiMetric(accuracy=nnx.metrics.Accuracy(), loss=nnx.metrics.Average("loss"))
  model.eval()
  rows = 0
  for batch in original_test_ds(split, batch_size).as_numpy_iterator():
    original_eval_step(model, metrics, batch)
    rows += len(batch["label"])
  return metrics.compute(), rows


# --- after: padded_eval ------------------------------------------------------------------------
CONVERTED_TRACES = common.TraceCounter()
METRICS = pe.Metrics({"accuracy": pe.metrics.Accuracy(), "loss": pe.metrics.Mean("loss")})


def converted_test_ds(split, batch_size):
  """The same pipeline without drop_remainder."""
  ds = tf.data.Dataset.from_tensor_slices(split).map(normalize)
  return ds.batch(batch_size).prefetch(1)


@CONVERTED_TRACES
def converted_eval_step(model, batch):
  """Masked per-example statistics of one batch (a Metric, no in-place update)."""
  logits = model(batch["image"])
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
  return METRICS.batch_updates(preds=logits, target=batch["label"], loss=loss, mask=batch["mask"])


def converted_eval(model, split, batch_size=BATCH_SIZE, backend="jit", mesh=None):
  """Every row, exactly, with the nnx Module as params; returns (metrics, rows). ``mesh``: the
  devices (default: all; the original runs on one, ``benchmarks/bench_from_flax.py`` times both)."""
  model.eval()
  batches = pe.pad_batches(converted_test_ds(split, batch_size), batch_size)
  results = pe.masked_eval(converted_eval_step, model, batches, backend=backend, mesh=mesh)
  rows = results.pop("num_examples")
  return results, rows


# --- float64 reference -------------------------------------------------------------------------
def reference(model: TinyCNN, split: dict[str, np.ndarray]) -> tuple[dict[str, float], int]:
  """Accuracy and mean cross entropy over every row, in numpy float64 (eval-mode batch norm).

  Args:
    model: the model.
    split: the test split of `make_test_split`.

  Returns:
    ``({"accuracy", "loss"}, rows)``.
  """

  def f64(variable):
    return np.asarray(variable[...], np.float64)

  x = split["image"].reshape(len(split["image"]), -1).astype(np.float64) / 255
  hidden = x @ f64(model.linear1.kernel) + f64(model.linear1.bias)
  norm = model.batch_norm
  hidden = (hidden - f64(norm.mean)) / np.sqrt(f64(norm.var) + norm.epsilon)
  hidden = np.maximum(hidden * f64(norm.scale) + f64(norm.bias), 0)
  logits = hidden @ f64(model.linear2.kernel) + f64(model.linear2.bias)
  nll, hit = common.token_statistics64(logits, split["label"])
  return {"accuracy": hit.mean(), "loss": nll.mean()}, len(nll)


ORIGINAL = (original_test_ds, original_eval_step, original_eval)
CONVERTED = (converted_test_ds, converted_eval_step, converted_eval)


def make_inputs() -> tuple[TinyCNN, dict]:
  """``(model, test split)``: the arguments of every eval function here."""
  return make_model(), make_test_split()
