"""The cost of ``masked_eval(checkpoint_dir=..., checkpoint_every=N)``, as a ratio to no checkpointing.

One MLP classifier (inputs -> width x 2 -> classes) on 8 virtual CPU devices (pmap), exact accuracy and mean
loss; each round runs every variant once in the same process (order rotated): no checkpoint, every 100 steps,
every 10 steps, every step (a fresh directory each time, so nothing is resumed). Reported: the median over rounds
of each variant's wall time divided by the same round's no-checkpoint time, the ratio of best times, and the
median ratio of process CPU time (steadier when other processes share the cores).

Then how long a resume takes to skip 10,000 consumed batches: a Mapping behind ``pe.pad_batches`` (seeks: views)
and a plain generator (read and dropped), and the same generator behind ``pe.pad_batches`` (dropped unpadded).

Then the cost of the params checksum (`padded_eval.eval.fingerprint.params_checksum`, computed once per call with a
directory) on a ~100M-parameter tree (24 float32 leaves of 2048 x 2048), as a ratio to one step of the MLP above
(its median time per step in a ``masked_eval`` call, measured in the same rounds), and in milliseconds (wall and
process CPU time: other processes share the cores): the tree on one device (what the checksum reads of replicated
params) and sharded over the 8 devices (FSDP params, jit); and, for scale, to one forward step of the model those
params make (64 rows through the 24 layers, relu, on one device).

Run: ``python benchmarks/bench_checkpoint.py [--rounds 5] [--steps 200] [--checksum-only]``.
"""

import os

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import functools  # noqa: E402
import itertools  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import padded_eval as pe  # noqa: E402

FEATURES, WIDTH, CLASSES, BATCH = 64, 256, 10, 512


def params():
  rng = np.random.default_rng(0)
  shapes = [(FEATURES, WIDTH), (WIDTH, WIDTH), (WIDTH, CLASSES)]
  return [rng.normal(size=s).astype(np.float32) / np.sqrt(s[0]) for s in shapes]


def step_fn(weights, batch):
  hidden = batch["x"]
  for w in weights[:-1]:
    hidden = jax.nn.relu(hidden @ w)
  logits = hidden @ weights[-1]
  loss = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["label"][:, None], axis=-1)[:, 0]
  return pe.Metrics(
    {"accuracy": pe.metrics.Accuracy(), "loss": pe.metrics.Mean(name="loss")}
  ).batch_updates(preds=logits, target=batch["label"], values=loss, mask=batch["mask"])


def speed(rounds, steps):
  rng = np.random.default_rng(1)
  rows = steps * BATCH - 100
  data = {
    "x": rng.normal(size=(rows, FEATURES)).astype(np.float32),
    "label": rng.integers(0, CLASSES, rows).astype(np.int32),
  }
  batches = list(pe.pad_batches(data, BATCH))
  weights = params()
  variants = {"none": None, "every 100": 100, "every 10": 10, "every 1": 1}
  pe.masked_eval(step_fn, weights, batches)  # compile
  ratios = {name: [] for name in variants}
  cpu_ratios = {name: [] for name in variants}
  best = {name: float("inf") for name in variants}
  results = {}
  for round_index in range(rounds):
    names = list(variants)
    names = names[round_index % len(names) :] + names[: round_index % len(names)]
    times, cpu = {}, {}
    for name in names:
      with tempfile.TemporaryDirectory() as directory:
        every = variants[name]
        kwargs = {} if every is None else dict(checkpoint_dir=directory, checkpoint_every=every)
        start, start_cpu = time.perf_counter(), time.process_time()
        results[name] = pe.masked_eval(step_fn, weights, batches, **kwargs)
        times[name] = time.perf_counter() - start
        cpu[name] = time.process_time() - start_cpu
        best[name] = min(best[name], times[name])
    for name in variants:
      ratios[name].append(times[name] / times["none"])
      cpu_ratios[name].append(cpu[name] / cpu["none"])
  assert all(result == results["none"] for result in results.values())  # bit-identical
  print(f"checkpoint cost, {steps} steps of {BATCH} rows, pmap on 8 CPU devices, {rounds} rounds:")
  for name in variants:
    print(
      f"  {name:>10}: median wall ratio {statistics.median(ratios[name]):.3f}, best-time ratio "
      f"{best[name] / best['none']:.3f}, median CPU-time ratio {statistics.median(cpu_ratios[name]):.3f}"
      f" (no checkpointing: best {best['none']:.3f} s)"
    )


def skipping(count=10_000, rows=8):
  data = {"x": np.zeros((count * rows + 3, 4), np.float32)}
  chunks = [{"x": data["x"][i : i + rows]} for i in range(0, count * rows + 3, rows)]

  def timed(make):
    start = time.perf_counter()
    iterator = make()
    next(iterator)
    return time.perf_counter() - start

  mapping = timed(lambda: pe.pad_batches(data, rows, num_devices=1).skip(count))
  generator = timed(lambda: itertools.islice(iter(chunks), count, None))
  padded_generator = timed(lambda: pe.pad_batches(iter(chunks), rows, num_devices=1).skip(count))
  print(f"resume: skipping {count} batches of {rows} rows took")
  print(f"  Mapping via pe.pad_batches (seek):             {mapping * 1e3:8.2f} ms")
  print(f"  plain generator of padded batches (read, dropped): {generator * 1e3:8.2f} ms")
  print(f"  generator via pe.pad_batches (rows dropped):   {padded_generator * 1e3:8.2f} ms")


