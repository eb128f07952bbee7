"""``python -m benchmarks multihost``: what multi-host agreement costs as the process count P grows (#21).

Three measurements, printed as the Markdown of RESULTS.md's #21 section:

1. **Requests at the coordinator**, P = 2 ... 4,096 simulated processes (threads) against a counting stand-in for
   the coordination client (tests/_counting_client.py): the pre-flight before #21 (every process read every other
   process's record, `padded_eval.multihost._coordination.exchange` at commit `BEFORE`, loaded from git) and after
   (`padded_eval.multihost._agreement.agree`). Also the bytes the coordinator sends back.
2. **Seconds**, P = 2, 4, 8, 16 real `jax.distributed` processes on 127.0.0.1 (one CPU device each, gloo): a
   pre-flight (`padded_eval.multihost.distributed.lockstep`), and one `masked_eval` step with known lengths (no per-step
   collective) and with a generator (the has-data flag's psum). ``--repo`` picks the checkout the processes import
   (the code before #21: ``git worktree add /tmp/before <BEFORE>``). Medians over calls and repeats, fitted to
   ``a + b * P`` and projected to P = 256, 1,024, 4,096.
3. **Collectives per step**: all-reduces in the compiled step of each backend with and without the has-data flag,
   on meshes of 2, 4 and 8 (virtual) devices: the flag adds one scalar all-reduce whatever the size.

Run: ``python -m benchmarks multihost [--quick]`` (not part of the full run: it spawns processes with their own
device count).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and sys.argv[1:2] != [
  "worker"
]:  # the driver: 8 virtual devices for part 3
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

import numpy as np  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
BEFORE = "1f27c1a"
"""The last commit before #21 (P*P pre-flight)."""
PROJECT_TO = (256, 1024, 4096)
BATCH = 8

sys.path.insert(0, str(REPO / "tests"))


# --- 1. requests at the coordinator (stub) ------------------------------------------------------------------


def _batch():
  return {"x": np.zeros((BATCH, 3), np.float32), "mask": np.ones(BATCH, bool)}


def _old_coordination(client, local: threading.local):
  """`padded_eval/coordination.py` at `BEFORE` (now `multihost/_coordination.py`), its client and
  process index/count read per thread."""
  source = subprocess.run(
    ["git", "-C", str(REPO), "show", f"{BEFORE}:padded_eval/coordination.py"],
    capture_output=True,
    text=True,
    check=True,
  ).stdout
  module = types.ModuleType("coordination_before")
  exec(compile(source, "coordination_before.py", "exec"), module.__dict__)
  module.service_client = lambda: client
  module.jax = types.SimpleNamespace(
    process_index=lambda: local.process, process_count=lambda: local.count
  )
  return module


def count_requests(count: int, before: bool) -> tuple[int, int]:
  """(requests, bytes sent back) of one pre-flight of ``count`` simulated processes."""
  from _counting_client import CountingClient, simulate

  from padded_eval.multihost._agreement import agree, record
  from padded_eval.multihost._coordination import Peers

  client = CountingClient(count)
  settings = {"backend": "pmap", "mask_key": "mask"}
  if before:
    local = threading.local()
    old = _old_coordination(client, local)

    def one(process):
      local.process, local.count = process, count
      payload = record(_batch(), "mask", 10, settings, None)
      return old.exchange(payload, "0/preflight", 600.0)

  else:

    def one(process):
      mine = record(_batch(), "mask", 10, settings, None)
      return agree(mine, "0/preflight", 600.0, "mask", None, Peers(client, process, count))

  threading.stack_size(256 * 1024)
  outcomes = simulate(count, one)
  errors = [o for o in outcomes if isinstance(o, Exception)]
  assert not errors, errors[:3]
  return client.requests, client.bytes_out


# --- 2. seconds with real processes -------------------------------------------------------------------------


