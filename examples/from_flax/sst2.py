"""Flax's sst2 example (linen, one-device jit) converted to padded_eval.

Today's eval batches are ``padded_batch(batch_size, padded_shapes={"token_ids": [None], ...})``:
each batch is padded to its own longest sentence (its training batches are the bucketed ones),
so ``jax.jit(eval_step)`` compiles once per distinct longest length, and once more for the short
last batch. Its statistics are right: per-batch sums and ``count = logits.shape[0]``, divided
once. The conversion uses the pipeline's own ``fixed_pad_length`` (``padded_shapes["token_ids"]
= fixed_pad_length``), so every batch has one shape, and ``pe.pad_batches`` pads the last batch.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

import padded_eval as pe
from examples.from_flax import common

BATCH_SIZE = 64
VOCAB_SIZE = 40
BOS, EOS = 1, 2
MAX_WORDS = 41
FIXED_PAD_LENGTH = 48  # at least the longest sentence (41 words) plus BOS and EOS
PADDED_SHAPES = {"idx": [], "token_ids": [None], "label": [], "length": []}


class TinyTextClassifier(nn.Module):
  """A stand-in for ``TextClassifier``: embed, average the real tokens, one logit."""

  @nn.compact
  def __call__(self, token_ids, lengths, deterministic: bool = True):
    embedded = nn.Embed(VOCAB_SIZE, 8)(token_ids)
    real = jnp.arange(token_ids.shape[1]) < lengths[:, None]
    pooled = jnp.sum(jnp.where(real[..., None], embedded, 0), axis=1) / lengths[:, None]
    return nn.Dense(1)(pooled)  # [B, 1]


MODEL = TinyTextClassifier()


def make_inputs(seed: int = 4) -> tuple[dict, list[dict]]:
  """``(params, examples)``: sentences of 1 to 41 words (about 13 on average, a long tail like
  sst2's), with BOS and EOS, and 0/1 labels."""
  rng = np.random.default_rng(seed)
  lengths = 1 + rng.binomial(MAX_WORDS - 1, 0.3, size=common.NUM_ROWS)
  examples = []
  for index, length in enumerate(lengths):
    sentence = rng.integers(3, VOCAB_SIZE, size=length)
    token_ids = np.concatenate([[BOS], sentence, [EOS]]).astype(np.int32)
    label = np.int64(rng.integers(0, 2))
    examples.append({"idx": np.int32(index), "token_ids": token_ids, "label": label})
    examples[-1]["length"] = np.int32(len(token_ids))
  params = MODEL.init(jax.random.key(seed), jnp.ones((2, 3), jnp.int32), jnp.ones(2, jnp.int32))
  return params["params"], examples


def sigmoid_cross_entropy(labels, logits):
  """Per-element sigmoid cross entropy of logits against 0/1 labels."""
  return jnp.maximum(logits, 0) - logits * labels + jnp.log1p(jnp.exp(-jnp.abs(logits)))


# --- before: today's example -------------------------------------------------------------------
ORIGINAL_TRACES = common.TraceCounter()


def original_get_batches(examples, batch_size):
  """The example's get_batches: each batch padded to its longest sentence."""
  padded_shapes = dict(PADDED_SHAPES)
  return common.tf_sequences(examples).padded_batch(batch_size, padded_shapes=padded_shapes)


@jax.jit
@ORIGINAL_TRACES
def original_eval_step(params, batch):
  """The example's step: sums of loss and hits, and the batch's row count."""
  logits = MODEL.apply({"params": params}, batch["token_ids"], batch["length"])
  labels = jnp.expand_dims(batch["label"], axis=1)
  loss = sigmoid_cross_entropy(labels, logits)
  accuracy = jnp.equal(logits >= 0.0, labels)
  return {"loss": jnp.sum(loss), "accuracy": jnp.sum(accuracy), "count": logits.shape[0]}


def original_eval(params, examples, batch_size=BATCH_SIZE):
  """The example's evaluate_model: totals divided once; returns (metrics, rows)."""
  batch_metrics = []
  for batch in original_get_batches(examples, batch_size).as_numpy_iterator():
    batch_metrics.append(original_eval_step(params, batch))
  batch_metrics = jax.device_get(batch_metrics)
  total = np.sum([m["count"] for m in batch_metrics])
  total_loss = np.sum([m["loss"] for m in batch_metrics])
  total_accuracy = np.sum([m["accuracy"] for m in batch_metrics])
  return {"loss": total_loss.item() / total, "accuracy": total_accuracy.item() / total}, total


# --- after: padded_eval ------------------------------------------------------------------------
CONVERTED_TRACES = common.TraceCounter()
METRICS = pe.Metrics(
  {"loss": pe.metrics.Mean("loss"), "accuracy": pe.metrics.Accuracy().map_arg(preds="predicted")}
)


def converted_get_batches(examples, batch_size, fixed_pad_length=FIXED_PAD_LENGTH):
  """The same pipeline with the example's fixed_pad_length."""
  padded_shapes = dict(PADDED_SHAPES)
  padded_shapes["token_ids"] = fixed_pad_length
  return common.tf_sequences(examples).padded_batch(batch_size, padded_shapes=padded_shapes)


@CONVERTED_TRACES
def converted_eval_step(params, batch):
  """Masked per-sentence statistics of one batch."""
  logits = MODEL.apply({"params": params}, batch["token_ids"], batch["length"])[:, 0]
  loss = sigmoid_cross_entropy(batch["label"], logits)
  predicted = (logits >= 0.0).astype(jnp.int32)
  return METRICS.batch_updates(
    loss=loss, predicted=predicted, target=batch["label"], mask=batch["mask"]
  )


def converted_eval(params, examples, batch_size=BATCH_SIZE, backend="jit", mesh=None):
  """Every sentence, exactly, one compilation; returns (metrics, rows). ``mesh``: the devices
  (default: all; the original runs on one, ``benchmarks/bench_from_flax.py`` times both)."""
  batches = pe.pad_batches(converted_get_batches(examples, batch_size), batch_size)
  results = pe.masked_eval(converted_eval_step, params, batches, backend=backend, mesh=mesh)
  rows = results.pop("num_examples")
  return results, rows


# --- float64 reference -------------------------------------------------------------------------
def reference(params: dict, examples: list[dict]) -> tuple[dict[str, float], int]:
  """Mean sigmoid cross entropy and accuracy over every sentence, numpy float64.

  Args:
    params: the model's params.
    examples: the examples of `make_inputs`.

  Returns:
    ``({"loss", "accuracy"}, rows)``.
  """
  table = np.asarray(params["Embed_0"]["embedding"], np.float64)
  pooled = np.stack([table[e["token_ids"]].mean(0) for e in examples])
  dense = params["Dense_0"]
  logits = pooled @ np.asarray(dense["kernel"], np.float64)[:, 0] + float(dense["bias"][0])
  labels = np.array([e["label"] for e in examples], np.float64)
  loss = np.logaddexp(0, logits) - logits * labels
  return {"loss": loss.mean(), "accuracy": np.mean((logits >= 0) == labels)}, len(examples)


ORIGINAL = (original_get_batches, original_eval_step, original_eval)
CONVERTED = (converted_get_batches, converted_eval_step, converted_eval)
