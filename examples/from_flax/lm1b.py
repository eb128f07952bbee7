"""Flax's lm1b example (linen, jit over a mesh) converted to padded_eval.

Today's eval pipeline filters sentences longer than ``max_eval_target_length``, pads them with
``padded_batch(..., padded_shapes=max_length, drop_remainder=True)``; ``evaluate`` runs a
``jax.jit(eval_step, in_shardings=(params, data_sharding), static_argnums=...)`` that returns
token sums and a ``denominator`` for ``num_eval_steps`` batches, divides once, and reports
``exp(loss)`` clipped at 1e4 as the perplexity. The sums are right, but the last partial batch is
dropped. The conversion batches with ``drop_remainder=False``, builds the step with
``functools.partial(eval_step, config=...)`` per call, lets ``pe.masked_eval(...,
backend="jit", mesh=mesh)`` split the rows over the mesh's ``'data'`` axis, and keeps the
example's ``clip(exp(loss), max=1e4)`` line, which now reads the exact loss (as the HOWTO's
patch of the real file does).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tensorflow as tf
from flax import linen as nn
from flax.training import common_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import padded_eval as pe
from examples.from_flax import common

BATCH_SIZE = 64  # eval_per_device_batch_size 8 x 8 devices


@dataclasses.dataclass(frozen=True)
class LMConfig:
  """The part of the example's ``TransformerConfig`` the stand-in needs (hashable: static)."""

  vocab_size: int = 24
  emb_dim: int = 8
  max_eval_target_length: int = 16
  deterministic: bool = True


class TinyLM(nn.Module):
  """A stand-in for ``TransformerLM``: shift the inputs right, embed, project to the vocabulary."""

  config: LMConfig

  @nn.compact
  def __call__(self, inputs):
    shifted = jnp.pad(inputs, [(0, 0), (1, 0)])[:, :-1]  # the decoder's shift_right
    embedded = nn.Embed(self.config.vocab_size, self.config.emb_dim)(shifted)
    return nn.Dense(self.config.vocab_size)(embedded)


def make_mesh() -> Mesh:
  """A ``('data', 'tensor')`` mesh of the local devices, 2 along ``'tensor'``."""
  return Mesh(np.array(jax.devices()).reshape(-1, 2), ("data", "tensor"))


def make_inputs(seed: int = 3) -> tuple:
  """``(params, sentences, config, mesh)``: the arguments of every eval function here.

  The sentences have 1 to 20 tokens; the length filter keeps those of at most 16.
  """
  config = LMConfig()
  sentences = common.variable_length_rows(np.random.default_rng(seed), common.NUM_ROWS, 1, 20, 24)
  params = TinyLM(config).init(jax.random.key(seed), jnp.zeros((1, 4), jnp.int32))["params"]
  return params, sentences, config, make_mesh()


def eval_dataset(sentences, max_length):
  """Tokenized sentences, without those longer than max_length."""
  ds = common.tf_sequences([{"inputs": s} for s in sentences])
  return ds.filter(lambda x: tf.shape(x["inputs"])[0] < max_length + 1)


# --- before: today's example -------------------------------------------------------------------
ORIGINAL_TRACES = common.TraceCounter()


def original_eval_pipeline(sentences, batch_size, max_length):
  """The example's eval pipeline: padded_batch to max_length, drop_remainder=True."""
  ds = eval_dataset(sentences, max_length)
  ds = ds.padded_batch(batch_size, padded_shapes={"inputs": max_length}, drop_remainder=True)
  return ds.prefetch(tf.data.AUTOTUNE)


@ORIGINAL_TRACES
def original_eval_step(params, batch, config):
  """The example's step: token sums of loss and accuracy, and their denominator."""
  inputs = batch["inputs"]
  weights = jnp.where(inputs > 0, 1.0, 0.0)
  logits = TinyLM(config).apply({"params": params}, inputs)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, inputs) * weights
  accuracy = (jnp.argmax(logits, -1) == inputs) * weights
  return {"loss": loss.sum(), "accuracy": accuracy.sum(), "denominator": weights.sum()}


