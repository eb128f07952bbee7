"""Per-example outputs: ``masked_eval(..., outputs=True)`` returning logits ``[N, C]``, against two baselines.

Same MLP classifier, same host batches, 8 virtual CPU devices; every variant ends with the real rows' logits on
the host (except "metric only") and is timed in the same process, order rotated every round:

* masked_eval, metric only: accuracy, no outputs (the cost of the metric pass alone);
* masked_eval, outputs=True: accuracy plus the logits, copied to the host asynchronously step by step;
* bare loop, device_get per step: a pmapped forward, ``jax.device_get`` of each step's logits (a blocking copy),
  the padding dropped on the host, concatenated at the end (what the Flax examples do by hand).

Reported: median wall time over rounds, ratios to "metric only" and to the bare loop, and the peak of live device
bytes (the buffers of ``jax.live_arrays()``, each counted once, sampled as each batch is read, minus the bytes live before the call) at N/2 and N
rows: flat in N means the outputs do not accumulate on the devices.

Run alone: ``python -m benchmarks outputs [--quick]``; ``python -m benchmarks`` includes it.
"""

from __future__ import annotations

import os

if __name__ == "__main__":  # standalone: 8 virtual devices, set before JAX initialises
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

import padded_eval as pe  # noqa: E402
from benchmarks import _models  # noqa: E402
from benchmarks.common import markdown_table, shard_rows  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Sizes:
  rows: int = 32768 - 333  # a short last batch
  batch: int = 1024
  features: int = 128
  hidden: int = 512
  classes: int = 1000
  rounds: int = 5


FULL = Sizes()
QUICK = Sizes(rows=4096 - 77, batch=512, features=32, hidden=64, classes=100, rounds=2)
METRIC_ONLY, OUTPUTS, BARE = (
  "masked_eval, metric only",
  "masked_eval, outputs=True (logits)",
  "bare loop, device_get per step",
)


def _accuracy(logits, batch):
  return pe.metrics.Accuracy().batch_updates(
    preds=logits, target=batch["label"], mask=batch["mask"]
  )


def metric_step(params, batch):
  return _accuracy(_models.mlp_apply(params, batch["x"]), batch)


def outputs_step(params, batch):
  logits = _models.mlp_apply(params, batch["x"])
  return _accuracy(logits, batch), {"logits": logits}


def make_variants(sizes: Sizes, rows: int, backend: str, sample=None) -> dict:
  """``{name: fn() -> logits or results}``; ``sample()`` (if given) runs as each batch is read."""
  data = _models.classification_data(rows, sizes.features, sizes.classes)
  host_params = _models.mlp_params((sizes.features, sizes.hidden, sizes.hidden, sizes.classes))
  mesh = jax.sharding.Mesh(np.array(jax.local_devices()), ("batch",))
  params = jax.device_put(
    host_params, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  )
  padded = list(pe.pad_batches(data, sizes.batch))
  forward = jax.pmap(lambda p, x: _models.mlp_apply(p, x), "batch", in_axes=(None, 0))

  def sampled():
    for batch in padded:
      sample()
      yield batch

  def batches():  # a list (len known: masked_eval sizes its host buffers) unless memory is sampled
    return padded if sample is None else sampled()

  def bare():
    kept = []
    for batch in batches():
      logits = jax.device_get(forward(params, shard_rows({"x": batch["x"]})["x"]))
      kept.append(logits.reshape(-1, sizes.classes)[batch["mask"]])
    return np.concatenate(kept)

  return {
    METRIC_ONLY: lambda: pe.masked_eval(metric_step, params, batches(), backend=backend),
    OUTPUTS: lambda: pe.masked_eval(outputs_step, params, batches(), backend=backend, outputs=True),
    BARE: bare,
  }


def live_device_bytes() -> int:
  """Bytes of the device buffers that live jax.Arrays hold, each buffer counted once.

  ``jax.live_arrays()`` also lists per-device views of a sharded array (e.g. after ``copy_to_host_async``),
  which share its buffers; buffers are told apart by (device, pointer).
  """
  buffers = {}
  for array in jax.live_arrays():
    for shard in array.addressable_shards:
      buffers[(shard.device.id, shard.data.unsafe_buffer_pointer())] = shard.data.nbytes
  return sum(buffers.values())


def peak_device_bytes(sizes: Sizes, rows: int, backend: str) -> dict[str, int]:
  """Per variant: the peak of live device bytes during one (warm) run, minus those live before it."""
  peaks = {}
  current = {"peak": 0}

  def sample():
    current["peak"] = max(current["peak"], live_device_bytes())

  variants = make_variants(sizes, rows, backend, sample)
  for name, fn in variants.items():
    jax.block_until_ready(fn())  # compile outside the measurement
    before = live_device_bytes()
    current["peak"] = before
    result = fn()
    jax.block_until_ready(result)
    peaks[name] = current["peak"] - before
    del result
  return peaks


def check(variants: dict, rows: int) -> None:
  """All variants agree: the same logits, exactly num_examples rows."""
  results, logits = variants[OUTPUTS]()
  bare = variants[BARE]()
  assert logits["logits"].shape == bare.shape and len(bare) == rows, (
    logits["logits"].shape,
    bare.shape,
  )
  np.testing.assert_allclose(logits["logits"], bare, rtol=1e-5, atol=1e-5)
  assert results == variants[METRIC_ONLY](), "outputs=True changed the metric"


