"""Text metrics on the devices vs the host round trip: BLEU, ROUGE, WER, exact match.

Corpus BLEU is usually computed after the evaluation (Flax's wmt example): every decoded
sentence is fetched to the host, detokenized to a string and scored by sacrebleu. Here the
same 4,096 sentences of 128 token ids (one reference each; hypotheses are references with
about 20% of the ids replaced, lengths 96 to 128) are scored two ways, in one process:

* ``pe.masked_eval`` (pmap, batches of 512 host ids placed on the devices inside the
  timing), the metric's exact counts computed in the step, reduced once;
* the host round trip: the decoded ids already on the devices (8 pmap-sharded batches,
  placed before the timing), ``jax.device_get`` of each, detokenized (``" ".join`` of the
  words, pad ids dropped), then the reference package (sacrebleu ``tokenize="none"``,
  rouge-score, jiwer, string equality).

Cells: best time over the rounds and the ratio masked_eval / round trip. It also times the
per-step update cost on one device, 64 sentences x 128 ids (a device's share of a batch of
512): the jitted update alone, and ``jit(forward + argmax + batch_updates)``, each against
``jit(forward + argmax)``; forward = embedding 256 + one ReLU layer 256 + logits over
1,000 ids (a small decoder's last step over all positions, about 4 GFLOP).

Run: ``python -m benchmarks text [--rounds 5] [--sentences 4096] [--quick]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import time
import warnings

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import padded_eval as pe  # noqa: E402

VOCAB, LENGTH, BATCH, PAD = 1000, 128, 512, 0
WORDS = np.array([""] + [f"w{i}" for i in range(1, VOCAB)], object)


def corpus(num: int, seed: int = 0) -> dict:
  """``{"preds", "target"}``: int32 ``[num, 128]`` ids, pad 0 after each sentence's length."""
  rng = np.random.default_rng(seed)
  target = rng.integers(1, VOCAB, (num, LENGTH))
  preds = np.where(rng.random((num, LENGTH)) < 0.2, rng.integers(1, VOCAB, (num, LENGTH)), target)
  real = lambda: np.arange(LENGTH) < rng.integers(96, LENGTH + 1, (num, 1))
  return {
    "preds": np.where(real(), preds, PAD).astype(np.int32),
    "target": np.where(real(), target, PAD).astype(np.int32),
  }


def detokenize(ids: np.ndarray) -> list[str]:
  return [" ".join(WORDS[row[row != PAD]]) for row in ids]


def _sacrebleu(hyps, refs):
  import sacrebleu

  return sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", smooth_method="none").score / 100


def _rouge(key):
  def score(hyps, refs):
    from rouge_score import rouge_scorer

    class Whitespace:
      def tokenize(self, text):
        return text.split()

    scorer = rouge_scorer.RougeScorer([key], tokenizer=Whitespace())
    return float(np.mean([scorer.score(r, h)[key].fmeasure for h, r in zip(hyps, refs)]))

  return score


def _jiwer(hyps, refs):
  import jiwer

  return jiwer.wer(refs, hyps)


# (name, metric, host reference, the reference's name)
METRICS = [
  ("BLEU", pe.metrics.BLEU(), _sacrebleu, "sacrebleu"),
  ("RougeN(1)", pe.metrics.RougeN(1), _rouge("rouge1"), "rouge-score"),
  ("RougeN(2)", pe.metrics.RougeN(2), _rouge("rouge2"), "rouge-score"),
  ("RougeL", pe.metrics.RougeL(), _rouge("rougeL"), "rouge-score"),
  ("WordErrorRate", pe.metrics.WordErrorRate(), _jiwer, "jiwer"),
  (
    "ExactMatch",
    pe.metrics.ExactMatch(),
    lambda h, r: np.mean([a == b for a, b in zip(h, r)]),
    "==",
  ),
]


def _best(fn, rounds: int) -> tuple[float, object]:
  best, value = float("inf"), None
  for _ in range(rounds):
    start = time.perf_counter()
    value = fn()
    best = min(best, time.perf_counter() - start)
  return best, value


def _step(params, batch, metric):
  del params  # the ids are already decoded
  return metric.batch_updates(preds=batch["preds"], target=batch["target"], mask=batch["mask"])


