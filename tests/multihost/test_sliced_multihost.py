"""Sliced and compare across 2 jax.distributed processes: the same results as one process.

Two workers (tests/multihost/_sliced_worker.py) evaluate models A and B with a sliced Bootstrap
over their shares of the rows (global row ids); the per-slice logs and the paired comparison must
equal one process's over all rows (bounds to float rounding), on both processes and backends.
"""

import _sliced_worker as worker
import numpy as np
import pytest
from test_bootstrap_multihost import run_workers

import padded_eval as pe

pytestmark = pytest.mark.multihost


def test_two_processes_give_the_single_process_slices_and_comparison():
  data = worker.make_data()
  n = len(data["y"])
  index = np.arange(n, dtype=np.int32)
  runs = {
    model: worker.make_metric().update(
      preds=data[model], target=data["y"], slice=data["slice"], index=index
    )
    for model in ("a", "b")
  }
  logs = {k: np.asarray(v, np.float64) for k, v in runs["b"].compute_logs().items()}
  compared = pe.metrics.compare(runs["a"], runs["b"])
  assert (
    np.isnan(compared["difference"][2]) and not np.isnan(compared["difference"][[0, 1, 3]]).any()
  )
  lines = run_workers(worker_path=worker.__file__)
  assert sorted((line["backend"], line["process"]) for line in lines) == [
    ("jit", 0),
    ("jit", 1),
    ("pmap", 0),
    ("pmap", 1),
  ]
  for line in lines:
    assert line["logs"]["num_examples"] == n
    for key, value in logs.items():
      np.testing.assert_allclose(line["logs"][key], value, rtol=1e-6, equal_nan=True)
    for key, value in compared.items():
      np.testing.assert_allclose(line["compare"][key], value, rtol=1e-6, atol=1e-7, equal_nan=True)
