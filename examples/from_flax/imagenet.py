"""Flax's imagenet example (linen, pmap) converted to padded_eval.

Today's ``create_split`` batches the validation split with ``drop_remainder=True`` and then
``.repeat()``s it; ``prepare_tf_data`` reshapes each batch to ``[devices, per_device, ...]``,
``jax_utils.prefetch_to_device`` moves it, and ``steps_per_eval = num_validation // batch_size``
steps of a pmapped ``eval_step`` (``lax.pmean`` of batch means) are averaged on the host. The
conversion batches without ``drop_remainder`` and without ``.repeat()``, replaces
``prepare_tf_data`` / ``prefetch_to_device`` / ``steps_per_eval`` by ``pe.pad_batches`` and
``pe.masked_eval`` (backend ``"pmap"``, params passed unreplicated as with ``in_axes=None``),
and returns per-example losses instead of ``pmean``-ed batch means.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tensorflow as tf
from flax import jax_utils
from flax import linen as nn
from flax.training import common_utils

import padded_eval as pe
from examples.from_flax import common

BATCH_SIZE = 128  # per host; a multiple of the 8 local devices
IMAGE_SHAPE = (4, 4, 3)
NUM_CLASSES = 10
MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)


class TinyResNet(nn.Module):
  """A stand-in for ResNet50: dense, batch norm (``batch_stats``), relu, dense."""

  @nn.compact
  def __call__(self, x, train: bool = True):
    x = nn.Dense(16, use_bias=False)(x.reshape(x.shape[0], -1))
    x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(x))
    return nn.Dense(NUM_CLASSES)(x)


MODEL = TinyResNet()


def make_variables(seed: int = 0) -> dict:
  """``{"params", "batch_stats"}`` with non-trivial running statistics."""
  variables = MODEL.init(jax.random.key(seed), jnp.zeros((1, *IMAGE_SHAPE)), train=False)
  rng = np.random.default_rng(seed)
  stats = {"mean": rng.normal(size=16), "var": rng.uniform(0.5, 2.0, size=16)}
  batch_norm = {k: v.astype(np.float32) for k, v in stats.items()}
  return {"params": variables["params"], "batch_stats": {"BatchNorm_0": batch_norm}}


def make_validation_split(num_rows: int = common.NUM_ROWS, seed: int = 2) -> dict:
  """The offline validation split: uint8 images (decoded already) and int64 labels."""
  rng = np.random.default_rng(seed)
  return {
    "image": rng.integers(0, 256, size=(num_rows, *IMAGE_SHAPE), dtype=np.uint8),
    "label": rng.integers(0, NUM_CLASSES, size=num_rows).astype(np.int64),
  }


def decode_example(example):  # preprocess_for_eval: cast and normalize
  """The eval preprocessing stand-in: float image normalized per channel."""
  image = (tf.cast(example["image"], tf.float32) - MEAN_RGB) / STDDEV_RGB
  return {"image": image, "label": example["label"]}


# --- before: today's example -------------------------------------------------------------------
ORIGINAL_TRACES = common.TraceCounter()


def original_create_split(split, batch_size, prefetch=10):
  """The example's create_split(train=False): n // hosts rows, drop_remainder, repeat."""
  split_size = len(split["label"]) // jax.process_count()
  start = jax.process_index() * split_size
  ds = tf.data.Dataset.from_tensor_slices(
    {k: v[start : start + split_size] for k, v in split.items()}
  )
  ds = ds.map(decode_example, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(batch_size, drop_remainder=True)
  ds = ds.repeat()
  return ds.prefetch(prefetch)


def prepare_tf_data(xs):
  """The example's reshape of a host batch to [local devices, per device, ...]."""
  local_device_count = jax.local_device_count()

  def _prepare(x):
    x = x.numpy()
    return x.reshape((local_device_count, -1) + x.shape[1:])

  return jax.tree.map(_prepare, xs)


def original_create_input_iter(split, batch_size):
  """The example's eval iterator: prepare_tf_data, then prefetch_to_device."""
  it = map(prepare_tf_data, original_create_split(split, batch_size))
  return jax_utils.prefetch_to_device(it, 2)


@ORIGINAL_TRACES
def original_eval_step(variables, batch):
  """The example's step: pmean of the batch-mean loss and accuracy."""
  logits = MODEL.apply(variables, batch["image"], train=False, mutable=False)
  one_hot = common_utils.onehot(batch["label"], num_classes=NUM_CLASSES)
  metrics = {
    "loss": jnp.mean(optax.softmax_cross_entropy(logits=logits, labels=one_hot)),
    "accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"]),
  }
  return jax.lax.pmean(metrics, axis_name="batch")