def worker(port: int, count: int, process: int, calls: int, steps: int) -> None:
  """One process: ``calls`` pre-flights, then ``steps``-step masked_eval runs; prints one JSON line."""
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.config.update("jax_num_cpu_devices", 1)
  jax.config.update("jax_enable_preemption_service", False)
  jax.distributed.initialize(f"127.0.0.1:{port}", count, process, initialization_timeout=300)
  import padded_eval as pe
  from padded_eval.multihost import distributed

  settings = {"backend": "pmap", "mask_key": "mask"}
  preflight = []
  for _ in range(calls):
    start = time.perf_counter()
    options = distributed.FeedOptions("mask", settings, num_shards=1, timeout=600)
    distributed.lockstep(iter([_batch()]), 1, options)
    preflight.append(time.perf_counter() - start)
  rng = np.random.default_rng(process)
  rows = {"x": rng.normal(size=(steps * BATCH, 3)).astype(np.float32)}

  def step_fn(params, batch):
    return pe.metrics.Mean("x").batch_updates(x=batch["x"][:, 0], mask=batch["mask"])

  per_step = {}
  for _ in range(2):  # the first round compiles
    for kind in ("known", "flagged"):
      source = rows
      if kind == "flagged":
        source = ({"x": rows["x"][i : i + BATCH]} for i in range(0, steps * BATCH, BATCH))
      batches = pe.pad_batches(source, BATCH, num_devices=1)
      start = time.perf_counter()
      pe.masked_eval(step_fn, None, batches, backend="pmap", timeout=600)
      per_step[kind] = (time.perf_counter() - start) / steps
  line = {"process": process, "preflight": preflight, **per_step}
  print(json.dumps(line), flush=True)
  jax.distributed.shutdown()


def run_processes(count: int, repo: str, calls: int, steps: int) -> list[dict]:
  """Starts ``count`` workers importing padded_eval from ``repo``; their JSON lines."""
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=f"{repo}:{REPO}")
  args = [str(port), str(count), "", str(calls), str(steps)]
  procs = []
  for p in range(count):
    args[2] = str(p)
    command = [sys.executable, __file__, "worker", *args]
    procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd="/"))
  lines = []
  for proc in procs:
    out, _ = proc.communicate(timeout=1800)
    lines += [json.loads(t) for t in out.splitlines() if t.startswith("{")]
  if len(lines) != count:
    raise RuntimeError(f"{count - len(lines)} of {count} workers printed nothing")
  return lines


def seconds(counts, repo, calls, steps, repeats) -> dict[int, dict[str, float]]:
  """Medians per P: pre-flight seconds (slowest process per call), seconds per step known/flagged."""
  found = {}
  for count in counts:
    preflight, known, flagged = [], [], []
    for _ in range(repeats):
      lines = run_processes(count, repo, calls, steps)
      per_call = np.max([line["preflight"] for line in lines], axis=0)
      preflight += list(per_call[1:])  # the first call includes warm-up
      known.append(max(line["known"] for line in lines))
      flagged.append(max(line["flagged"] for line in lines))
    found[count] = {
      "preflight": statistics.median(preflight),
      "known": statistics.median(known),
      "flagged": statistics.median(flagged),
    }
    print(f"P={count}: {found[count]}", file=sys.stderr, flush=True)
  return found


REQUESTS = {"before": lambda p: p + p * p, "after": lambda p: 4 * p + 2}
"""Pre-flight requests at the coordinator per P (counted with the stub: `print_requests`)."""


def fit(xs, values) -> tuple[float, float]:
  """Least squares ``value = a + b * x``."""
  slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(values, float), 1)
  return float(intercept), float(slope)


def print_fits(found: dict, version: str) -> None:
  """Fits ``a + b * P`` and, for the pre-flight, ``a + t * requests(P)``; projects to `PROJECT_TO`."""
  counts = sorted(found)
  for name in ("preflight", "known", "flagged"):
    a, b = fit(counts, [found[c][name] for c in counts])
    projected = ", ".join(f"P={p:,}: {a + b * p:.3g} s" for p in PROJECT_TO)
    print(f"- {name}, linear in P: {1000 * a:.2f} ms + {1000 * b:.3f} ms * P; {projected}")
  requests = REQUESTS[version]
  a, t = fit([requests(c) for c in counts], [found[c]["preflight"] for c in counts])
  projected = ", ".join(f"P={p:,}: {a + t * requests(p):.3g} s" for p in PROJECT_TO)
  print(
    f"- preflight, linear in requests ({version}): {1000 * a:.2f} ms + {1e6 * t:.1f} us * requests; "
    + projected
  )


