"""Flax's gemma example (nnx, grain, jit over an ``('fsdp', 'tensor')`` mesh) converted.

Today's eval pipeline (``input_pipeline_grain.preprocess_data``) filters long sentences, turns the
``MapDataset`` into an ``IterDataset``, pads every row to ``max_eval_target_length`` and batches
with ``drop_remainder=True``, shifts the targets left and moves each batch onto the mesh. Its
``eval_step`` feeds an ``nnx.MultiMetric(loss=Average("loss"), accuracy=Accuracy())`` with
``loss_per_sample`` (each row's token-loss sum scaled by ``batch / batch_tokens``, so that a
batch's mean is its token mean) and the token accuracy under ``mask={"accuracy": inputs >
pad_id}``; ``evaluate`` runs ``num_eval_steps`` batches. So the loss is a mean of per-batch token
means and the last partial batch is dropped. The conversion batches with
``drop_remainder=False``, drops the move to the devices, and passes the nnx model as ``params``
to ``pe.masked_eval(..., backend="jit", mesh=mesh)``.
"""

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import padded_eval as pe
from examples.from_flax import common

PAD_ID = 0
VOCAB_SIZE = 24
MAX_EVAL_TARGET_LENGTH = 16
EVAL_BATCH_SIZE = 64  # eval_per_device_batch_size 8 x 8 devices


class TinyTransformer(nnx.Module):
  """A stand-in for the Gemma transformer: embed, then project back to the vocabulary."""

  def __init__(self, rngs: nnx.Rngs):
    self.embedder = nnx.Embed(VOCAB_SIZE, 8, rngs=rngs)
    self.unembed = nnx.Linear(8, VOCAB_SIZE, rngs=rngs)

  def __call__(self, inputs):
    return self.unembed(self.embedder(inputs))


def make_mesh() -> Mesh:
  """The example's ``('fsdp', 'tensor')`` mesh of the local devices, 2 along ``'tensor'``."""
  return Mesh(np.array(jax.devices()).reshape(-1, 2), ("fsdp", "tensor"))


def make_inputs(seed: int = 5) -> tuple:
  """``(model, texts, mesh)``: token arrays of 2 to 20 tokens; the filter keeps those of <= 16."""
  rng = np.random.default_rng(seed)
  texts = common.variable_length_rows(rng, common.NUM_ROWS, 2, 20, VOCAB_SIZE)
  return TinyTransformer(nnx.Rngs(seed)), texts, make_mesh()


def pad_tokens(tokens):
  """Pads one row's tokens to MAX_EVAL_TARGET_LENGTH with PAD_ID."""
  return np.pad(tokens, (0, MAX_EVAL_TARGET_LENGTH - len(tokens)), constant_values=PAD_ID)


def shift_target_left(batch):
  """The example's teacher-forcing shift: targets[t] = inputs[t + 1]."""
  targets = np.pad(batch["targets"][..., 1:], [(0, 0), (0, 1)], constant_values=PAD_ID)
  return dict(batch, targets=targets)


def eval_dataset(texts):
  """The texts as a grain MapDataset, without those longer than the eval length."""
  ds = grain.MapDataset.source([{"inputs": t, "targets": t} for t in texts])
  return ds.filter(lambda x: max(len(x["inputs"]), len(x["targets"])) <= MAX_EVAL_TARGET_LENGTH)


# --- before: today's example -------------------------------------------------------------------
ORIGINAL_TRACES = common.TraceCounter()


def original_preprocess_data(texts, batch_size, data_sharding):
  """The example's eval pipeline: pad, batch with drop_remainder=True, shift, move."""
  ds = eval_dataset(texts).to_iter_dataset()
  ds = ds.map(lambda x: {k: pad_tokens(v) for k, v in x.items()})
  ds = ds.batch(batch_size, drop_remainder=True)
  ds = ds.map(shift_target_left)
  return ds.map(lambda x: jax.device_put(x, data_sharding))


@ORIGINAL_TRACES
def original_eval_step(model, batch, eval_metrics, pad_id=PAD_ID):
  """The example's step: a MultiMetric of per-sample losses scaled to the token mean."""
  inputs, targets = batch["inputs"], batch["targets"]
  input_mask = inputs > pad_id
  weights = input_mask.astype(jnp.float32)
  logits = model(inputs)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets) * weights
  loss_per_sample = loss.sum(axis=1) * len(loss) / weights.sum()
  eval_metrics.update(
    loss=loss_per_sample, logits=logits, labels=targets, mask={"accuracy": input_mask}
  )
  return eval_metrics


