"""ogbg-molpcba-shaped eval on CPU: masked_eval with OGB mean AP vs a bare jitted loop.

Batches of 256 graphs (25 nodes, 56 edges each, padded like ``jraph.pad_with_graphs``
budgets would be) through a message-passing model to 128 task logits: ``--model tiny``
(latent 32, 2 steps, CI-sized, the default) or ``--model flax`` (latent 256, 5 steps, the
size of flax's examples/ogbg_molpcba default config).
The bare loop only computes the model's outputs on each batch (what the unconverted eval
pays before its host-side metric); ``masked_eval`` also accumulates ``AUPRC(task=
"multilabel", num_classes=128, average="ogb")`` with the default bins (4_097 for 128
tasks, an 8 MiB state) and, with ``--bins``, other sizes (65_537: 128 MiB, the old
default). The original loop (outputs to the host, OGB's rule with scikit-learn at the
end) and ``masked_eval`` with a trivial Mean (the driver's own cost) are timed too; with
``--capacity``, ``AUPRC(exact=True, capacity=...)`` as well (the HOWTO's exact OGB mean AP).
Prints seconds per eval, the ratio to the bare loop (same process, runs interleaved) and
the state size. ``backend="jit"``, one device, like the ogbg example.

Run: ``python -m benchmarks ogb [--quick] [--batches 172] [--repeats 5] [--capacity 65536]`` (172 batches: the
43_793 test graphs of ogbg-molpcba).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.metrics import average_precision_score

import padded_eval as pe
from benchmarks.bench_sources import median_seconds
from benchmarks.common import two_in_flight

# flax's examples/ogbg_molpcba default config: latent 256, 5 message-passing steps, MLPs of
# 2 layers; batches of 256 graphs (ogbg-molpcba's graphs have ~26 nodes, ~56 directed edges).
GRAPHS, NODES, EDGES, TASKS, FEATURES = 256, 25, 56, 128, 9
FLAX_DEFAULT = (256, 5)  # (latent size, message-passing steps)
TINY = (32, 2)  # a CI-sized model


def make_batches(num_batches: int, seed: int = 0) -> list[dict]:
  """Batches of ``GRAPHS`` graphs as flat node / edge arrays, labels NaN for missing."""
  rng = np.random.default_rng(seed)
  batches = []
  offsets = (np.arange(GRAPHS) * NODES)[:, None]
  for _ in range(num_batches):
    senders = (rng.integers(0, NODES, (GRAPHS, EDGES)) + offsets).reshape(-1)
    receivers = (rng.integers(0, NODES, (GRAPHS, EDGES)) + offsets).reshape(-1)
    labels = (rng.random((GRAPHS, TASKS)) < 0.05).astype(np.float32)
    labels[rng.random((GRAPHS, TASKS)) < 0.4] = np.nan
    batches.append(
      {
        "nodes": rng.normal(size=(GRAPHS, NODES, FEATURES)).astype(np.float32),
        "senders": senders.astype(np.int32).reshape(GRAPHS, EDGES),
        "receivers": receivers.astype(np.int32).reshape(GRAPHS, EDGES),
        "labels": labels,
        "mask": np.ones(GRAPHS, bool),
      }
    )
  batches[-1]["mask"][-37:] = False  # a padded last batch
  return batches


def make_params(size: tuple[int, int], seed: int = 1) -> dict:
  """Weights of a model of ``size`` = (latent size, message-passing steps)."""
  hidden, steps = size
  rng = np.random.default_rng(seed)

  def dense(n_in, n_out):
    return (rng.normal(size=(n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)

  return {
    "embed": dense(FEATURES, hidden),
    "layers": [(dense(2 * hidden, hidden), dense(hidden, hidden)) for _ in range(steps)],
    "out": dense(hidden, TASKS),
  }


def model(params, batch) -> jax.Array:
  """float32 ``[GRAPHS, TASKS]`` logits: embed, one round of summed messages per layer
  through a 2-layer MLP with a residual, mean pool, a linear head."""
  h = jax.nn.relu(batch["nodes"].reshape(-1, FEATURES) @ params["embed"])
  senders, receivers = batch["senders"].reshape(-1), batch["receivers"].reshape(-1)
  for w1, w2 in params["layers"]:
    messages = jax.ops.segment_sum(h[senders], receivers, num_segments=h.shape[0])
    h = h + jax.nn.relu(jax.nn.relu(jnp.concatenate([h, messages], -1) @ w1) @ w2)
  return h.reshape(GRAPHS, NODES, -1).mean(1) @ params["out"]


def bare_loop(params, batches) -> None:
  """The model's outputs on every batch (jitted, two steps in flight), nothing else."""
  forward = jax.jit(model)
  two_in_flight(lambda batch: forward(params, batch), batches)