def timed(variants: dict, rounds: int) -> dict[str, dict[str, list[float]]]:
  """Wall and process CPU seconds of each variant per round (after one warm-up round), order rotated."""
  for fn in variants.values():
    jax.block_until_ready(fn())
  names = list(variants)
  times = {"wall": {n: [] for n in names}, "cpu": {n: [] for n in names}}
  for r in range(rounds):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      wall, cpu = time.perf_counter(), time.process_time()
      jax.block_until_ready(variants[name]())
      times["wall"][name].append(time.perf_counter() - wall)
      times["cpu"][name].append(time.process_time() - cpu)
  return times


def _ratio(samples: list[float], base: list[float]) -> float:
  """Median over rounds of the per-round ratio."""
  return statistics.median([a / b for a, b in zip(samples, base)])


def run(quick: bool, log=print) -> tuple[str, dict]:
  """The table (Markdown) and ``{"seconds", "ratios", "peak_bytes"}`` per backend."""
  sizes = QUICK if quick else FULL
  values = {"seconds": {}, "ratios": {}, "peak_bytes": {}}
  rows_out = []
  for backend in ("pmap", "jit"):
    log(f"outputs: timing {backend}")
    variants = make_variants(sizes, sizes.rows, backend)
    check(variants, sizes.rows)
    times = timed(variants, sizes.rounds)
    wall, cpu = times["wall"], times["cpu"]
    values["seconds"][backend] = {name: statistics.median(t) for name, t in wall.items()}
    values["ratios"][backend] = {
      "outputs / metric only": _ratio(wall[OUTPUTS], wall[METRIC_ONLY]),
      "outputs / bare device_get loop": _ratio(wall[OUTPUTS], wall[BARE]),
      "cpu outputs / metric only": _ratio(cpu[OUTPUTS], cpu[METRIC_ONLY]),
      "cpu outputs / bare device_get loop": _ratio(cpu[OUTPUTS], cpu[BARE]),
    }
    log(f"outputs: peak device bytes {backend}")
    half = peak_device_bytes(sizes, sizes.rows // 2, backend)
    full = peak_device_bytes(sizes, sizes.rows, backend)
    values["peak_bytes"][backend] = {"half": half, "full": full}
    for name in (METRIC_ONLY, OUTPUTS, BARE):
      rows_out.append(
        [
          f"{name} ({backend})" if name != BARE else f"{name} (pmap forward)",
          f"{statistics.median(wall[name]) * 1e3:.0f}",
          f"{_ratio(wall[name], wall[METRIC_ONLY]):.2f} / {_ratio(cpu[name], cpu[METRIC_ONLY]):.2f}",
          f"{_ratio(wall[name], wall[BARE]):.2f} / {_ratio(cpu[name], cpu[BARE]):.2f}",
          f"{half[name] / 2**20:.1f}",
          f"{full[name] / 2**20:.1f}",
        ]
      )
  logits_mb = sizes.rows * sizes.classes * 4 / 2**20
  header = [
    f"variant (N={sizes.rows}, batch {sizes.batch}, C={sizes.classes}, "
    f"{jax.local_device_count()} devices)",
    "median wall ms",
    "wall / cpu ratio to metric only",
    "wall / cpu ratio to bare device_get loop",
    f"peak device MiB, N={sizes.rows // 2}",
    f"peak device MiB, N={sizes.rows}",
  ]
  markdown = (
    markdown_table(header, rows_out)
    + f"\n\nRatios are medians over {sizes.rounds} rounds of per-round ratios (wall time, and process CPU "
    f"time, steadier on a shared machine). The logits of all N rows are {logits_mb:.0f} MiB; peak device "
    "memory is the maximum of the bytes of the buffers of `jax.live_arrays()` (each buffer once), "
    "sampled as each batch is read, above what was live before the call.\n"
  )
  return markdown, values


def summary(values: dict) -> str:
  """One Markdown bullet with the measured ratios and peak device memory."""
  parts = []
  for backend, ratios in values["ratios"].items():
    peaks = values["peak_bytes"][backend]["full"]
    parts.append(
      f"{backend}: {ratios['outputs / metric only']:.2f}x the metric-only pass, "
      f"{ratios['outputs / bare device_get loop']:.2f}x the bare device_get loop (CPU time "
      f"{ratios['cpu outputs / metric only']:.2f}x, {ratios['cpu outputs / bare device_get loop']:.2f}x), "
      "peak device "
      f"{peaks[OUTPUTS] / 2**20:.1f} MiB (metric only {peaks[METRIC_ONLY] / 2**20:.1f} MiB)"
    )
  return "- masked_eval(outputs=True) returning logits: " + "; ".join(parts) + "."


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
  markdown, values = run(parser.parse_args().quick)
  print(markdown)
  for backend, ratios in values["ratios"].items():
    print(backend, {k: round(v, 3) for k, v in ratios.items()})


if __name__ == "__main__":
  main()
