"""Bootstrap, Sliced / compare and pe.lm.HarnessLM across 2 jax.distributed processes: the same results as one
process, on both processes and both backends.

One session of 2 worker processes (tests/multihost/_session_worker.py) runs three parts, one after the other:

* Bootstrap (tests/multihost/_bootstrap_worker.py): each process evaluates its share of the rows with global row
  ids; the point estimate and interval must equal a single-process Bootstrap over the union (interval bounds to
  float rounding: they are quantiles of exact integer-count replicas).
* Sliced / compare (tests/multihost/_sliced_worker.py): models A and B with a sliced Bootstrap over the shares of
  the rows; the per-slice logs and the paired comparison must equal one process's over all rows (bounds to float
  rounding).
* HarnessLM (tests/multihost/_lm_worker.py): each process scores its share of every bucket, and every process
  returns every request's result, equal to the float64 reference (tests/lm/_tiny.py).

One start of the processes (Python, JAX, jax.distributed) serves the three tests.
"""

import pathlib
import sys

import _bootstrap_worker as bootstrap_worker
import _launch
import _session_worker
import _sliced_worker as sliced_worker
import numpy as np
import pytest

import padded_eval as pe

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "lm"))
import _tiny  # noqa: E402
import test_harness as cases  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402

pytestmark = pytest.mark.multihost

PARTS = ("bootstrap", "sliced", "lm")


@pytest.fixture(scope="module")
def session():
  """``{part: its JSON lines}`` from one run of the 2 workers (each exited 0)."""
  lines = _launch.run_workers(_session_worker.__file__, args=[",".join(PARTS)], deadline_s=400)
  return {part: [line for line in lines if line["part"] == part] for part in PARTS}


def test_two_processes_give_the_single_process_interval(session):
  data = bootstrap_worker.make_data()
  n = len(data["y"])
  host = bootstrap_worker.make_metric().update(
    preds=data["x"], target=data["y"], index=np.arange(n, dtype=np.int32)
  )
  expected = {k: np.asarray(v) for k, v in host.compute_logs().items()}
  lines = session["bootstrap"]
  _launch.assert_every_backend_on_every_process(lines)
  for line in lines:
    logs = line["logs"]
    assert logs["num_examples"] == n
    assert logs["f1score"] == expected["f1score"]
    for key in ("f1score_low", "f1score_high"):
      np.testing.assert_allclose(logs[key], expected[key], rtol=1e-6)


def test_two_processes_give_the_single_process_slices_and_comparison(session):
  data = sliced_worker.make_data()
  n = len(data["y"])
  index = np.arange(n, dtype=np.int32)
  runs = {
    model: sliced_worker.make_metric().update(
      preds=data[model], target=data["y"], slice=data["slice"], index=index
    )
    for model in ("a", "b")
  }
  logs = {k: np.asarray(v, np.float64) for k, v in runs["b"].compute_logs().items()}
  compared = pe.metrics.compare(runs["a"], runs["b"])
  assert (
    np.isnan(compared["difference"][2]) and not np.isnan(compared["difference"][[0, 1, 3]]).any()
  )
  lines = session["sliced"]
  _launch.assert_every_backend_on_every_process(lines)
  for line in lines:
    assert line["logs"]["num_examples"] == n
    for key, value in logs.items():
      np.testing.assert_allclose(line["logs"][key], value, rtol=1e-6, equal_nan=True)
    for key, value in compared.items():
      np.testing.assert_allclose(line["compare"][key], value, rtol=1e-6, atol=1e-7, equal_nan=True)


def test_every_process_returns_every_result(session):
  reference = _tiny.reference_lm(cases.PARAMS, cases.MAX_LENGTH)
  expected = reference.loglikelihood([Instance("loglikelihood", {}, p, 0) for p in cases.PAIRS])
  rolling = reference.loglikelihood_rolling(
    [Instance("loglikelihood_rolling", {}, (t,), 0) for t in cases.TEXTS]
  )
  generated = []
  for context in ["the quick", "x", "over lazy d"]:
    new = _tiny.greedy_tokens64(cases.PARAMS, cases.TOKENIZER.encode(context), 5)
    new = new[: new.index(_tiny.EOT)] if _tiny.EOT in new else new
    generated.append(cases.TOKENIZER.decode(new).split("o")[0])
  lines = session["lm"]
  _launch.assert_every_backend_on_every_process(lines)
  for line in lines:
    got = line["loglikelihood"]
    np.testing.assert_allclose([v for v, _ in got], [v for v, _ in expected], rtol=1e-5)
    assert [g for _, g in got] == [g for _, g in expected]
    assert line["one"] == [got[0]]
    np.testing.assert_allclose(line["rolling"], rolling, rtol=1e-5)
    assert line["generated"] == generated
