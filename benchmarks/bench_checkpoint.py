"""The cost of ``masked_eval(checkpoint_dir=..., checkpoint_every=N)``, as a ratio to no checkpointing.

One MLP classifier (inputs -> width x 2 -> classes) on 8 virtual CPU devices (pmap), exact accuracy and mean
loss; each round runs every variant once in the same process (order rotated): no checkpoint, every 100 steps,
every 10 steps, every step (a fresh directory each time, so nothing is resumed). Reported: the median over rounds
of each variant's wall time divided by the same round's no-checkpoint time, the ratio of best times, and the
median ratio of process CPU time (steadier when other processes share the cores).

Then how long a resume takes to skip 10,000 consumed batches: a Mapping behind ``pe.pad_batches`` (seeks: views)
and a plain generator (read and dropped), and the same generator behind ``pe.pad_batches`` (dropped unpadded).

Run: ``python benchmarks/bench_checkpoint.py [--rounds 5] [--steps 200]``.
"""

import os

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
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


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--steps", type=int, default=200)
  args = parser.parse_args()
  speed(args.rounds, args.steps)
  skipping()
  resume_time()