def unconverted_loop(params, batches) -> float:
  """What the original eval does: the model's outputs to the host, OGB's rule at the end
  (per task with a positive and a negative label, scikit-learn's AP over labelled rows)."""
  forward = jax.jit(model)
  logits, labels = [], []
  for batch in batches:
    real = batch["mask"]
    logits.append(np.asarray(forward(params, batch))[real])
    labels.append(batch["labels"][real])
  logits, labels = np.concatenate(logits), np.concatenate(labels)
  values = []
  for task in range(TASKS):
    column = labels[:, task]
    if np.any(column == 1) and np.any(column == 0):
      labelled = ~np.isnan(column)
      values.append(average_precision_score(column[labelled], logits[labelled, task]))
  return float(np.mean(values))


def ogb_step(num_thresholds=None, capacity=None):
  """``(metric, step_fn)``: OGB's mean AP binned (``num_thresholds``) or, with ``capacity``,
  exact (``exact=True``: every valid logit kept, up to ``capacity`` per task)."""
  exact = {} if capacity is None else {"exact": True, "capacity": capacity}
  metric = pe.metrics.AUPRC(
    task="multilabel",
    num_classes=TASKS,
    average="ogb",
    from_logits=True,
    num_thresholds=num_thresholds,
    **exact,
  )

  def step_fn(params, batch):
    logits = model(params, batch)
    return metric.batch_updates(preds=logits, target=batch["labels"], mask=batch["mask"])

  return metric, step_fn


def run(
  num_batches, repeats, size=TINY, bins=(None,), capacities=()
) -> list[tuple[str, float, float]]:
  """``[(variant, seconds per eval, state MiB)]``; the first is the bare loop."""
  params, batches = make_params(size), make_batches(num_batches)
  fns, sizes = {"bare jitted loop (model only)": lambda: bare_loop(params, batches)}, {}
  fns["unconverted loop (to host, sklearn)"] = lambda: unconverted_loop(params, batches)

  def mean_step(params, batch):  # the driver's own cost, with a trivial metric
    return pe.metrics.Mean().batch_updates(values=model(params, batch), mask=batch["mask"])

  fns["masked_eval Mean of logits"] = lambda: pe.masked_eval(
    mean_step, params, batches, backend="jit"
  )
  for num_thresholds in bins:
    metric, step_fn = ogb_step(num_thresholds)
    name = f"masked_eval AUPRC ogb, {metric.num_thresholds} bins"
    sizes[name] = (metric.positives.lo.size * 4 * 4) / 2**20  # 2 histograms x 2 limbs
    fns[name] = lambda step_fn=step_fn: pe.masked_eval(step_fn, params, batches, backend="jit")
  for capacity in capacities:
    _, step_fn = ogb_step(capacity=capacity)
    name = f"masked_eval AUPRC ogb, exact, capacity {capacity}"
    sizes[name] = TASKS * capacity * 5 / 2**20  # float32 score + int8 label per slot
    fns[name] = lambda step_fn=step_fn: pe.masked_eval(step_fn, params, batches, backend="jit")
  seconds = median_seconds(fns, repeats)
  return [(name, seconds[name], sizes.get(name, 0.0)) for name in fns]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batches", type=int, default=172)  # 43_793 test graphs
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--model", choices=("tiny", "flax"), default="tiny")
  parser.add_argument(
    "--bins", type=int, nargs="*", default=[], help="more num_thresholds (65537: the old default)"
  )
  parser.add_argument(
    "--capacity",
    type=int,
    nargs="*",
    default=[],
    help="exact=True with these capacities (65536: the HOWTO's, for molpcba's 43_793 graphs)",
  )
  parser.add_argument("--quick", action="store_true", help="4 batches, 1 repeat (a smoke test)")
  args = parser.parse_args()
  if args.quick:
    args.batches, args.repeats = 4, 1
  size = TINY if args.model == "tiny" else FLAX_DEFAULT
  rows = run(args.batches, args.repeats, size, bins=[None, *args.bins], capacities=args.capacity)
  base = rows[0][1]
  print(
    f"{args.batches} batches of {GRAPHS} graphs, {TASKS} tasks, model latent {size[0]} x "
    f"{size[1]} steps, jax {jax.__version__}"
  )
  print(f"{'variant':<40} {'s/eval':>8} {'ratio':>7} {'state MiB':>10}")
  for name, secs, mib in rows:
    print(f"{name:<40} {secs:8.3f} {secs / base:6.2f}x {mib:10.1f}")


if __name__ == "__main__":
  main()
