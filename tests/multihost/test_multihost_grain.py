"""masked_eval over grain datasets sharded across real jax.distributed processes (2 processes, 2 CPU devices each).

Each process reads its `pe.process_slice` share of one grain dataset (tests/multihost/_multihost_grain_worker.py); the
result must be identical on every process and equal the float64 numpy / scikit-learn reference over all rows.
grain's own sharding (``ShardByJaxProcess``) gives every shard ``rows // processes`` rows, so with a remainder it
is refused on every process before the first step.
"""

import os

import _launch
import numpy as np
import pytest
from test_multihost import reference

pytestmark = pytest.mark.multihost

WORKER = os.path.join(os.path.dirname(__file__), "_multihost_grain_worker.py")
PROCESSES, ROWS = 2, 1001  # 501 + 500 rows; 1001 % 2 leaves grain's sharding a remainder
SCENARIOS = [f"map:jit:{ROWS}", f"loader:pmap:{ROWS}", f"sharded:pmap:{ROWS}"]
DEADLINE_S = 300


@pytest.fixture(scope="module")
def lines():
  """``{scenario: [line of process 0, line of process 1]}`` from one run of the workers."""
  found = {}
  for line in _launch.run_workers(WORKER, PROCESSES, [",".join(SCENARIOS)], DEADLINE_S):
    found.setdefault(line["scenario"], {})[line["process"]] = line
  return {s: [found[s][p] for p in range(PROCESSES)] for s in SCENARIOS}


@pytest.mark.parametrize("scenario", SCENARIOS[:2])
def test_process_slices_of_a_grain_dataset_give_the_exact_union_result(lines, scenario):
  results = [line.get("result") for line in lines[scenario]]
  assert all(r is not None for r in results), lines[scenario]
  shares = [r.pop("share") for r in results]
  assert shares == [
    [0, 501],
    [501, 1001],
  ]  # pe.process_slice: the first process takes the extra row
  assert results[0] == results[1]  # one global result, on every process
  want = reference([ROWS])  # tests/multihost/test_multihost.py's, over all ROWS rows
  assert results[0]["num_examples"] == want["num_examples"] == ROWS
  for name in ("accuracy", "f1"):
    np.testing.assert_allclose(results[0][name], want[name], rtol=1e-6, err_msg=name)
  for name in ("mse", "std"):
    np.testing.assert_allclose(results[0][name], want[name], rtol=1e-5, err_msg=name)


def test_grain_sharding_with_a_remainder_is_refused_on_every_process(lines):
  for line in lines[f"sharded:pmap:{ROWS}"]:
    assert line.get("error") == "ValueError", line
    assert "sharded over 2 shards of a source of 1001 records" in line["message"]
    assert "1 row would never be evaluated" in line["message"]
