"""Flax's wmt example (linen, pmap, beam-search BLEU) converted to padded_eval.

Today's eval pipeline filters sentence pairs longer than ``max_eval_target_length`` and pads them
with ``padded_batch(..., padded_shapes=max_length)``, ``drop_remainder=True``; ``evaluate`` runs
``num_eval_steps`` (20) steps of a ``jax.pmap``-ed ``eval_step`` over ``common_utils.shard``-ed
batches with the replicated params: each returns the token sums of the loss and accuracy and a
``denominator``, ``psum``-ed over the devices, and the host sums them and divides once. The sums
are right, but the last partial batch is dropped. The BLEU part (``translate_and_calculate_bleu``)
is right: its pipeline keeps the last batch, which is padded on the host to a multiple of the
devices by repeating its last row (``pad_examples``); a pmapped predict step decodes each batch,
the host cuts every real row at its first EOS and scores the corpus with Flax's own n-gram counts
(``bleu.py``, summed over the hosts by ``per_host_sum_pmap``). The padded last batch has a shape
of its own, so the predict step compiles twice.

The conversion is the HOWTO's wmt recipe (docs/howto/sequences.md): the eval pipeline without
``drop_remainder``, ``pe.masked_eval`` on the default ``pmap`` backend with the unreplicated
params and ``pe.metrics.Mean("loss")`` / ``pe.metrics.Accuracy()`` under the token mask, and a
second ``pe.masked_eval`` whose step decodes the batch, cuts each row at its first EOS and
returns ``pe.metrics.BLEU(pad_id=0)``'s clipped n-gram counts of the ids. BLEU is reported on the
example's scale, 0 to 100 (``100 * bleu``, as the recipe writes it).

What the re-creation leaves out or changes (the eval plumbing is the point, not the model):

- The model is ``TinyTranslator``: a source embedding added position by position to an embedding
  of the shifted targets (a stand-in for the encoder and the cross attention of a translation
  that keeps the word order), projected to the vocabulary. Its params are set by hand so that it
  translates most words right (see `make_params`), which gives a BLEU far from 0 and 100.
- Greedy decoding in a ``jax.lax.fori_loop`` to a fixed ``max_decode_len`` stands for the beam
  search, with no cache (so no ``p_init_cache``); both loops use the same decode.
- There is no text: a "sentence" is its token ids written as words, up to and including the first
  EOS (``decode_tokens``), where the example detokenizes with sentencepiece (which drops the EOS)
  and tokenizes the text again for BLEU. So both loops score the same ids; the original's BLEU is
  a small host BLEU written the way ``bleu.py`` computes it (orders without a match smoothed),
  one host, so ``per_host_sum_pmap`` is left out (a sum over one host is the identity).
- No label smoothing (the example's eval uses none either), and no exemplars are written.
- The pipelines are built at each call (in both loops), and the params arrive unreplicated:
  the original replicates them once per call (the example's state is replicated once for
  training), ``masked_eval`` once per call of it. The 11 full eval batches are fewer than
  ``num_eval_steps``, so only the last partial batch is lost. The conversion passes the batch
  size to ``pe.pad_batches`` where the HOWTO passes None (see `converted_eval`).

``ORIGINAL_TRACES`` and ``CONVERTED_TRACES`` count the traces of both step functions of their
loop (``EVAL`` / ``PREDICT`` / ``BLEU`` counters count one each): a first call traces the
original's eval step once and its predict step twice, and each converted step once.
"""

import collections
import dataclasses
import functools
import math

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

BATCH_SIZE = 64  # 8 per device x 8 devices (the example's per_device_batch_size is 32)
EOS_ID = 2  # sentencepiece's EOS, which ends every tokenized sentence


@dataclasses.dataclass(frozen=True)
class WMTConfig:
  """The part of the example's config and ``TransformerConfig`` the stand-in needs (hashable)."""

  vocab_size: int = 24
  max_eval_target_length: int = 16
  max_predict_length: int = 16


class TinyTranslator(nn.Module):
  """A stand-in for ``Transformer``: ``encode`` the source, ``decode`` the shifted targets.

  The decoder adds the encoded source at each target position to the embedded previous target
  token and projects the sum to the vocabulary (the embeddings are as wide as the vocabulary).
  """

  config: WMTConfig

  def setup(self):
    width = self.config.vocab_size
    self.source_embed = nn.Embed(self.config.vocab_size, width)
    self.target_embed = nn.Embed(self.config.vocab_size, width)
    self.logits_dense = nn.Dense(self.config.vocab_size)

  def encode(self, inputs):
    """``[B, L]`` source ids -> ``[B, L, width]``."""
    return self.source_embed(inputs)

  def decode(self, encoded, targets):
    """``[B, L, width]`` encoded source, ``[B, L]`` targets -> ``[B, L, vocab]`` logits."""
    shifted = jnp.pad(targets, [(0, 0), (1, 0)])[:, :-1]  # the decoder's shift_right
    return self.logits_dense(encoded + self.target_embed(shifted))

  def __call__(self, inputs, targets):
    return self.decode(self.encode(inputs), targets)