def round_trip_vs_masked_eval(data: dict, rounds: int) -> list[tuple]:
  """``(name, reference, device value, host value, device s, host s)`` per metric."""
  batches = pe.pad_batches(data, BATCH)
  batches = [dict(b) for b in batches]
  n = jax.local_device_count()
  on_devices = [  # the decoded ids where decoding left them: sharded over the devices
    jax.pmap(lambda b: b)({k: np.reshape(b[k], (n, -1, LENGTH)) for k in ("preds", "target")})
    for b in batches
  ]
  jax.block_until_ready(on_devices)
  rows = []
  for name, metric, reference, ref_name in METRICS:
    step_fn = functools.partial(_step, metric=metric)  # one compiled step per metric

    def device(step_fn=step_fn, metric=metric):
      return pe.masked_eval(step_fn, {}, batches, backend="pmap")[metric.name]

    def host(reference=reference):
      hyps, refs = [], []
      for placed, batch in zip(on_devices, batches):
        fetched = jax.device_get(placed)
        real = np.asarray(batch["mask"])
        hyps += detokenize(fetched["preds"].reshape(-1, LENGTH)[real])
        refs += detokenize(fetched["target"].reshape(-1, LENGTH)[real])
      return reference(hyps, refs)

    device()  # compile
    device_s, device_value = _best(device, rounds)
    if name != "RougeL":  # rouge-score's LCS is pure Python: one round, no warm-up
      host()  # imports and first-call caches
    host_s, host_value = _best(host, rounds if name != "RougeL" else 1)
    rows.append((name, ref_name, device_value, host_value, device_s, host_s))
  return rows


def forward_params(seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  return {
    "embed": (rng.normal(size=(VOCAB, 256)) * 0.05).astype(np.float32),
    "hidden": (rng.normal(size=(256, 256)) * 0.06).astype(np.float32),
    "out": (rng.normal(size=(256, VOCAB)) * 0.06).astype(np.float32),
  }


def decode(params, source):
  """A small decoder's last step over all positions: ids ``[B, T]`` -> argmax ids ``[B, T]``."""
  x = jax.nn.relu(params["embed"][source] @ params["hidden"])
  return jnp.argmax(x @ params["out"], axis=-1).astype(jnp.int32)


def update_costs(data: dict, rounds: int = 20, rows: int = 64) -> list[tuple]:
  """``(name, forward ms, update ms, update / forward, (forward + update) / forward - 1)``:
  best of ``rounds`` interleaved timings on one device. The update alone reads the decoded
  ids; the fused step decodes and updates in one program."""
  params = jax.device_put(forward_params())
  source = jax.device_put(data["target"][:rows])
  decoded = jax.device_put(data["preds"][:rows])
  forward = jax.jit(lambda p, s: decode(p, s))
  calls = {"forward": lambda: forward(params, source)}
  for name, metric, _, _ in METRICS:
    alone = jax.jit(lambda d, t, metric=metric: metric.batch_updates(preds=d, target=t))
    fused = jax.jit(
      lambda p, s, metric=metric: metric.batch_updates(
        preds=jnp.where(s != PAD, decode(p, s), PAD), target=s
      )
    )
    calls[name] = lambda f=alone: f(decoded, source)
    calls[name + " fused"] = lambda f=fused: f(params, source)
  best = {name: float("inf") for name in calls}
  for call in calls.values():
    jax.block_until_ready(call())  # compile
  for _ in range(rounds):
    for name, call in calls.items():
      start = time.perf_counter()
      jax.block_until_ready(call())
      best[name] = min(best[name], time.perf_counter() - start)
  base = best["forward"]
  return [
    (name, base * 1e3, best[name] * 1e3, best[name] / base, best[name + " fused"] / base - 1)
    for name, *_ in METRICS
  ]


def main():
  # One compiled step per metric is intended: the same _step code with six metrics.
  warnings.filterwarnings("ignore", category=pe.RecompileWarning)
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--sentences", type=int, default=4096)
  parser.add_argument("--quick", action="store_true", help="512 sentences, 1 round (a smoke test)")
  args = parser.parse_args()
  if args.quick:
    args.rounds, args.sentences = 1, 512
  data = corpus(args.sentences)
  print(
    f"{args.sentences} sentences x {LENGTH} ids, batch {BATCH}, {jax.local_device_count()} devices"
  )
  print(
    "| metric | reference | masked_eval value | reference value | relative error | masked_eval | host round trip + reference | ratio |"
  )
  print("|---|---|---|---|---|---|---|---|")
  for name, ref_name, got, want, device_s, host_s in round_trip_vs_masked_eval(data, args.rounds):
    error = abs(got - want) / abs(want) if want else abs(got - want)
    print(
      f"| {name} | {ref_name} | {got:.6f} | {want:.6f} | {error:.1e} | {device_s * 1e3:.0f} ms "
      f"| {host_s * 1e3:.0f} ms | {device_s / host_s:.3f}x |"
    )
  print()
  print(
    "| metric | forward (64 x 128 ids, one device) | update alone | update / forward | fused step / forward - 1 |"
  )
  print("|---|---|---|---|---|")
  for name, forward_ms, update_ms, share, fused in update_costs(data):
    print(f"| {name} | {forward_ms:.1f} ms | {update_ms:.2f} ms | {share:.1%} | {fused:+.1%} |")


if __name__ == "__main__":
  main()
