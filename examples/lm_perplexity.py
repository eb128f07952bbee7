"""lm1b-style language model perplexity with token-level masks (runs offline).

The Flax ``lm1b`` / ``wmt`` examples pad sentences to a fixed length and weight
tokens by ``targets > 0``; their eval loop then averages per-batch losses, so a
batch of short sentences counts as much as a batch of long ones. Here a tiny
bigram model is trained on a synthetic corpus of variable-length sentences and
evaluated exactly: two masks combine, ``batch["mask"]`` (real rows, from
``pe.pad_batches``) and the token mask (real tokens within a row), and
``pe.metrics.Perplexity`` is ``exp`` of the token-weighted mean cross-entropy over
the whole corpus. The result is checked against numpy in float64; the per-batch
average of the naive loop is printed next to it.

Run: ``python examples/lm_perplexity.py [--backend pmap|shard_map|jit]``.
"""

from __future__ import annotations

import argparse
import os

if __name__ == "__main__":  # virtual devices must be set before JAX starts a backend
  os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import padded_eval as pe

VOCAB = 32  # token 0 is padding, 1 begins a sentence
MAX_LENGTH = 24  # tokens per row after padding


def synthetic_corpus(num_sentences: int, seed: int) -> dict[str, np.ndarray]:
  """Sentences of 2..MAX_LENGTH tokens from a random Markov chain, padded with 0.

  Returns:
    ``{"inputs": int32 [N, MAX_LENGTH], "targets": int32 [N, MAX_LENGTH]}``; targets
    are inputs shifted by one; both are 0 past the sentence's end.
  """
  # One language (a fixed Markov chain over tokens 2..VOCAB-1); `seed` draws the sentences.
  transitions = np.random.default_rng(1234).dirichlet(np.full(VOCAB - 2, 0.3), size=VOCAB)
  rng = np.random.default_rng(seed)
  tokens = np.zeros((num_sentences, MAX_LENGTH + 1), np.int32)
  lengths = rng.integers(2, MAX_LENGTH + 1, size=num_sentences)
  for row, length in enumerate(lengths):
    tokens[row, 0] = 1
    for t in range(1, length + 1):
      tokens[row, t] = 2 + rng.choice(VOCAB - 2, p=transitions[tokens[row, t - 1]])
  inputs, targets = tokens[:, :-1].copy(), tokens[:, 1:].copy()
  inputs[targets == 0] = 0
  return {"inputs": inputs, "targets": targets}


class BigramLM(nnx.Module):
  """Next-token logits from the current token: ``[B, T] -> [B, T, VOCAB]``."""

  def __init__(self, rngs: nnx.Rngs):
    self.embed = nnx.Embed(VOCAB, 32, rngs=rngs)
    self.out = nnx.Linear(32, VOCAB, rngs=rngs)

  def __call__(self, inputs):
    return self.out(nnx.tanh(self.embed(inputs)))


def train(data: dict[str, np.ndarray], steps: int = 150, seed: int = 0):
  """Full-batch Adam on token-masked cross-entropy; returns ``(graphdef, params)``."""
  graphdef, params = nnx.split(BigramLM(nnx.Rngs(seed)))
  optimizer = optax.adam(3e-2)
  token_weights = (data["targets"] > 0).astype(np.float32)

  @jax.jit
  def train_step(params, opt_state):
    def loss_fn(params):
      logits = nnx.merge(graphdef, params)(data["inputs"])
      losses = optax.softmax_cross_entropy_with_integer_labels(logits, data["targets"])
      return (losses * token_weights).sum() / token_weights.sum()

    updates, opt_state = optimizer.update(jax.grad(loss_fn)(params), opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  opt_state = optimizer.init(params)
  for _ in range(steps):
    params, opt_state = train_step(params, opt_state)
  return graphdef, params


def evaluate(graphdef, params, corpus, batch_size: int, backend: str) -> dict[str, float]:
  """Exact token-level evaluation: perplexity, token accuracy, mean token cross-entropy."""
  metrics = pe.Metrics([pe.metrics.Perplexity(), pe.metrics.Accuracy(name="token_accuracy")])

  def eval_step(params, batch):
    logits = nnx.merge(graphdef, params)(batch["inputs"])
    # A token is real if its row is real (pad_batches) and it is not padding (lm1b's `targets > 0`).
    tokens = batch["mask"][:, None] & (batch["targets"] > 0)
    return metrics.batch_updates(preds=logits, target=batch["targets"], mask=tokens)

  return pe.masked_eval(eval_step, params, pe.pad_batches(corpus, batch_size), backend=backend)


def naive_perplexity(graphdef, params, corpus, batch_size: int) -> float:
  """The usual loop: per-batch token-mean loss, averaged over batches, then ``exp``."""
  apply = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))
  batch_losses = []
  for start in range(0, len(corpus["inputs"]), batch_size):
    inputs, targets = (corpus[k][start : start + batch_size] for k in ("inputs", "targets"))
    losses = optax.softmax_cross_entropy_with_integer_labels(apply(params, inputs), targets)
    weights = targets > 0
    batch_losses.append(float(jnp.sum(jnp.where(weights, losses, 0)) / weights.sum()))
  return float(np.exp(np.mean(batch_losses)))


def reference(graphdef, params, corpus) -> dict[str, float]:
  """numpy float64 over every real token of the corpus."""
  logits = np.asarray(
    jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))(params, corpus["inputs"]), np.float64
  )
  real = corpus["targets"] > 0
  shifted = logits - logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  token_log_probs = np.take_along_axis(log_probs, corpus["targets"][..., None], -1)[..., 0]
  mean_crossentropy = -token_log_probs[real].mean()
  hits = logits.argmax(-1) == corpus["targets"]
  return {
    "perplexity": float(np.exp(mean_crossentropy)),
    "token_accuracy": float(hits[real].mean()),
    "num_tokens": int(real.sum()),
  }


def main(argv: list[str] | None = None) -> dict[str, float]:
  """Trains, evaluates, checks against numpy float64; returns the results."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--backend", default="pmap", choices=["pmap", "shard_map", "jit"])
  parser.add_argument("--batch-size", type=int, default=64)
  parser.add_argument("--train-steps", type=int, default=150)
  args = parser.parse_args(argv)

  graphdef, params = train(synthetic_corpus(1000, seed=0), args.train_steps)
  corpus = synthetic_corpus(300, seed=1)  # 300 sentences: the last batch is short
  results = evaluate(graphdef, params, corpus, args.batch_size, args.backend)
  expected = reference(graphdef, params, corpus)

  assert results["num_examples"] == len(corpus["inputs"]), results["num_examples"]
  np.testing.assert_allclose(results["perplexity"], expected["perplexity"], rtol=1e-5)
  np.testing.assert_allclose(results["token_accuracy"], expected["token_accuracy"], rtol=1e-6)
  naive = naive_perplexity(graphdef, params, corpus, args.batch_size)
  print(
    f"perplexity {results['perplexity']:.6f} (numpy float64 {expected['perplexity']:.6f}; "
    f"the per-batch average of the usual loop gives {naive:.6f})"
  )
  print(
    f"token accuracy {results['token_accuracy']:.6f} over {expected['num_tokens']} real "
    f"tokens in {int(results['num_examples'])} sentences, backend={args.backend}: "
    "matches numpy"
  )
  return results


if __name__ == "__main__":
  main()
