"""Update cost of issue 29's metrics per eval step, as a share of a small forward pass.

``python -m benchmarks families [--rounds R] [--steps S] [--quick]``

For each metric, one jitted ``lax.scan`` over ``S`` steps runs a small MLP's forward pass on
the step's batch (its output shaped as the metric's ``preds``) and either only sums the
output (the baseline: the forward pass, kept alive) or also merges the metric's masked
batch statistics into the carried state. The two programs are timed in interleaved rounds
in one process (``common.interleaved_seconds``); the figure is
``min(t_metric) / min(t_forward) - 1`` over the rounds (the fastest run of each is the least
disturbed by other load on a shared machine), beside the median of the per-round ratios:
the share of a forward pass the metric adds. XLA's cost analysis of the two compiled
programs gives the share in flops, which no other load disturbs (a sort counts no flops, so
it understates the ranking metrics; bytes accessed depend on how XLA fuses the two programs
and are not compared).
One device (plain ``jit``), so it is the metric's own arithmetic, not a collective.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import padded_eval as pe
from benchmarks._models import mlp_apply, mlp_params
from benchmarks.common import interleaved_seconds

HIDDEN = 128


def _ranking_task(rng, steps):
  queries, candidates, features = 64, 20, 32
  x = rng.standard_normal((steps, queries, candidates, features)).astype(np.float32)
  target = rng.integers(0, 4, (steps, queries, candidates)).astype(np.float32)
  params = mlp_params((features, HIDDEN, HIDDEN, 1))
  forward = lambda p, x: mlp_apply(p, x)[..., 0]  # noqa: E731  [Q, L] scores
  return "64 queries x 20 candidates, MLP 32-128-128-1", params, forward, x, target


def _image_task(rng, steps):
  x = rng.random((steps, 16, 32, 32, 3)).astype(np.float32)
  target = np.clip(x + 0.05 * rng.standard_normal(x.shape), 0, 1).astype(np.float32)
  params = mlp_params((3, 64, 64, 3))
  forward = lambda p, x: jax.nn.sigmoid(mlp_apply(p, x))  # noqa: E731  per-pixel MLP
  return "16 images 32x32x3, per-pixel MLP 3-64-64-3", params, forward, x, target


def _segmentation_task(rng, steps):
  x = rng.random((steps, 16, 32, 32, 3)).astype(np.float32)
  target = rng.integers(0, 5, (steps, 16, 32, 32)).astype(np.int32)
  params = mlp_params((3, 64, 64, 5))
  return "16 images 32x32, per-pixel MLP 3-64-64-5", params, mlp_apply, x, target


def _regression_task(rng, steps):
  x = rng.standard_normal((steps, 256, 16)).astype(np.float32)
  target = rng.uniform(0.1, 3.0, (steps, 256)).astype(np.float32)
  params = mlp_params((16, HIDDEN, HIDDEN, 1))
  forward = lambda p, x: jnp.exp(mlp_apply(p, x)[..., 0])  # noqa: E731  positive preds
  return "256 rows, MLP 16-128-128-1", params, forward, x, target


def _classification_task(rng, steps):
  x = rng.standard_normal((steps, 256, 16)).astype(np.float32)
  target = rng.integers(0, 10, (steps, 256)).astype(np.int32)
  params = mlp_params((16, HIDDEN, HIDDEN, 10))
  return "256 rows, MLP 16-128-128-10", params, mlp_apply, x, target


CASES = [
  ("RecallAtK(10)", _ranking_task, lambda: pe.metrics.RecallAtK(10)),
  ("PrecisionAtK(10)", _ranking_task, lambda: pe.metrics.PrecisionAtK(10)),
  ("MRR", _ranking_task, lambda: pe.metrics.MRR()),
  ("MAPAtK(10)", _ranking_task, lambda: pe.metrics.MAPAtK(10)),
  ("NDCGAtK(10)", _ranking_task, lambda: pe.metrics.NDCGAtK(10)),
  ("PSNR", _image_task, lambda: pe.metrics.PSNR(1.0)),
  ("SSIM", _image_task, lambda: pe.metrics.SSIM(1.0)),
  ("SSIM(valid)", _image_task, lambda: pe.metrics.SSIM(1.0, padding="valid")),
  ("Dice(5)", _segmentation_task, lambda: pe.metrics.Dice(num_classes=5)),
  ("MAPE", _regression_task, lambda: pe.metrics.MAPE()),
  ("MSLE", _regression_task, lambda: pe.metrics.MSLE()),
  ("ExplainedVariance", _regression_task, lambda: pe.metrics.ExplainedVariance()),
  ("ClassificationReport(10)", _classification_task, lambda: pe.metrics.ClassificationReport(10)),
]


def _programs(metric, params, forward, x, target):
  mask = np.ones(x.shape[:2], bool)
  mask[-1, x.shape[1] // 3 :] = False  # a padded last batch

  @jax.jit
  def forward_only(params, x, target, mask):
    def step(total, inputs):
      xs, _, _ = inputs
      return total + jnp.sum(forward(params, xs)), None

    return jax.lax.scan(step, jnp.zeros(()), (x, target, mask))[0]

  @jax.jit
  def with_metric(params, x, target, mask):
    def step(carry, inputs):
      total, state = carry
      xs, ts, ms = inputs
      preds = forward(params, xs)
      state = state.merge(metric.batch_updates(preds=preds, target=ts, mask=ms))
      return (total + jnp.sum(preds), state), None

    return jax.lax.scan(step, (jnp.zeros(()), metric), (x, target, mask))[0]

  args = jax.device_put((params, x, target, mask))
  programs = {
    "forward": lambda: jax.block_until_ready(forward_only(*args)),
    "metric": lambda: jax.block_until_ready(with_metric(*args)),
  }
  costs = {"forward": _cost(forward_only, args), "metric": _cost(with_metric, args)}
  return programs, costs


def _cost(fn, args) -> dict:
  """XLA's own count of the compiled program's flops (and bytes accessed)."""
  cost = fn.lower(*args).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return {"flops": float(cost.get("flops", 0.0)), "bytes": float(cost.get("bytes accessed", 0.0))}


def run(rounds: int = 15, steps: int = 20) -> list[dict]:
  """One row per metric: its task, the forward step's milliseconds and the metric's share."""
  rows = []
  for name, task, make in CASES:
    description, params, forward, x, target = task(np.random.default_rng(0), steps)
    programs, costs = _programs(make(), params, forward, x, target)
    timings = interleaved_seconds(programs, rounds)
    best = {key: min(t[key] for t in timings) for key in ("forward", "metric")}
    shares = [t["metric"] / t["forward"] - 1.0 for t in timings]
    rows.append(
      {
        "metric": name,
        "task": description,
        "forward_ms": 1e3 * best["forward"] / steps,
        "share": best["metric"] / best["forward"] - 1.0,
        "median_share": float(np.median(shares)),
        "flops_share": costs["metric"]["flops"] / costs["forward"]["flops"] - 1.0,
      }
    )
  return rows


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=15)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--quick", action="store_true", help="3 rounds of 4 steps (a smoke test)")
  args = parser.parse_args(argv)
  if args.quick:
    args.rounds, args.steps = 3, 4
  print(
    f"devices: {jax.devices()[0].platform} x{jax.device_count()}; {args.steps} steps per program"
  )
  print(
    f"{'metric':26s} {'forward ms/step':>15s} {'time (min)':>10s} {'(median)':>9s} "
    f"{'flops':>8s}  task"
  )
  for row in run(args.rounds, args.steps):
    print(
      f"{row['metric']:26s} {row['forward_ms']:15.3f} {row['share']:10.1%} "
      f"{row['median_share']:9.1%} {row['flops_share']:8.1%}  "
      f"{row['task']}"
    )


if __name__ == "__main__":
  main()
