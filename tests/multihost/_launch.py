"""Starting the multi-host tests' worker processes, and joining them to their jax.distributed session.

The test side: `free_port`, `worker_env` (this checkout's padded_eval, 2 CPU devices per process
chosen by the worker, the suite's other XLA flags), `run_workers` (start ``count`` processes of one
worker script, wait, assert each exited 0, return their JSON lines) and
`assert_every_backend_on_every_process`. The worker side: `join`, which reads ``PORT
NUM_PROCESSES PROCESS_ID`` from the command line and initializes jax.distributed over gloo, and
`serve`, a worker's whole main around its ``lines(process)``.
"""

import json
import os
import socket
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def worker_env(**extra: str) -> dict:
  """The workers' environment: not conftest's 8 virtual devices (the workers choose 2 each); this
  checkout's padded_eval, the one the test imports; ``extra`` on top."""
  from _worker_flags import worker_xla_flags  # tests/ (on the tests' path, not on the workers')

  env = dict(os.environ, XLA_FLAGS=worker_xla_flags())
  env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1", **extra)
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
  return env


def run_workers(worker_path: str, count: int = 2, args=(), deadline_s: float = 240) -> list:
  """Runs ``count`` processes of ``worker_path PORT COUNT PROCESS *args``; asserts each exited 0;
  returns every JSON line (``{...}``) they printed, process 0's first."""
  env, port = worker_env(), str(free_port())
  procs = [
    subprocess.Popen(
      [sys.executable, worker_path, port, str(count), str(p), *args],
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      env=env,
    )
    for p in range(count)
  ]
  outputs = []
  try:
    for proc in procs:
      out, err = proc.communicate(timeout=deadline_s)
      assert proc.returncode == 0, err[-3000:]
      outputs += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
  return outputs


def assert_every_backend_on_every_process(lines, backends=("jit", "pmap"), count=2):
  """One line per backend and process, no more."""
  got = sorted((line["backend"], line["process"]) for line in lines)
  assert got == [(b, p) for b in sorted(backends) for p in range(count)], got


def join(devices: int = 2, config=(), **initialize):
  """In a worker: ``(jax, process count, process index)`` once jax.distributed is initialized on
  ``127.0.0.1:PORT`` (the command line's ``PORT NUM_PROCESSES PROCESS_ID``), ``devices`` CPU
  devices per process, gloo collectives, the ``config`` pairs set before and ``initialize`` passed
  to ``jax.distributed.initialize`` (its ``initialization_timeout`` 60 s unless given)."""
  port, count, process = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.config.update("jax_num_cpu_devices", devices)
  for name, value in config:
    jax.config.update(name, value)
  initialize.setdefault("initialization_timeout", 60)
  jax.distributed.initialize(f"127.0.0.1:{port}", count, process, **initialize)
  return jax, count, process


def serve(lines):
  """A worker's main: `join`, print each of ``lines(process)`` as a JSON line, shut down."""
  jax, _, process = join()
  for line in lines(process):
    print(json.dumps(line), flush=True)
  jax.distributed.shutdown()