def translation_table(vocab_size: int, seed: int) -> np.ndarray:
  """The word-for-word translation of the toy language: a permutation of the ids ``>= 3``.

  0 (padding), 1 and EOS map to themselves.
  """
  words = np.arange(3, vocab_size)
  return np.concatenate([np.arange(3), np.random.default_rng(seed).permutation(words)])


def make_params(config: WMTConfig, table: np.ndarray, seed: int) -> dict:
  """Hand-set params that translate most words by ``table``.

  The source embedding is ``4 * identity``, the projection maps a source id to its translation
  except for three words (translated as the next id is), and padding to EOS; the bias keeps
  ids 0 and 1 from being predicted; small random target embeddings and a small random projection
  make the logits uneven.
  """
  rng = np.random.default_rng(seed)
  vocab = config.vocab_size
  mapping = np.zeros((vocab, vocab), np.float32)
  mapping[np.arange(vocab), table] = 1.0
  mapping[0] = 0.0
  mapping[0, EOS_ID] = 1.0  # past the source's end, stop
  for word in (5, 11, 17):  # three words the model gets wrong: translated as the next one
    mapping[word] = mapping[word + 1]
  params = {
    "source_embed": {"embedding": 4.0 * np.eye(vocab, dtype=np.float32)},
    "target_embed": {"embedding": 0.5 * rng.standard_normal((vocab, vocab), np.float32)},
    "logits_dense": {
      "kernel": mapping + 0.2 * rng.standard_normal((vocab, vocab), np.float32),
      "bias": np.where(np.arange(vocab) < EOS_ID, -10.0, 0.0).astype(np.float32),
    },
  }
  return jax.tree.map(jnp.asarray, params)


def make_pairs(config: WMTConfig, table: np.ndarray, seed: int) -> list[dict[str, np.ndarray]]:
  """``NUM_ROWS`` sentence pairs: 1 to 20 words, then EOS; the target is the word-for-word
  translation with a fifth of its words replaced by random ones (a looser human translation)."""
  rng = np.random.default_rng(seed)
  sources = common.variable_length_rows(rng, common.NUM_ROWS, 1, 20, config.vocab_size)
  pairs = []
  for words in sources:
    translation = table[words]
    loose = rng.random(len(words)) < 0.2
    translation = np.where(loose, rng.integers(3, config.vocab_size, len(words)), translation)
    pairs.append(
      {
        "inputs": np.append(words, EOS_ID).astype(np.int32),
        "targets": np.append(translation, EOS_ID).astype(np.int32),
      }
    )
  return pairs


def make_inputs(seed: int = 7) -> tuple:
  """``(params, pairs, config)``: the arguments of every eval function here.

  The pairs have 2 to 21 tokens; the length filter keeps those of at most 16.
  """
  config = WMTConfig()
  table = translation_table(config.vocab_size, seed)
  return make_params(config, table, seed), make_pairs(config, table, seed), config


def wmt_dataset(pairs, max_length):
  """Tokenized pairs, without those whose longer side has more than max_length tokens."""
  ds = common.tf_sequences(pairs)
  longest = lambda x: tf.maximum(tf.shape(x["inputs"])[0], tf.shape(x["targets"])[0])
  return ds.filter(lambda x: longest(x) < max_length + 1)


def predict(inputs, params, eos_id, max_decode_len, config):
  """Greedy decoding (the stand-in for the beam search): ``[B, max_decode_len]`` ids, zeros
  after each row's first EOS."""
  model = TinyTranslator(config)
  encoded = model.apply({"params": params}, inputs, method=TinyTranslator.encode)

  def next_token(position, state):
    decoded, done = state
    logits = model.apply({"params": params}, encoded, decoded, method=TinyTranslator.decode)
    token = jnp.where(done, 0, jnp.argmax(logits[:, position], axis=-1))
    return decoded.at[:, position].set(token), done | (token == eos_id)

  start = (
    jnp.zeros((inputs.shape[0], max_decode_len), jnp.int32),
    jnp.zeros(inputs.shape[0], bool),
  )
  decoded, _ = jax.lax.fori_loop(0, max_decode_len, next_token, start)
  return decoded