# --- 3. collectives per step ------------------------------------------------------------------------------


from _step_collectives import step_collectives  # noqa: E402  (tests/, on the path above)


def print_requests(stub_max: int, before_max: int) -> None:
  """The request table: simulated before up to ``before_max`` (checked against P + P*P), then the formula."""
  print("| P | requests before | requests after | bytes back before | bytes back after |")
  print("|---:|---:|---:|---:|---:|")
  count, before = 2, None
  while count <= stub_max:
    after = count_requests(count, False)
    if count <= before_max:
      before, before_count = count_requests(count, True), count
      assert before[0] == count + count * count, before  # one set and P gets per process
      requests, sent = f"{before[0]:,}", f"{before[1]:,}"
    elif before is None:  # a clone without the commit (shallow), or --before-max 0
      requests, sent = f"{count + count * count:,} (P + P*P)", "n/a"
    else:  # P records to each of P processes: bytes grow like P*P
      requests = f"{count + count * count:,} (P + P*P)"
      sent = f"~{before[1] * (count / before_count) ** 2:,.0f} (extrapolated)"
    print(f"| {count:,} | {requests} | {after[0]:,} | {sent} | {after[1]:,} |", flush=True)
    count *= 2


# --- report -------------------------------------------------------------------------------------------------


def main() -> None:
  if sys.argv[1:2] == ["worker"]:
    port, count, process, calls, steps = map(int, sys.argv[2:7])
    return worker(port, count, process, calls, steps)
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--counts", default="2,4,8,16", help="process counts to run")
  parser.add_argument("--repo", default=str(REPO), help="checkout the processes import")
  parser.add_argument("--calls", type=int, default=6, help="pre-flights per run")
  parser.add_argument("--steps", type=int, default=40, help="steps per masked_eval run")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--stub-max", type=int, default=4096, help="largest simulated P")
  parser.add_argument(
    "--before-max", type=int, default=1024, help="largest P simulated before #21 (P*P gets: slow)"
  )
  parser.add_argument("--parts", default="requests,collectives,seconds")
  parser.add_argument(
    "--version", choices=sorted(REQUESTS), default="after", help="what --repo holds"
  )
  parser.add_argument("--quick", action="store_true", help="P = 2 only, few calls (a smoke test)")
  args = parser.parse_args()
  if args.quick:
    args.counts, args.calls, args.steps, args.repeats = "2", 2, 4, 1
    args.stub_max, args.before_max = 64, 16
  known = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", BEFORE], capture_output=True)
  if known.returncode:
    print(f"(commit {BEFORE} is not in this clone: no simulated 'before' column)")
    args.before_max = 0
  parts = args.parts.split(",")
  if "requests" in parts:
    print_requests(args.stub_max, args.before_max)
  if "collectives" in parts:
    print("\n| backend | devices | all-reduces without flag | with flag |")
    print("|---|---:|---|---|")
    for backend in ("shard_map", "jit"):
      for devices in (2, 4, 8):
        without, with_flag = (step_collectives(backend, devices, f) for f in (False, True))
        print(
          f"| {backend} | {devices} | {len(without)}: {without} | {len(with_flag)}: {with_flag} |"
        )
    without, with_flag = (step_collectives("pmap", 8, f) for f in (False, True))
    print(f"| pmap | 8 | {len(without)}: {without} | {len(with_flag)}: {with_flag} |")
  if "seconds" in parts:
    counts = [int(c) for c in args.counts.split(",")]
    found = seconds(counts, args.repo, args.calls, args.steps, args.repeats)
    print(f"\nrepo {args.repo}; load average {os.getloadavg()}")
    print("\n| P | pre-flight (ms) | step, known lengths (ms) | step, has-data flag (ms) |")
    print("|---:|---:|---:|---:|")
    for count, row in found.items():
      ms = {k: 1000 * v for k, v in row.items()}
      print(f"| {count} | {ms['preflight']:.1f} | {ms['known']:.2f} | {ms['flagged']:.2f} |")
    if len(found) > 1:  # a line through one point is no fit
      print_fits(found, args.version)


if __name__ == "__main__":
  main()