def original_eval(variables, split, batch_size=BATCH_SIZE):
  """The example's loop: steps_per_eval pmapped steps, averaged; returns (metrics, rows)."""
  eval_iter = original_create_input_iter(split, batch_size)
  steps_per_eval = len(split["label"]) // batch_size
  p_eval_step = jax.pmap(original_eval_step, in_axes=(None, 0), axis_name="batch")
  eval_metrics = []
  for _ in range(steps_per_eval):
    eval_metrics.append(p_eval_step(variables, next(eval_iter)))
  eval_metrics = common_utils.get_metrics(eval_metrics)
  summary = jax.tree.map(lambda x: x.mean(), eval_metrics)
  return summary, steps_per_eval * batch_size


# --- after: padded_eval ------------------------------------------------------------------------
CONVERTED_TRACES = common.TraceCounter()
METRICS = pe.Metrics({"accuracy": pe.metrics.Accuracy(), "loss": pe.metrics.Mean("loss")})


def converted_create_split(split, batch_size, prefetch=10):
  """The eval split of this process, batched without drop_remainder or repeat."""
  share = pe.process_slice(len(split["label"]))
  ds = tf.data.Dataset.from_tensor_slices({k: v[share] for k, v in split.items()})
  ds = ds.map(decode_example, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(batch_size)
  return ds.prefetch(prefetch)


@CONVERTED_TRACES
def converted_eval_step(variables, batch):
  """Masked per-example statistics of one device's rows."""
  logits = MODEL.apply(variables, batch["image"], train=False, mutable=False)
  one_hot = common_utils.onehot(batch["label"], num_classes=NUM_CLASSES)
  loss = optax.softmax_cross_entropy(logits=logits, labels=one_hot)
  return METRICS.batch_updates(preds=logits, target=batch["label"], loss=loss, mask=batch["mask"])


def converted_eval(variables, split, batch_size=BATCH_SIZE, backend="pmap"):
  """Every row, exactly, on the pmap backend; returns (metrics, rows)."""
  batches = pe.pad_batches(converted_create_split(split, batch_size), batch_size)
  results = pe.masked_eval(converted_eval_step, variables, batches, backend=backend)
  rows = results.pop("num_examples")
  return results, rows


# --- float64 reference -------------------------------------------------------------------------
def reference(variables: dict, split: dict) -> tuple[dict[str, float], int]:
  """Accuracy and mean cross entropy over every row, numpy float64, eval-mode batch norm.

  Args:
    variables: ``{"params", "batch_stats"}`` of `make_variables`.
    split: the split of `make_validation_split`.

  Returns:
    ``({"accuracy", "loss"}, rows)``.
  """
  f64 = functools.partial(np.asarray, dtype=np.float64)
  params, stats = variables["params"], variables["batch_stats"]["BatchNorm_0"]
  image = (split["image"].astype(np.float64) - MEAN_RGB) / STDDEV_RGB
  hidden = image.reshape(len(image), -1) @ f64(params["Dense_0"]["kernel"])
  hidden = (hidden - f64(stats["mean"])) / np.sqrt(f64(stats["var"]) + 1e-5)
  hidden = hidden * f64(params["BatchNorm_0"]["scale"]) + f64(params["BatchNorm_0"]["bias"])
  logits = np.maximum(hidden, 0) @ f64(params["Dense_1"]["kernel"]) + f64(params["Dense_1"]["bias"])
  nll, hit = common.token_statistics64(logits, split["label"])
  return {"accuracy": hit.mean(), "loss": nll.mean()}, len(nll)


ORIGINAL = (original_create_split, prepare_tf_data, original_create_input_iter)
ORIGINAL += (original_eval_step, original_eval)
CONVERTED = (converted_create_split, converted_eval_step, converted_eval)


def make_inputs() -> tuple[dict, dict]:
  """``(variables, validation split)``: the arguments of every eval function here."""
  return make_variables(), make_validation_split()