# --- before: today's example -------------------------------------------------------------------
ORIGINAL_TRACES = common.TraceCounter()  # both step functions
ORIGINAL_EVAL_TRACES = common.TraceCounter()
ORIGINAL_PREDICT_TRACES = common.TraceCounter()


def original_eval_pipeline(pairs, batch_size, max_length, drop_remainder=True):
  """The example's preprocess_wmt_data without packing: padded_batch, drop_remainder=True
  (False for the predict pipeline)."""
  ds = wmt_dataset(pairs, max_length)
  ds = ds.padded_batch(
    batch_size,
    padded_shapes={"inputs": max_length, "targets": max_length},
    padding_values={"inputs": 0, "targets": 0},
    drop_remainder=drop_remainder,
  )
  return ds.prefetch(tf.data.AUTOTUNE)


@ORIGINAL_TRACES
@ORIGINAL_EVAL_TRACES
def original_eval_step(params, batch, config):
  """The example's step: token sums of loss and hits and their denominator, psum-ed."""
  inputs, targets = batch["inputs"], batch["targets"]
  weights = jnp.where(targets > 0, 1.0, 0.0)
  logits = TinyTranslator(config).apply({"params": params}, inputs, targets)
  one_hot = common_utils.onehot(targets, logits.shape[-1])
  loss = -jnp.sum(one_hot * nn.log_softmax(logits), axis=-1) * weights
  accuracy = jnp.equal(jnp.argmax(logits, axis=-1), targets) * weights
  metrics = {"loss": loss.sum(), "accuracy": accuracy.sum(), "denominator": weights.sum()}
  return jax.lax.psum(metrics, axis_name="batch")


@ORIGINAL_TRACES
@ORIGINAL_PREDICT_TRACES
def original_predict_step(inputs, params, eos_id, max_decode_len, config):
  """The example's predict_step: the decoded ids of one device's rows."""
  return predict(inputs, params, eos_id, max_decode_len, config)


@functools.cache
def original_pmapped_steps(config):
  """The pmapped eval and predict steps, built once (``train_and_evaluate`` builds them once)."""
  p_eval_step = jax.pmap(functools.partial(original_eval_step, config=config), axis_name="batch")
  p_pred_step = jax.pmap(
    functools.partial(original_predict_step, config=config),
    axis_name="batch",
    static_broadcasted_argnums=(2, 3),  # eos id, max length
  )
  return p_eval_step, p_pred_step


def pad_examples(x, desired_batch_size):
  """Repeats the last row of ``x`` up to desired_batch_size rows."""
  missing = desired_batch_size - x.shape[0]
  return np.concatenate([x, np.repeat(x[-1:], missing, axis=0)])


def tohost(x):
  """``[devices, per_device, ...]`` device outputs -> ``[devices * per_device, ...]`` numpy."""
  return np.asarray(x).reshape((-1,) + x.shape[2:])


def decode_tokens(tokens):
  """A row's ids up to and including its first EOS, written as words (the detokenizer here)."""
  kept = tokens[: np.argmax(tokens == EOS_ID) + 1]  # as the example cuts: argmax of EOS, + 1
  return " ".join(str(token) for token in kept)


def host_bleu(references, predictions, max_order=4):
  """Corpus BLEU (0 to 100) of whitespace-separated sentences, computed as Flax's bleu.py does.

  Clipped n-gram matches and hypothesis n-grams per order, summed over the corpus; an order
  without a match gets ``1 / (2^k * possible)`` for its k-th such order; brevity penalty from the
  summed lengths.
  """
  matches, possible = np.zeros(max_order), np.zeros(max_order)
  reference_length = translation_length = 0
  for reference, prediction in zip(references, predictions, strict=True):
    ref, hyp = reference.split(), prediction.split()
    reference_length += len(ref)
    translation_length += len(hyp)
    for n in range(1, max_order + 1):
      ref_ngrams = collections.Counter(tuple(ref[i : i + n]) for i in range(len(ref) - n + 1))
      hyp_ngrams = collections.Counter(tuple(hyp[i : i + n]) for i in range(len(hyp) - n + 1))
      matches[n - 1] += sum((ref_ngrams & hyp_ngrams).values())
      possible[n - 1] += max(len(hyp) - n + 1, 0)
  precisions, smooth = [], 1.0
  for n in range(max_order):
    if possible[n] and matches[n]:
      precisions.append(matches[n] / possible[n])
    elif possible[n]:
      smooth *= 2
      precisions.append(1.0 / (smooth * possible[n]))
  geo_mean = math.exp(sum(map(math.log, precisions)) / max_order) if precisions else 0.0
  ratio = translation_length / reference_length if reference_length else 1.0
  brevity = 1.0 if ratio >= 1.0 else (math.exp(1 - 1 / ratio) if ratio > 0 else 0.0)
  return 100.0 * geo_mean * brevity


