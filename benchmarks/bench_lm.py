"""pe.lm.HarnessLM vs a naive loop that compiles per request length: requests per second, compilations.

The naive loop is what a first JAX port of an lm-eval backend does: each request's row (the last
``max_length + 1`` tokens of context + continuation, less the final one) goes through
``jax.jit(apply_fn)`` on its own, ``[1, n]``, so every new row length compiles, and the host fetches the
logits and sums the continuation's log-probabilities. HarnessLM sorts the requests into padded length buckets
(16, 32, 64, ... tokens, then ``max_length``) and scores them through ``masked_eval``, ``batch_size`` rows per
step.

Both score the same loglikelihood requests (random contexts of 4 to 300 tokens, continuations of 1 to 8)
with a small causal model (embedding 128, a causal convolution of width 4 and a running mean, tanh, logits
over 512 ids), twice: a cold pass (compilations included) over requests A, then a warm pass over requests B
of the same distribution (new lengths still compile in the naive loop). Cells: seconds, requests per second,
XLA compilations (JAX's compile event), and the largest relative difference between the two results.

Run: ``python -m benchmarks lm [--requests 512] [--max-length 256] [--batch-size 32] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import padded_eval as pe  # noqa: E402
from benchmarks import _models  # noqa: E402

VOCAB, DIM, WIDTH, EOT = 512, 128, 4, 0
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_compiles = [0]


def _listener(event, duration, **kwargs):
  del duration, kwargs
  _compiles[0] += event == _COMPILE_EVENT


class Ids:
  """Requests are written as space-separated token ids, so each request's tokens are chosen exactly."""

  eos_token_id = EOT

  def encode(self, text):
    return [int(t) for t in text.split()]

  def decode(self, ids):
    return " ".join(map(str, ids))


def make_params(seed=0):
  scales = {"embed": 1.0, "conv": 0.3, "mean": 0.3, "out": 0.3}
  return _models.causal_lm_params(VOCAB, DIM, WIDTH, scales, seed)


apply_fn = _models.causal_lm_apply


def make_requests(count, seed):
  """``(context, continuation)`` texts: contexts of 4..300 ids, continuations of 1..8 (leading space)."""
  rng = np.random.default_rng(seed)
  pairs = []
  for _ in range(count):
    context = rng.integers(1, VOCAB, int(rng.integers(4, 301)))
    continuation = rng.integers(1, VOCAB, int(rng.integers(1, 9)))
    pairs.append((" ".join(map(str, context)), " " + " ".join(map(str, continuation))))
  return pairs


def naive_loop(params, pairs, max_length):
  """One jit call per request on its own row ``[1, n]``; the host sums the continuation's log-probabilities."""
  forward = _naive_forward()
  tokenizer = Ids()
  results = []
  for context, continuation in pairs:
    context_ids, continuation_ids = tokenizer.encode(context), tokenizer.encode(continuation)
    whole = (context_ids + continuation_ids)[-(max_length + 1) :]
    log_probs = np.asarray(forward(params, jnp.asarray([whole[:-1]], jnp.int32)))[0]
    n = len(continuation_ids)
    picked = log_probs[np.arange(len(whole) - 1 - n, len(whole) - 1), whole[-n:]]
    results.append(float(picked.astype(np.float64).sum()))
  return results


_FORWARD = []


def _naive_forward():
  if not _FORWARD:
    _FORWARD.append(jax.jit(lambda params, row: jax.nn.log_softmax(apply_fn(params, row), axis=-1)))
  return _FORWARD[0]


def timed(fn, *args):
  before, start = _compiles[0], time.perf_counter()
  result = fn(*args)
  return result, time.perf_counter() - start, _compiles[0] - before


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--requests", type=int, default=512)
  parser.add_argument("--max-length", type=int, default=256)
  parser.add_argument("--batch-size", type=int, default=32)
  parser.add_argument("--quick", action="store_true", help="64 requests, max_length 64")
  args = parser.parse_args()
  if args.quick:
    args.requests, args.max_length = 64, 64
  from lm_eval.api.instance import Instance

  jax.monitoring.register_event_duration_secs_listener(_listener)
  params = jax.device_put(make_params())
  sets = {
    "cold (requests A)": make_requests(args.requests, 1),
    "warm (requests B)": make_requests(args.requests, 2),
  }
  harness = pe.lm.HarnessLM(
    apply_fn, params, Ids(), max_length=args.max_length, batch_size=args.batch_size, backend="jit"
  )
  print(
    f"{args.requests} loglikelihood requests per pass, max_length {args.max_length}, batch {args.batch_size}, "
    f"{jax.device_count()} {jax.devices()[0].platform} device(s), buckets "
    f"{pe.lm.harness.scoring.bucket_widths(args.max_length)}"
  )
  print(
    "| pass | HarnessLM s | req/s | compiles | naive loop s | req/s | compiles | speed-up | max rel diff |"
  )
  print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
  for name, pairs in sets.items():
    instances = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]
    ours, ours_s, ours_compiles = timed(harness.loglikelihood, instances)
    naive, naive_s, naive_compiles = timed(naive_loop, params, pairs, args.max_length)
    values = np.array([v for v, _ in ours])
    diff = np.max(np.abs(values - np.array(naive)) / np.abs(np.array(naive)))
    n = len(pairs)
    print(
      f"| {name} | {ours_s:.2f} | {n / ours_s:.0f} | {ours_compiles} | {naive_s:.2f} | {n / naive_s:.0f} | "
      f"{naive_compiles} | {naive_s / ours_s:.1f}x | {diff:.1e} |"
    )


if __name__ == "__main__":
  main()
