"""A tiny causal JAX language model, a merging byte tokenizer and their float64 numpy references.

The model (random weights; the causal LM of benchmarks/_models.py, as in benchmarks/bench_lm.py): token
embedding, a causal convolution over the last `WIDTH` positions plus the mean of every embedding so far, tanh,
an output layer with a bias. `logits64` is the same model in float64 numpy, row by row. The
tokenizer reads latin-1 bytes and merges a space with the lowercase letter after it into one token (as BPE's
"Ġword" tokens do), so lm-eval's rule that moves a context's trailing spaces into the continuation changes the
tokens; `EOT` is its end-of-text id.
"""

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import _models

EOT = 256 + 26
VOCAB = EOT + 6  # a few ids no text encodes (288: divisible by 8)
DIM, WIDTH = 24, 3


class MergingBytes:
  """latin-1 bytes; ``" " + c`` for a lowercase ``c`` is the one token ``256 + (c - "a")``."""

  eos_token_id = EOT

  def encode(self, text):
    data, ids, i = text.encode("latin-1"), [], 0
    while i < len(data):
      if data[i] == 32 and i + 1 < len(data) and 97 <= data[i + 1] <= 122:
        ids.append(256 + data[i + 1] - 97)
        i += 2
      else:
        ids.append(data[i])
        i += 1
    return ids

  def decode(self, ids):
    out = bytearray()
    for t in ids:
      if t < 256:
        out.append(t)
      elif t < EOT:
        out += bytes([32, 97 + t - 256])
      # EOT and unused ids decode to nothing
    return out.decode("latin-1")


def make_params(seed=0):
  scales = {"embed": 1.0, "conv": 0.5, "mean": 0.5, "out": 0.6, "bias": 0.3}
  return _models.causal_lm_params(VOCAB, DIM, WIDTH, scales, seed)


apply_fn = _models.causal_lm_apply  # int32 [B, T] -> float32 logits [B, T, V], causal


def logits64(params, tokens):
  """float64 numpy logits [T, V] of one row of tokens (the reference)."""
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  x = p["embed"][np.asarray(tokens)]
  h = np.zeros_like(x)
  for k in range(WIDTH):
    shifted = np.concatenate([np.zeros((k, DIM)), x])[: len(x)]
    h = h + shifted @ p["conv"][k]
  h = h + (np.cumsum(x, axis=0) / np.arange(1, len(x) + 1)[:, None]) @ p["mean"]
  return np.tanh(h) @ p["out"] + p["bias"]


def log_softmax64(logits):
  shifted = logits - logits.max(axis=-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def greedy_tokens64(params, prompt, count):
  """The float64 model's greedy continuation of ``prompt`` (token ids), ``count`` tokens."""
  tokens = list(prompt)
  for _ in range(count):
    tokens.append(int(np.argmax(logits64(params, tokens)[-1])))
  return tokens[len(prompt) :]


def make_generate_fn(apply):
  """A greedy ``generate_fn(params, tokens, mask, max_new_tokens)`` over left-padded prompts: each step runs the
  whole row again (the tiny model has no cache) with the padding moved out of the prompt's way by a roll."""

  def generate(params, tokens, mask, max_new_tokens):
    pad = jnp.sum(~mask, axis=1)  # left padding per row
    rows = jax.vmap(lambda row, p: jnp.roll(row, -p))(tokens, pad)  # prompt first, padding after
    length = tokens.shape[1] - pad
    width = tokens.shape[1] + max_new_tokens
    rows = jnp.pad(rows, ((0, 0), (0, max_new_tokens)))
    new = []
    for step in range(max_new_tokens):
      logits = apply(params, rows)
      nxt = jnp.argmax(
        jnp.take_along_axis(logits, (length + step - 1)[:, None, None], axis=1)[:, 0], -1
      )
      rows = rows.at[jnp.arange(rows.shape[0]), length + step].set(nxt.astype(rows.dtype))
      new.append(nxt)
    del width
    return jnp.stack(new, axis=1).astype(jnp.int32)

  return generate


def reference_lm(params, max_length):
  """lm-eval's own request handling (``TemplateLM``: its context/continuation split, empty-context rule and
  ``utils.get_rolling_token_windows`` + ``make_disjoint_window``) over `logits64`: the float64 reference."""
  from lm_eval import utils
  from lm_eval.api.model import TemplateLM

  tokenizer = MergingBytes()

  class Reference(TemplateLM):
    @property
    def eot_token_id(self):
      return EOT

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
      return tokenizer.encode(string)

    def _loglikelihood_tokens(self, requests, **kwargs):
      results = []
      for _, context, continuation in requests:
        assert 0 < len(continuation) <= max_length
        whole = (list(context) + list(continuation))[-(max_length + 1) :]
        log_probs = log_softmax64(logits64(params, whole[:-1]))[-len(continuation) :]
        picked = log_probs[np.arange(len(continuation)), continuation]
        greedy = bool(np.all(np.argmax(log_probs, axis=-1) == np.asarray(continuation)))
        results.append((float(picked.sum()), greedy))
      return results

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
      totals = []
      for request in requests:
        windows = [
          utils.make_disjoint_window(w)
          for w in utils.get_rolling_token_windows(
            token_list=self.tok_encode(request.args[0]),
            prefix_token=EOT,
            max_seq_len=max_length,
            context_len=1,
          )
        ]
        scored = self._loglikelihood_tokens([(None, c, p) for c, p in windows])
        totals.append(sum(value for value, _ in scored))
      return totals

    def generate_until(self, requests, disable_tqdm=False):
      raise NotImplementedError

  return Reference()
