"""The measured cost and benefit of exact accumulation.

1. Cost: step time of a jitted eval step (Accuracy and Mean of 4096 x 1000 logits)
   with the exact accumulators, as a ratio to the same step with a plain float32 /
   int32 running total, run alternately in the same process (median of rounds).
2. Benefit: relative error of the mean, the element count and a Std after 2**31+
   elements, exact accumulators vs plain float32 / int32 ones on the same run
   (inputs generated on the device; exact references in closed form / float64).

Run: ``python benchmarks/bench_accumulate.py [--steps 30 --rounds 9]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import padded_eval as pe
from padded_eval.exact.accumulate import ExactCount

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_scale import BATCH, _batch_values, _residue_sum  # noqa: E402  (one generator)


def _exact_step(metrics, logits, labels, mask):
  accuracy, mean = metrics
  return (
    accuracy.update(preds=logits, target=labels, mask=mask),
    mean.update(values=logits, mask=mask),
  )


def _plain_step(totals, logits, labels, mask):
  """The common baseline: float32 sums and an int32 count, masked the same way."""
  correct, count, logit_sum = totals
  hits = jnp.where(mask, jnp.argmax(logits, -1) == labels, False)
  real = jnp.where(mask[:, None], logits, 0.0)
  return (
    correct + jnp.sum(hits, dtype=jnp.float32),
    count + jnp.sum(mask, dtype=jnp.int32),
    logit_sum + jnp.sum(real),
  )


def _same_stats_plain_step(totals, logits, labels, mask):
  """The metrics' own batch statistics, accumulated in plain float32 (isolates the accumulator)."""
  accuracy = pe.metrics.Accuracy().batch_updates(preds=logits, target=labels, mask=mask)
  mean = pe.metrics.Mean().batch_updates(values=logits, mask=mask)
  batch = (
    accuracy.correct.total(),
    accuracy.weight.total(),
    mean.total.total(),
    mean.weight.total(),
  )
  return tuple(t + b for t, b in zip(totals, batch))


def _time_steps(step, carry, batch, steps):
  start = time.perf_counter()
  previous = carry
  for _ in range(steps):
    carry = step(carry, *batch)
    jax.block_until_ready(previous)  # at most two steps in flight
    previous = carry
  jax.block_until_ready(carry)
  return (time.perf_counter() - start) / steps


def step_cost(steps: int, rounds: int) -> dict:
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.standard_normal((4096, 1000)), jnp.float32)
  labels = jnp.asarray(rng.integers(0, 1000, 4096), jnp.int32)
  mask = jnp.asarray(np.arange(4096) < 4000)
  batch = (logits, labels, mask)
  runs = {
    "exact": (jax.jit(_exact_step), (pe.metrics.Accuracy(), pe.metrics.Mean())),
    "same_stats_plain": (jax.jit(_same_stats_plain_step), (jnp.float32(0),) * 4),
    "hand_plain": (jax.jit(_plain_step), (jnp.float32(0), jnp.int32(0), jnp.float32(0))),
  }
  times = {name: [] for name in runs}
  for step, carry in runs.values():
    _time_steps(step, carry, batch, 2)  # compile + warm up
  for _ in range(rounds):  # interleaved, so load changes hit all alike
    for name, (step, carry) in runs.items():
      times[name].append(_time_steps(step, carry, batch, steps))
  result = {f"{name}_ms": 1e3 * statistics.median(t) for name, t in times.items()}
  for baseline in ("same_stats_plain", "hand_plain"):
    ratios = [e / b for e, b in zip(times["exact"], times[baseline])]
    result[f"ratio_vs_{baseline}"] = (statistics.median(ratios), min(ratios), max(ratios))
  return result


def error_at_scale(steps: int, batch: int) -> dict:
  @jax.jit
  def run():
    def body(step, carry):
      mean, count, plain_sum, plain_count, plain_float_count = carry
      values, mask = _batch_values(step, batch)
      batch_count = jnp.sum(mask, dtype=jnp.int32)
      return (
        mean.update(values=values, mask=mask),
        count.merge(ExactCount.of(batch_count)),
        plain_sum + jnp.sum(jnp.where(mask, values, 0.0)),
        plain_count + batch_count,
        plain_float_count + batch_count.astype(jnp.float32),
      )

    init = (pe.metrics.Mean(), ExactCount.zeros(), jnp.float32(0), jnp.int32(0), jnp.float32(0))
    return jax.lax.fori_loop(0, steps, body, init)

  start = time.perf_counter()
  mean, count, plain_sum, plain_count, plain_float_count = jax.block_until_ready(run())
  seconds = time.perf_counter() - start
  lengths = [batch - step % 3 for step in range(steps)]
  exact_count = sum(lengths)
  exact_total = sum(
    Fraction(n) + Fraction(_residue_sum(s * batch, n), 1024) for s, n in enumerate(lengths)
  )
  reference = float(exact_total / exact_count)
  relative = lambda got, want: abs(float(got) - want) / abs(want)
  return {
    "elements": exact_count,
    "seconds_incl_compile": seconds,
    "exact_mean_rel_error": relative(mean.compute(), reference),
    "exact_total_rel_error": relative(mean.total.to_numpy(), float(exact_total)),
    "plain_f32_mean_rel_error": relative(plain_sum / plain_float_count, reference),
    "plain_f32_total_rel_error": relative(plain_sum, float(exact_total)),
    "exact_count_error": int(count.to_numpy()) - exact_count,
    "plain_int32_count": int(plain_count),
    "plain_f32_count_error": int(float(plain_float_count)) - exact_count,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=30, help="timed steps per round")
  parser.add_argument("--rounds", type=int, default=9)
  args = parser.parse_args()
  print(f"jax {jax.__version__}, {jax.device_count()} x {jax.devices()[0].platform}")
  cost = step_cost(args.steps, args.rounds)
  print("step cost, Accuracy + Mean over 4096x1000 float32 logits (4000 real rows):")
  print(
    f"  exact {cost['exact_ms']:.2f} ms; same statistics, plain f32 totals "
    f"{cost['same_stats_plain_ms']:.2f} ms; hand-written f32/i32 {cost['hand_plain_ms']:.2f} ms"
  )
  for baseline in ("same_stats_plain", "hand_plain"):
    median, low, high = cost[f"ratio_vs_{baseline}"]
    print(f"  ratio exact / {baseline}: {median:.3f} (min {low:.3f}, max {high:.3f})")
  for batch in (BATCH, 1 << 14):  # just over 2**31 real elements (up to 2 masked per batch)
    steps = (1 << 31) // (batch - 2) + 2
    error = error_at_scale(steps, batch)
    print(
      f"error after {error['elements']} elements in {steps} batches of {batch} "
      f"({error['seconds_incl_compile']:.1f} s):"
    )
    for key, value in error.items():
      print(f"  {key}: {value}")


if __name__ == "__main__":
  main()