def resume_time(count=10_000, rows=8):
  """Seconds for a resume that skips `count` consumed batches and evaluates the last one, end to end, from a
  Mapping behind pe.pad_batches and from a plain generator of padded batches; and a 1-batch evaluation."""
  data = {"x": np.arange((count * rows + 3) * 4, dtype=np.float32).reshape(-1, 4)}

  def step(params, batch):
    return pe.metrics.Mean().batch_updates(values=batch["x"][:, 0] * params, mask=batch["mask"])

  def generator(stop_at=None):
    for index, batch in enumerate(pe.pad_batches(data, rows)):
      if index == stop_at:
        raise KeyboardInterrupt
      yield {key: np.copy(value) for key, value in batch.items()}

  with tempfile.TemporaryDirectory() as root:
    saved = os.path.join(root, "saved")
    try:
      pe.masked_eval(step, 1.0, generator(count), checkpoint_dir=saved, checkpoint_every=count)
    except KeyboardInterrupt:
      pass
    expected = pe.masked_eval(step, 1.0, pe.pad_batches(data, rows))
    sources = {
      "Mapping via pe.pad_batches": lambda: pe.pad_batches(data, rows),
      "plain generator": generator,
    }
    start = time.perf_counter()
    pe.masked_eval(step, 1.0, pe.pad_batches({"x": data["x"][:3]}, rows))
    print(
      f"resume: a 1-batch evaluation takes {time.perf_counter() - start:.3f} s; a resume that skips {count}"
    )
    for name, make in sources.items():
      directory = os.path.join(root, name)
      shutil.copytree(saved, directory)
      start = time.perf_counter()
      result = pe.masked_eval(step, 1.0, make(), checkpoint_dir=directory, checkpoint_every=count)
      print(f"  batches of {rows} rows from a {name}: {time.perf_counter() - start:.3f} s")
      assert result == expected


def checksum_cost(rounds, steps, leaves=24, side=2048):
  """The params checksum of a ``leaves x side x side`` float32 tree against one MLP step (ratio and ms)."""
  from jax.sharding import NamedSharding, PartitionSpec

  from padded_eval.eval.fingerprint import params_checksum

  rng = np.random.default_rng(2)
  tree = [rng.standard_normal((side, side), np.float32) for _ in range(leaves)]
  size = leaves * side * side
  mesh = jax.make_mesh((jax.device_count(),), ("fsdp",))
  layouts = {
    "one device": jax.device_put(tree, jax.devices()[0]),
    "sharded over 8": jax.device_put(tree, NamedSharding(mesh, PartitionSpec("fsdp"))),
  }
  del tree
  data = {
    "x": rng.normal(size=(steps * BATCH - 100, FEATURES)).astype(np.float32),
    "label": rng.integers(0, CLASSES, steps * BATCH - 100).astype(np.int32),
  }
  batches, weights = list(pe.pad_batches(data, BATCH)), params()
  pe.masked_eval(step_fn, weights, batches)  # compile
  first = {}
  for name, placed in layouts.items():  # compile (and trace) once per layout
    start = time.perf_counter()
    digest = params_checksum(placed)
    first[name] = time.perf_counter() - start
  ratios, cpu_ratios = {name: [] for name in layouts}, {name: [] for name in layouts}
  millis, cpu_millis = {name: [] for name in layouts}, {name: [] for name in layouts}
  per_step, cpu_per_step, forward_ratios = [], [], []
  big = layouts["one device"]
  forward = jax.jit(lambda layers, x: functools.reduce(lambda h, w: jax.nn.relu(h @ w), layers, x))
  rows = jax.device_put(rng.standard_normal((64, side), np.float32), jax.devices()[0])
  forward(big, rows).block_until_ready()  # compile
  for _ in range(rounds):
    start = time.perf_counter()
    forward(big, rows).block_until_ready()
    forward_s = time.perf_counter() - start
    start = time.perf_counter()
    params_checksum(big)
    forward_ratios.append((time.perf_counter() - start) / forward_s)
    start, start_cpu = time.perf_counter(), time.process_time()
    pe.masked_eval(step_fn, weights, batches)
    step_s = (time.perf_counter() - start) / len(batches)
    step_cpu = (time.process_time() - start_cpu) / len(batches)
    per_step.append(step_s)
    cpu_per_step.append(step_cpu)
    for name, placed in layouts.items():
      start, start_cpu = time.perf_counter(), time.process_time()
      assert params_checksum(placed) == digest  # the same value wherever the leaves lie
      elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
      ratios[name].append(elapsed / step_s)
      cpu_ratios[name].append(elapsed_cpu / step_cpu)
      millis[name].append(elapsed * 1e3)
      cpu_millis[name].append(elapsed_cpu * 1e3)
  median = statistics.median
  print(
    f"params checksum of {size / 1e6:.1f}M float32 parameters ({leaves} leaves of {side} x {side}), "
    f"{rounds} rounds; one MLP step ({BATCH} rows, pmap on 8 CPU devices, {len(batches)} steps per "
    f"call): median {median(per_step) * 1e3:.2f} ms wall, {median(cpu_per_step) * 1e3:.2f} ms CPU"
  )
  for name in layouts:
    print(
      f"  {name:>14}: median {median(millis[name]):.0f} ms wall = {median(ratios[name]):.0f} MLP "
      f"steps; {median(cpu_millis[name]):.0f} ms CPU = {median(cpu_ratios[name]):.0f} MLP steps' "
      f"CPU (first call, with its compilation: {first[name] * 1e3:.0f} ms wall)"
    )
  print(
    f"  against one forward step of the 100M model (64 rows, one device): median ratio "
    f"{median(forward_ratios):.2f}"
  )


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--checksum-only", action="store_true")
  args = parser.parse_args()
  if not args.checksum_only:
    speed(args.rounds, args.steps)
    skipping()
    resume_time()
  checksum_cost(args.rounds, args.steps)
