"""Bootstrap across 2 jax.distributed processes: the same logs as one process over all rows.

Two workers (tests/multihost/_bootstrap_worker.py) each evaluate their share of the rows with global row ids; their
point estimate and interval must equal a single-process Bootstrap over the union (interval bounds to float
rounding: they are quantiles of exact integer-count replicas), on both processes and both backends.
"""

import json
import os
import socket
import subprocess
import sys

import _bootstrap_worker as worker
import numpy as np
import pytest
from _worker_flags import worker_xla_flags

pytestmark = pytest.mark.multihost

WORKER = os.path.join(os.path.dirname(__file__), "_bootstrap_worker.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def run_workers(count=2, deadline_s=240, worker_path=WORKER):
  env = dict(os.environ, XLA_FLAGS=worker_xla_flags())  # the workers choose their devices
  env.update(JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
  # The workers import this checkout's padded_eval, the one the test imports.
  env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
  port = free_port()
  procs = [
    subprocess.Popen(
      [sys.executable, worker_path, str(port), str(count), str(p)],
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


def test_two_processes_give_the_single_process_interval():
  data = worker.make_data()
  n = len(data["y"])
  host = worker.make_metric().update(
    preds=data["x"], target=data["y"], index=np.arange(n, dtype=np.int32)
  )
  expected = {k: np.asarray(v) for k, v in host.compute_logs().items()}
  lines = run_workers()
  assert sorted((line["backend"], line["process"]) for line in lines) == [
    ("jit", 0),
    ("jit", 1),
    ("pmap", 0),
    ("pmap", 1),
  ]
  for line in lines:
    logs = line["logs"]
    assert logs["num_examples"] == n
    assert logs["f1score"] == expected["f1score"]
    for key in ("f1score_low", "f1score_high"):
      np.testing.assert_allclose(logs[key], expected[key], rtol=1e-6)
