"""masked_eval's speed, as ratios against a bare eval loop in the same process.

Compared on one MLP classifier (inputs -> width x depth -> classes), 8 virtual CPU devices:

* bare pmap loop: the model alone on pre-sharded device batches, no metrics; the faster of
  "wait on each step" and "wait on step t-1" (the baseline, 1.00);
* masked_eval with the pmap, shard_map and jit backends (default: 2 steps in flight; pmap
  also with 1), fed host numpy batches (so its
  host-to-device copies are inside the timing), computing accuracy and mean cross entropy exactly;
* the flax recipe: ``flax.jax_utils.pad_shard_unpad`` around a pmapped forward pass
  (``min_device_batch`` so the last batch does not recompile), logits to the host and the
  metrics accumulated there with numpy;
* masked_eval pmap with ``checkpoint_dir`` (a fresh directory per call, so nothing is resumed)
  and ``checkpoint_every`` 10 and 1: the cost of checkpointing (formerly ``bench_checkpoint.py``).

Every variant gets the same replicated device params (placing 17 MB of params is not the
loop's cost). Each round runs every variant once (order rotated); reported per variant: the
median over rounds of its wall time divided by the same round's baseline, the ratio of best
wall times, and the median ratio of process CPU time (steadier when others share the cores).
Goals: masked_eval <= 1.10 x the bare loop (issue 64, on CPU); faster than the flax recipe.

Run: ``python -m benchmarks eval [--rounds 5] [--width 1024] [--batch 1024] [--steps 12] [--quick]``.
"""

import os

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import jax_utils  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import padded_eval as pe  # noqa: E402
from benchmarks import _models  # noqa: E402
from benchmarks.common import host_metrics, two_in_flight  # noqa: E402

METRICS = pe.Metrics({"accuracy": pe.metrics.Accuracy(), "loss": pe.metrics.Mean("loss")})


def eval_step(params, batch):
  logits = _models.mlp_apply(params, batch["x"])
  loss = _models.cross_entropy(logits, batch["label"])
  return METRICS.batch_updates(preds=logits, target=batch["label"], loss=loss, mask=batch["mask"])