def original_eval(params, pairs, config, num_eval_steps=20):
  """The example's evaluate, then translate_and_calculate_bleu; returns (metrics, rows).

  ``rows`` counts the rows of the loss and accuracy (the BLEU covers every row).
  """
  p_eval_step, p_pred_step = original_pmapped_steps(config)
  replicated = jax_utils.replicate(params)  # the example's state arrives replicated
  eval_ds = original_eval_pipeline(pairs, BATCH_SIZE, config.max_eval_target_length)
  eval_metrics = []
  for _, eval_batch in zip(range(num_eval_steps), iter(eval_ds)):
    eval_batch = jax.tree.map(lambda x: x.numpy(), eval_batch)
    eval_metrics.append(p_eval_step(replicated, common_utils.shard(eval_batch)))
  rows = len(eval_metrics) * BATCH_SIZE
  eval_metrics = common_utils.get_metrics(eval_metrics)
  eval_metrics_sums = jax.tree.map(jnp.sum, eval_metrics)
  eval_denominator = eval_metrics_sums.pop("denominator")
  eval_summary = jax.tree.map(lambda x: x / eval_denominator, eval_metrics_sums)

  n_devices = jax.local_device_count()
  predict_ds = original_eval_pipeline(
    pairs, BATCH_SIZE, config.max_predict_length, drop_remainder=False
  )
  references, predictions = [], []
  for pred_batch in predict_ds:
    pred_batch = jax.tree.map(lambda x: x.numpy(), pred_batch)
    cur_pred_batch_size = pred_batch["inputs"].shape[0]
    if cur_pred_batch_size % n_devices:  # the last batch: repeat its last row
      padded_size = int(np.ceil(cur_pred_batch_size / n_devices) * n_devices)
      pred_batch = jax.tree.map(lambda x: pad_examples(x, padded_size), pred_batch)
    pred_batch = common_utils.shard(pred_batch)
    predicted = p_pred_step(pred_batch["inputs"], replicated, EOS_ID, config.max_predict_length)
    predicted, targets = tohost(predicted), tohost(pred_batch["targets"])
    for i, s in enumerate(predicted[:cur_pred_batch_size]):
      references.append(decode_tokens(targets[i]))
      predictions.append(decode_tokens(s))
  eval_summary["bleu"] = host_bleu(references, predictions)
  return eval_summary, rows


# --- after: padded_eval ------------------------------------------------------------------------
CONVERTED_TRACES = common.TraceCounter()  # both step functions
CONVERTED_EVAL_TRACES = common.TraceCounter()
CONVERTED_BLEU_TRACES = common.TraceCounter()
EVAL_METRICS = pe.Metrics({"loss": pe.metrics.Mean("loss"), "accuracy": pe.metrics.Accuracy()})
BLEU_METRIC = pe.Metrics({"bleu": pe.metrics.BLEU(pad_id=0)})


def converted_eval_pipeline(pairs, batch_size, max_length, drop_remainder=False):
  """The same pipeline, drop_remainder=False for eval too (pe.pad_batches pads the last batch)."""
  ds = wmt_dataset(pairs, max_length)
  ds = ds.padded_batch(
    batch_size,
    padded_shapes={"inputs": max_length, "targets": max_length},
    padding_values={"inputs": 0, "targets": 0},
    drop_remainder=drop_remainder,
  )
  return ds.prefetch(tf.data.AUTOTUNE)


@CONVERTED_TRACES
@CONVERTED_EVAL_TRACES
def converted_eval_step(params, batch, config):
  """Masked token statistics of one device's rows: real sentence and real token."""
  inputs, targets = batch["inputs"], batch["targets"]
  tokens = batch["mask"][:, None] & (targets > 0)
  logits = TinyTranslator(config).apply({"params": params}, inputs, targets)
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return EVAL_METRICS.batch_updates(preds=logits, target=targets, loss=loss, mask=tokens)


