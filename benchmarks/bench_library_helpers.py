"""Why padded_eval hand-writes what orbax and jax.experimental.multihost_utils also do (#28).

Measured, same machine, printed as Markdown for docs/architecture.md ("Well-kept libraries"):

1. **Checkpoint files**: one save of a small carried state (the 8 shards of an Accuracy + Mean
   state, host arrays) with orbax's ``StandardCheckpointer`` (save, then wait until finished)
   against `padded_eval.eval.checkpoint_files.write_state_file` (one file: JSON header, raw leaves,
   fsync, atomic rename); medians over interleaved rounds, and the ratio. Also the seconds to
   import ``orbax.checkpoint`` in a fresh interpreter against ``padded_eval``.
2. **The multi-host pre-flight**: 2 real `jax.distributed` processes on 127.0.0.1 (one CPU device
   each, gloo) exchange one 64-byte digest: through the coordination service's key-value store
   (set, barrier, get: what `padded_eval.multihost._agreement` does) against
   ``multihost_utils.process_allgather`` of the same bytes (a compiled device collective; first
   call with its compilation, then warm) and ``multihost_utils.sync_global_devices``.

Usage: ``python -m benchmarks.bench_library_helpers [--rounds R]`` (spawns its own processes).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _state_leaves() -> list[np.ndarray]:
  """The host leaves of 8 shards' Accuracy + Mean state (int32 limbs, float32 pairs)."""
  rng = np.random.default_rng(0)
  return [rng.integers(0, 100, (8, 2), dtype=np.int32) for _ in range(6)] + [
    rng.normal(size=(8, 2)).astype(np.float32) for _ in range(4)
  ]


def checkpoint_files(rounds: int) -> dict:
  import orbax.checkpoint as ocp

  from padded_eval.eval.checkpoint_files import write_state_file

  leaves, times = _state_leaves(), {"orbax": [], "padded_eval": []}
  with tempfile.TemporaryDirectory() as root:
    checkpointer = ocp.StandardCheckpointer()
    tree = {str(i): leaf for i, leaf in enumerate(leaves)}
    for r in range(rounds + 1):  # round 0 warms both up
      start = time.perf_counter()
      checkpointer.save(os.path.join(root, f"orbax_{r}"), tree)
      checkpointer.wait_until_finished()
      orbax_s = time.perf_counter() - start
      start = time.perf_counter()
      write_state_file(os.path.join(root, f"pe_{r}.state"), {"steps": r}, leaves)
      ours_s = time.perf_counter() - start
      if r:
        times["orbax"].append(orbax_s)
        times["padded_eval"].append(ours_s)
    checkpointer.close()
  imports = {
    name: _import_seconds(module)
    for name, module in (("orbax", "orbax.checkpoint"), ("padded_eval", "padded_eval"))
  }
  return {"save_s": {k: statistics.median(v) for k, v in times.items()}, "import_s": imports}


def _import_seconds(module: str) -> float:
  code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
  env = dict(os.environ, PYTHONPATH=ROOT)
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
  return float(done.stdout.strip().splitlines()[-1])


def worker(process: int, port: int, rounds: int) -> None:
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process)
  from jax.experimental import multihost_utils

  from padded_eval.multihost._coordination import service_client

  client = service_client()
  digest = np.frombuffer(bytes(range(64)), np.uint8)
  timings: dict[str, list[float]] = {"kv": [], "allgather": [], "sync": []}
  start = time.perf_counter()
  multihost_utils.process_allgather(digest)
  first_allgather = time.perf_counter() - start
  for r in range(rounds):
    start = time.perf_counter()
    client.key_value_set(f"bench/{r}/{process}", digest.tobytes().hex())
    client.wait_at_barrier(f"bench_barrier_{r}", 60_000)
    client.blocking_key_value_get(f"bench/{r}/{1 - process}", 60_000)
    timings["kv"].append(time.perf_counter() - start)
    start = time.perf_counter()
    multihost_utils.process_allgather(digest)
    timings["allgather"].append(time.perf_counter() - start)
    start = time.perf_counter()
    multihost_utils.sync_global_devices(f"bench_sync_{r}")
    timings["sync"].append(time.perf_counter() - start)
  if process == 0:
    medians = {k: statistics.median(v) for k, v in timings.items()}
    print(json.dumps({"first_allgather_s": first_allgather, **medians}), flush=True)
  jax.distributed.shutdown()


def pre_flight(rounds: int) -> dict:
  with socket.socket() as free:
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
  env = dict(os.environ, PYTHONPATH=ROOT, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  command = [sys.executable, "-m", "benchmarks.bench_library_helpers", "worker"]
  workers = [
    subprocess.Popen(
      [*command, str(p), str(port), str(rounds)],
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL,
      text=True,
    )
    for p in range(2)
  ]
  outputs = [w.communicate(timeout=300)[0] for w in workers]
  return json.loads(outputs[0].strip().splitlines()[-1])


def main(rounds: int) -> None:
  files = checkpoint_files(rounds)
  save, imports = files["save_s"], files["import_s"]
  print("| checkpoint file, one save | orbax StandardCheckpointer | padded_eval | ratio |")
  print("|---|---|---|---|")
  print(
    f"| small state, 8 shards | {save['orbax'] * 1e3:.2f} ms | {save['padded_eval'] * 1e3:.2f} ms "
    f"| {save['orbax'] / save['padded_eval']:.0f}x |"
  )
  print(
    f"| import, fresh interpreter | {imports['orbax']:.2f} s | {imports['padded_eval']:.2f} s | "
    f"{imports['orbax'] / imports['padded_eval']:.1f}x |"
  )
  flight = pre_flight(rounds)
  print()
  print("| 2 processes, one 64-byte digest | median |")
  print("|---|---|")
  print(f"| key-value store: set, barrier, get (padded_eval) | {flight['kv'] * 1e3:.2f} ms |")
  print(
    f"| multihost_utils.process_allgather, first call | {flight['first_allgather_s'] * 1e3:.1f} ms |"
  )
  print(f"| multihost_utils.process_allgather, warm | {flight['allgather'] * 1e3:.2f} ms |")
  print(f"| multihost_utils.sync_global_devices | {flight['sync'] * 1e3:.2f} ms |")


if __name__ == "__main__":
  if sys.argv[1:2] == ["worker"]:
    worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
  else:
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 9
    main(rounds)