def original_eval(params, sentences, config, mesh, num_eval_steps=1_000):
  """The example's evaluate: num_eval_steps jitted steps, summed, divided once."""
  eval_ds = original_eval_pipeline(sentences, BATCH_SIZE, config.max_eval_target_length)
  data_sharding = NamedSharding(mesh, P("data"))
  jit_eval_step = jax.jit(
    original_eval_step,
    in_shardings=(NamedSharding(mesh, P()), data_sharding),
    out_shardings=None,
    static_argnums=(2,),
  )
  eval_metrics = []
  for _, eval_batch in zip(range(num_eval_steps), iter(eval_ds)):
    eval_batch = jax.tree.map(lambda x: x.numpy(), eval_batch)
    eval_metrics.append(jit_eval_step(params, eval_batch, config))
  rows = len(eval_metrics) * BATCH_SIZE
  eval_metrics = common_utils.stack_forest(eval_metrics)
  eval_metrics_sums = jax.tree.map(jnp.sum, eval_metrics)
  eval_denominator = eval_metrics_sums.pop("denominator")
  eval_summary = jax.tree.map(lambda x: x / eval_denominator, eval_metrics_sums)
  eval_summary["perplexity"] = jnp.clip(jnp.exp(eval_summary["loss"]), max=1.0e4)
  return eval_summary, rows


# --- after: padded_eval ------------------------------------------------------------------------
CONVERTED_TRACES = common.TraceCounter()
METRICS = pe.Metrics({"loss": pe.metrics.Mean("token_loss"), "accuracy": pe.metrics.Accuracy()})


def converted_eval_pipeline(sentences, batch_size, max_length):
  """The same pipeline without drop_remainder."""
  ds = eval_dataset(sentences, max_length)
  ds = ds.padded_batch(batch_size, padded_shapes={"inputs": max_length})
  return ds.prefetch(tf.data.AUTOTUNE)


@CONVERTED_TRACES
def converted_eval_step(params, batch, config):
  """Masked token statistics of one batch: real sentence and real token."""
  inputs = batch["inputs"]
  tokens = batch["mask"][:, None] & (inputs > 0)
  logits = TinyLM(config).apply({"params": params}, inputs)
  token_loss = optax.softmax_cross_entropy_with_integer_labels(logits, inputs)
  return METRICS.batch_updates(preds=logits, target=inputs, token_loss=token_loss, mask=tokens)


def converted_eval(params, sentences, config, mesh, backend="jit"):
  """Every kept sentence, exactly, jit over the mesh; returns (metrics, rows)."""
  eval_ds = converted_eval_pipeline(sentences, BATCH_SIZE, config.max_eval_target_length)
  batches = pe.pad_batches(eval_ds, BATCH_SIZE)
  step = functools.partial(converted_eval_step, config=config)
  results = pe.masked_eval(step, params, batches, backend=backend, mesh=mesh)
  rows = results.pop("num_examples")
  # the example's own (clipped) perplexity line stays, as in the HOWTO: it reads the exact loss
  results["perplexity"] = jnp.clip(jnp.exp(results["loss"]), max=1.0e4)
  return results, rows


# --- float64 reference -------------------------------------------------------------------------
def reference(params, sentences, config, mesh=None) -> tuple[dict[str, float], int]:
  """Token loss, accuracy and perplexity over every sentence the filter keeps, numpy float64.

  Args:
    params: the model's params.
    sentences: int token arrays.
    config: the `LMConfig`.
    mesh: unused (the eval functions' signature).

  Returns:
    ``({"loss", "accuracy", "perplexity"}, rows)``.
  """
  del mesh
  kept = [s for s in sentences if len(s) <= config.max_eval_target_length]
  inputs = np.stack([np.pad(s, (0, config.max_eval_target_length - len(s))) for s in kept])
  shifted = np.pad(inputs, [(0, 0), (1, 0)])[:, :-1]
  table = np.asarray(params["Embed_0"]["embedding"], np.float64)
  dense = params["Dense_0"]
  logits = table[shifted] @ np.asarray(dense["kernel"], np.float64) + np.asarray(dense["bias"])
  nll, hit = common.token_statistics64(logits, inputs)
  real = inputs > 0
  loss = nll[real].mean()
  return {"loss": loss, "accuracy": hit[real].mean(), "perplexity": np.exp(loss)}, len(kept)


ORIGINAL = (original_eval_pipeline, original_eval_step, original_eval)
CONVERTED = (converted_eval_pipeline, converted_eval_step, converted_eval)