def original_eval(model, texts, mesh, num_eval_steps=2_000):
  """The example's evaluate: num_eval_steps jitted steps; returns (metrics, rows)."""
  data_sharding = NamedSharding(mesh, P("fsdp"))
  eval_ds = original_preprocess_data(texts, EVAL_BATCH_SIZE, data_sharding)
  jit_eval_step = jax.jit(original_eval_step, static_argnames=("pad_id",))
  eval_metrics = nnx.MultiMetric(loss=nnx.metrics.Average("loss"), accuracy=nnx.metrics.Accuracy())
  rows = 0
  for _, eval_batch in zip(range(num_eval_steps), iter(eval_ds)):
    eval_metrics = jit_eval_step(model, eval_batch, eval_metrics)
    rows += len(eval_batch["inputs"])
  result = eval_metrics.compute()
  result["perplexity"] = jnp.clip(jnp.exp(result["loss"]), max=1.0e4)
  return result, rows


# --- after: padded_eval ------------------------------------------------------------------------
CONVERTED_TRACES = common.TraceCounter()
METRICS = pe.Metrics({"loss": pe.metrics.Mean("token_loss"), "accuracy": pe.metrics.Accuracy()})


def converted_preprocess_data(texts, batch_size):
  """The same pipeline without drop_remainder and without the move."""
  ds = eval_dataset(texts).to_iter_dataset()
  ds = ds.map(lambda x: {k: pad_tokens(v) for k, v in x.items()})
  ds = ds.batch(batch_size, drop_remainder=False)
  return ds.map(shift_target_left)


@CONVERTED_TRACES
def converted_eval_step(model, batch, pad_id=PAD_ID):
  """Masked token statistics of one batch: real row and real token."""
  inputs, targets = batch["inputs"], batch["targets"]
  tokens = batch["mask"][:, None] & (inputs > pad_id)
  logits = model(inputs)
  token_loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return METRICS.batch_updates(preds=logits, target=targets, token_loss=token_loss, mask=tokens)


def converted_eval(model, texts, mesh, backend="jit"):
  """Every kept text, exactly, jit over the mesh, nnx model as params."""
  batches = pe.pad_batches(converted_preprocess_data(texts, EVAL_BATCH_SIZE), EVAL_BATCH_SIZE)
  results = pe.masked_eval(converted_eval_step, model, batches, backend=backend, mesh=mesh)
  rows = results.pop("num_examples")
  # the example's own (clipped) perplexity line stays, as in the HOWTO: it reads the exact loss
  results["perplexity"] = jnp.clip(jnp.exp(results["loss"]), max=1.0e4)
  return results, rows


# --- float64 reference -------------------------------------------------------------------------
def reference(model: TinyTransformer, texts, mesh=None) -> tuple[dict[str, float], int]:
  """Token loss, accuracy and perplexity over every text the filter keeps, numpy float64.

  Args:
    model: the model.
    texts: int token arrays.
    mesh: unused (the eval functions' signature).

  Returns:
    ``({"loss", "accuracy", "perplexity"}, rows)``.
  """
  del mesh
  kept = [t for t in texts if len(t) <= MAX_EVAL_TARGET_LENGTH]
  inputs = np.stack([pad_tokens(t) for t in kept])
  targets = np.pad(inputs[:, 1:], [(0, 0), (0, 1)], constant_values=PAD_ID)
  table = np.asarray(model.embedder.embedding[...], np.float64)
  kernel = np.asarray(model.unembed.kernel[...], np.float64)
  logits = table[inputs] @ kernel + np.asarray(model.unembed.bias[...], np.float64)
  nll, hit = common.token_statistics64(logits, targets)
  real = inputs > PAD_ID
  loss = nll[real].mean()
  return {"loss": loss, "accuracy": hit[real].mean(), "perplexity": np.exp(loss)}, len(kept)


ORIGINAL = (original_preprocess_data, original_eval_step, original_eval)
CONVERTED = (converted_preprocess_data, converted_eval_step, converted_eval)