def make_variants(args):
  """``{name: fn() -> result}`` over one dataset; the data is prepared here, outside timing."""
  sizes = (args.features,) + (args.width,) * args.depth + (args.classes,)
  host_params = _models.mlp_params(sizes)
  num_rows = args.steps * args.batch - args.batch // 3  # a short last batch
  data = _models.classification_data(num_rows, args.features, args.classes)
  devices = jax.local_devices()
  num_devices = len(devices)
  mesh = Mesh(np.array(devices), ("batch",))
  replicated = NamedSharding(mesh, PartitionSpec())

  padded = list(pe.pad_batches(data, args.batch))  # host numpy batches with masks
  device_batches = [
    jax.device_put(pe.shard(b, num_devices), NamedSharding(mesh, PartitionSpec("batch")))
    for b in padded
  ]
  device_params = jax.device_put(host_params, replicated)
  forward = jax.pmap(lambda p, b: _models.mlp_apply(p, b["x"]), "batch", in_axes=(None, 0))

  def bare_wait_each():
    for batch in device_batches:
      forward(device_params, batch).block_until_ready()

  def bare_wait_previous():
    two_in_flight(lambda batch: forward(device_params, batch), device_batches)

  def masked(backend, steps_in_flight=None):
    return lambda: pe.masked_eval(
      eval_step, device_params, padded, backend=backend, steps_in_flight=steps_in_flight
    )

  def checkpointed(every):
    def run():
      with tempfile.TemporaryDirectory() as directory:  # fresh: nothing is resumed
        return pe.masked_eval(
          eval_step, device_params, padded, checkpoint_dir=directory, checkpoint_every=every
        )

    return run

  flax_forward = jax_utils.pad_shard_unpad(
    jax.pmap(lambda p, x: _models.mlp_apply(p, x), "batch", in_axes=(None, 0))
  )
  raw_batches = [
    {k: v[i : i + args.batch] for k, v in data.items()} for i in range(0, num_rows, args.batch)
  ]

  def flax_host_metrics():
    correct, loss_sum, count = 0, 0.0, 0
    for batch in raw_batches:
      logits = flax_forward(device_params, batch["x"], min_device_batch=args.batch // num_devices)
      batch_correct, batch_loss = host_metrics(logits, batch["label"])
      correct, loss_sum = correct + batch_correct, loss_sum + batch_loss
      count += len(batch["label"])
    return {"accuracy": correct / count, "loss": loss_sum / count, "num_examples": count}

  variants = {
    "bare pmap, wait each step": bare_wait_each,
    "bare pmap, wait step t-1": bare_wait_previous,
    "masked_eval pmap": masked("pmap"),
    "masked_eval pmap, 1 step in flight": masked("pmap", 1),
    "masked_eval shard_map": masked("shard_map"),
    "masked_eval jit": masked("jit"),
    "masked_eval pmap, checkpoint every 10 steps": checkpointed(10),
    "masked_eval pmap, checkpoint every step": checkpointed(1),
    "flax pad_shard_unpad + host metrics": flax_host_metrics,
  }
  return variants, num_rows


BASELINES = ("bare pmap, wait each step", "bare pmap, wait step t-1")


def run(args):
  variants, num_rows = make_variants(args)
  results = {name: fn() for name, fn in variants.items()}  # warm-up: compile everything
  reference = results["flax pad_shard_unpad + host metrics"]
  for name in (n for n in results if n.startswith("masked_eval")):
    got = results[name]
    assert got["num_examples"] == num_rows == reference["num_examples"], (got, reference)
    assert abs(got["accuracy"] - reference["accuracy"]) < 1e-6, (got, reference)
    assert abs(got["loss"] - reference["loss"]) < 1e-4 * abs(reference["loss"]), (got, reference)

  wall = {name: [] for name in variants}
  cpu = {
    name: [] for name in variants
  }  # process CPU seconds: steadier than wall on a shared machine
  names = list(variants)
  for round_index in range(args.rounds):
    order = names[round_index % len(names) :] + names[: round_index % len(names)]
    for name in order:
      start_wall, start_cpu = time.perf_counter(), time.process_time()
      variants[name]()
      wall[name].append(time.perf_counter() - start_wall)
      cpu[name].append(time.process_time() - start_cpu)

  print(
    f"MLP {args.features}->{args.width}x{args.depth}->{args.classes}, batch {args.batch}, "
    f"{args.steps} steps ({num_rows} real rows), {jax.local_device_count()} devices, "
    f"{args.rounds} rounds"
  )
  print(
    f"{'variant':38s} {'wall ms':>8s} {'wall ratio':>10s} {'best':>6s} {'cpu ms':>8s} {'cpu ratio':>9s}"
  )
  base_wall = [min(pair) for pair in zip(*(wall[b] for b in BASELINES))]
  base_cpu = [min(pair) for pair in zip(*(cpu[b] for b in BASELINES))]
  for name in names:
    wall_ratio = statistics.median([t / b for t, b in zip(wall[name], base_wall)])
    cpu_ratio = statistics.median([t / b for t, b in zip(cpu[name], base_cpu)])
    print(
      f"{name:38s} {statistics.median(wall[name]) * 1e3:8.0f} {wall_ratio:10.3f} "
      f"{min(wall[name]) / min(base_wall):6.3f} {statistics.median(cpu[name]) * 1e3:8.0f} "
      f"{cpu_ratio:9.3f}"
    )
  flax = "flax pad_shard_unpad + host metrics"
  for name in (n for n in names if n.startswith("masked_eval")):
    print(
      f"{name} / flax recipe: wall median "
      f"{statistics.median([t / f for t, f in zip(wall[name], wall[flax])]):.3f}, cpu median "
      f"{statistics.median([t / f for t, f in zip(cpu[name], cpu[flax])]):.3f}"
    )


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--width", type=int, default=1024)
  parser.add_argument("--depth", type=int, default=4)
  parser.add_argument("--features", type=int, default=256)
  parser.add_argument("--classes", type=int, default=10)
  parser.add_argument("--batch", type=int, default=1024)
  parser.add_argument("--steps", type=int, default=12)
  parser.add_argument(
    "--quick", action="store_true", help="width 64, 3 steps, 2 rounds (a smoke test)"
  )
  args = parser.parse_args()
  if args.quick:
    args.width, args.depth, args.batch, args.steps, args.rounds = 64, 2, 256, 3, 2
  run(args)


if __name__ == "__main__":
  main()
