"""masked_eval's fixed cost per call (issue #19): small N, all three backends, against bare loops.

The scaling benchmark's setup (MLP 32-64-10, accuracy, batches of 1000, 8 virtual CPU devices),
at N = 1,000 and 10,000. Baselines, timed in the same rounds: the scaling benchmark's bare pmap
loop (host-sharded batches, params passed as they are), and a bare jit loop over the same padded
batches (replicated params, each batch placed over the devices, one jitted accuracy). Reported:
the median over interleaved rounds of masked_eval's time divided by each baseline's.
"""

from __future__ import annotations

import os

if "device_count" not in os.environ.get("XLA_FLAGS", ""):  # run alone: 8 virtual devices
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import statistics  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import padded_eval as pe  # noqa: E402
from benchmarks import speed  # noqa: E402
from benchmarks.common import interleaved_seconds, markdown_table, shard_rows, split_rows  # noqa: E402

BATCH = 1000
SIZES = speed.Sizes(features=32, hidden=64, classes=10)
BACKENDS = ("pmap", "shard_map", "jit")


@jax.jit
def _bare_jit_step(params, batch):
  return jnp.sum(jnp.argmax(speed.mlp(params, batch["x"]), -1) == batch["y"])


def _bare_jit_loop(params, padded: list[dict], split) -> int:
  counts = []
  for b in padded:
    counts.append(_bare_jit_step(params, jax.device_put(b, split)))
    if len(counts) > 1:
      counts[-2].block_until_ready()
  return int(sum(jax.device_get(counts)))


def measure(n: int, rounds: int) -> dict:
  """{masked_eval backend: (median ratio to bare pmap loop, median ratio to bare jit loop)}."""
  params = speed.mlp_init(5, (SIZES.features, SIZES.hidden, SIZES.classes))
  data = speed._data(SIZES, n, seed=n)  # noqa: SLF001 - the scaling benchmark's data
  sharded = [shard_rows(b) for b in split_rows(data, BATCH)]
  mesh = Mesh(np.array(jax.devices()), ("batch",))
  # Placed once, as pe.place_params does (written with jax.device_put so that a tree without
  # place_params runs this benchmark too): the bare jit loop's params, and masked_eval's
  # "params placed once" rows.
  replicated = jax.device_put(params, NamedSharding(mesh, PartitionSpec()))
  padded = list(pe.pad_batches(data, BATCH))
  split = NamedSharding(mesh, PartitionSpec("batch"))
  fns = {
    "bare pmap": lambda: speed._bare_loop(params, sharded, True),  # noqa: SLF001
    "bare jit": lambda: _bare_jit_loop(replicated, padded, split),
  }
  for backend in BACKENDS:
    for name, given in ((backend, params), (f"{backend}, params placed once", replicated)):
      fns[name] = lambda backend=backend, given=given: pe.masked_eval(
        speed._accuracy_step,  # noqa: SLF001
        given,
        pe.pad_batches(data, BATCH),
        backend=backend,
      )
  timings = interleaved_seconds(fns, rounds)
  ratios = {
    name: ([t[name] / t["bare pmap"] for t in timings], [t[name] / t["bare jit"] for t in timings])
    for name in fns
    if not name.startswith("bare")
  }
  return {k: (statistics.median(a), statistics.median(b)) for k, (a, b) in ratios.items()}


def run(quick: bool, log=print) -> tuple[str, dict]:
  """Returns (Markdown, {N: {backend: (ratio to bare pmap, ratio to bare jit)}})."""
  rounds = {10**3: 5, 10**4: 5} if quick else {10**3: 101, 10**4: 31}
  values = {}
  for n in (10**3, 10**4):
    log(f"bench_overhead: N={n}")
    values[n] = measure(n, rounds[n])
  rows = [
    [f"{n:,}", backend, f"{pmap:.2f}x", f"{jit:.2f}x"]
    for n, by_backend in values.items()
    for backend, (pmap, jit) in by_backend.items()
  ]
  table = markdown_table(
    ["N", "masked_eval backend", "/ bare pmap loop (scaling's)", "/ bare jit loop"], rows
  )
  note = (
    f"\nMLP {SIZES.features}-{SIZES.hidden}-{SIZES.classes}, batches of {BATCH}, accuracy; "
    f"median of {rounds[10**3]} (N=1,000) and {rounds[10**4]} (N=10,000) interleaved rounds "
    "of per-round ratios, after a warm-up. "
    "masked_eval's time includes pe.pad_batches; params are passed as uncommitted jax "
    "arrays (as in the scaling benchmark: each call replicates them), or, in the rows "
    '"params placed once", replicated before the rounds (pe.place_params; the bare jit '
    "loop's params). The 2 cores are shared with other jobs.\n"
  )
  return table + "\n" + note, values


if __name__ == "__main__":  # python -m benchmarks overhead [--quick]
  print(run("--quick" in sys.argv)[0])