@CONVERTED_TRACES
@CONVERTED_BLEU_TRACES
def converted_predict_step(params, batch, config, max_decode_len):
  """Decoded ids of one device's rows, cut at the first EOS, and their clipped n-gram counts."""
  predicted = predict(batch["inputs"], params, EOS_ID, max_decode_len, config)
  is_eos = predicted == EOS_ID
  after_eos = jnp.cumsum(is_eos, axis=-1) - is_eos > 0
  predicted = jnp.where(after_eos, 0, predicted)  # up to the first EOS
  return BLEU_METRIC.batch_updates(preds=predicted, target=batch["targets"], mask=batch["mask"])


def converted_eval(params, pairs, config):
  """Every kept pair, exactly: loss, accuracy and BLEU, each pmapped once; returns (metrics, rows).

  The HOWTO's patch passes ``pe.pad_batches(ds, None)``: ``train_and_evaluate`` has no batch size
  at hand, and its pipelines are built once, so the first batch that None reads (to learn the
  size) is read once per training run. Here the pipelines are built at every call, as in the
  original loop, and None would read a first batch at every call (about 0.05 s each on this
  machine): the batch size is passed, as lm1b's conversion does.
  """
  eval_ds = converted_eval_pipeline(pairs, BATCH_SIZE, config.max_eval_target_length)
  eval_fn = functools.partial(converted_eval_step, config=config)
  results = pe.masked_eval(eval_fn, params, pe.pad_batches(eval_ds, BATCH_SIZE))
  rows = results.pop("num_examples")

  predict_ds = converted_eval_pipeline(pairs, BATCH_SIZE, config.max_predict_length)
  bleu_fn = functools.partial(
    converted_predict_step, config=config, max_decode_len=config.max_predict_length
  )
  bleu_results = pe.masked_eval(bleu_fn, params, pe.pad_batches(predict_ds, BATCH_SIZE))
  results["bleu"] = 100 * bleu_results["bleu"]
  return results, rows


# --- float64 reference -------------------------------------------------------------------------
def reference_logits(params, inputs, targets):
  """float64 ``[N, L, vocab]`` logits of `TinyTranslator` (targets shifted right)."""
  f64 = functools.partial(np.asarray, dtype=np.float64)
  shifted = np.pad(targets, [(0, 0), (1, 0)])[:, :-1]
  hidden = f64(params["source_embed"]["embedding"])[inputs]
  hidden = hidden + f64(params["target_embed"]["embedding"])[shifted]
  dense = params["logits_dense"]
  return hidden @ f64(dense["kernel"]) + f64(dense["bias"])


def reference_decode(params, inputs, max_decode_len):
  """Greedy decoding in float64 numpy: ``[N, max_decode_len]`` ids, zeros after the first EOS."""
  decoded = np.zeros((len(inputs), max_decode_len), np.int64)
  done = np.zeros(len(inputs), bool)
  for position in range(max_decode_len):
    token = reference_logits(params, inputs, decoded)[:, position].argmax(-1)
    decoded[:, position] = np.where(done, 0, token)
    done |= decoded[:, position] == EOS_ID
  return decoded


def reference(params, pairs, config) -> tuple[dict[str, float], int]:
  """Token loss and accuracy (numpy float64) and BLEU (sacrebleu) over every kept pair.

  Args:
    params: the model's params.
    pairs: dicts of int ``inputs`` and ``targets`` token arrays.
    config: the `WMTConfig`.

  Returns:
    ``({"loss", "accuracy", "bleu"}, rows)``; BLEU is sacrebleu's corpus score (0 to 100) with
    ``tokenize="none"`` and no smoothing, of the decoded ids up to the first EOS written as words.
  """
  import sacrebleu

  length = config.max_eval_target_length
  assert config.max_predict_length == length  # one filter for both pipelines
  kept = [p for p in pairs if max(len(p["inputs"]), len(p["targets"])) <= length]
  inputs, targets = (
    np.stack([np.pad(p[key], (0, length - len(p[key]))) for p in kept])
    for key in ("inputs", "targets")
  )
  nll, hit = common.token_statistics64(reference_logits(params, inputs, targets), targets)
  real = targets > 0
  decoded = reference_decode(params, inputs, config.max_predict_length)

  def words(ids):
    return " ".join(str(i) for i in ids[ids > 0])

  bleu = sacrebleu.corpus_bleu(
    [words(d) for d in decoded],
    [[words(t) for t in targets]],
    tokenize="none",
    smooth_method="none",
  )
  metrics = {"loss": nll[real].mean(), "accuracy": hit[real].mean(), "bleu": bleu.score}
  return metrics, len(kept)


ORIGINAL = (original_eval_pipeline, original_eval_step, original_predict_step, original_eval)
CONVERTED = (converted_eval_pipeline, converted_eval_step, converted_predict_step, converted_eval)
