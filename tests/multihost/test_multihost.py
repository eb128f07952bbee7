"""masked_eval over real jax.distributed processes on 127.0.0.1 (gloo CPU collectives, 2 devices each).

Each run starts 2 or 3 worker processes (tests/multihost/_multihost_worker.py) that go through several scenarios in one
jax.distributed session and print one JSON line per scenario. Results are compared with float64 numpy /
scikit-learn references over the union of all processes' rows (padded rows hold NaN and garbage labels), and must
be identical on every process. The last scenario of each run breaks the session on purpose (a killed or a stuck
process) and checks that the others raise a clear error and exit instead of hanging.
"""

import json
import os
import signal
import subprocess
import sys
import time

import _launch
import _multihost_worker as worker
import numpy as np
import pytest
from sklearn.metrics import f1_score

from padded_eval.multihost.distributed import process_slice

pytestmark = pytest.mark.multihost

WORKER = os.path.join(os.path.dirname(__file__), "_multihost_worker.py")
RUN_DEADLINE_S = 300  # a run that has not finished by then is a hang: its processes are killed
GRACE_S = 10  # after one worker exits, the others must follow within this (the stuck one is killed)

TWO_HOSTS = [
  "known:pmap:600-437",
  "known:jit:40-0",
  "known:pmap:33-33",
  "gen:pmap:130-37",
  "gen:jit:0-90",
  "mixed:pmap:23-41",
  "tfds:jit:1437",
  "outputs:pmap:600-437",
  "outputs:jit:40-77",
  "fail:pmap:30-30",
  "mismatch:pmap:20-20",
  "kill:pmap:200-200",
]
THREE_HOSTS = [
  "known:shard_map:167-166-166",
  "gen:pmap:50-0-17",
  "mixed:jit:20-31-0",
  "absent:pmap:10-10-10",
  "known:pmap:5-9-0",
  "outputs:shard_map:31-0-50",
  "stall:jit:200-200-200",
]


def _run(count: int, scenarios: list[str], tmp_dir) -> dict:
  """Runs the workers; returns their JSON lines per process and scenario, exit codes and stderr tails.

  Once one worker has exited, the others get GRACE_S to follow; a worker still running after that (the one stuck
  on purpose, or a real hang) or after RUN_DEADLINE_S is killed with SIGKILL (jax catches SIGTERM) and its exit
  code is recorded as None.
  """
  env = _launch.worker_env(MULTIHOST_TMP=str(tmp_dir))
  port, start = _launch.free_port(), time.monotonic()
  files = [
    (open(tmp_dir / f"out{p}.txt", "w+"), open(tmp_dir / f"err{p}.txt", "w+")) for p in range(count)
  ]
  procs = [
    subprocess.Popen(
      [sys.executable, WORKER, str(port), str(count), str(p), ",".join(scenarios)],
      stdout=out,
      stderr=err,
      text=True,
      env=env,
    )
    for p, (out, err) in enumerate(files)
  ]
  exits, first_exit = {}, None
  while len(exits) < count:
    now = time.monotonic()
    for p, proc in enumerate(procs):
      if p in exits:
        continue
      if proc.poll() is not None:
        exits[p] = proc.returncode
        first_exit = first_exit or now
      elif now - start > RUN_DEADLINE_S or (first_exit and now - first_exit > GRACE_S):
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        exits[p] = None
    time.sleep(0.05)
  lines, stderr_tails = {p: {} for p in range(count)}, {}
  for p, (out, err) in enumerate(files):
    out.seek(0), err.seek(0)
    for text in out.read().splitlines():
      if text.startswith("{"):
        line = json.loads(text)
        lines[p][line["scenario"]] = line
    stderr_tails[p] = err.read()[-3000:]
    out.close(), err.close()
  return {"lines": lines, "exits": exits, "stderr": stderr_tails}


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
  return _run(2, TWO_HOSTS, tmp_path_factory.mktemp("two_hosts"))


@pytest.fixture(scope="module")
def three_hosts(tmp_path_factory):
  return _run(3, THREE_HOSTS, tmp_path_factory.mktemp("three_hosts"))


def _runs(request, count):
  return request.getfixturevalue("two_hosts" if count == 2 else "three_hosts")


def digits_train():
  """The digits "train" split as the tfds scenario's features, from scikit-learn (no TensorFlow)."""
  from sklearn.datasets import load_digits

  from padded_eval.demo.datasets import digits_split_indices

  rows = digits_split_indices("train")
  digits = load_digits()
  x, label, y = worker.digits_features(
    digits.images[rows].astype(np.float32), rows, digits.target[rows]
  )
  return {"x": x, "label": label, "y": y.astype(np.float32)}


def reference(sizes, data=None) -> dict:
  """float64 numpy / scikit-learn results over the union of all processes' rows."""
  data = worker.make_data(sum(sizes)) if data is None else data
  params = worker.make_params()
  x = data["x"].astype(np.float64)
  logits = x @ params["w"].astype(np.float64) + params["b"].astype(np.float64)
  predicted = np.argmax(logits, axis=-1)
  preds = x @ params["v"].astype(np.float64)
  return {
    "accuracy": np.mean(predicted == data["label"]),
    "f1": f1_score(
      data["label"], predicted, average="macro", labels=range(worker.NUM_CLASSES), zero_division=0
    ),
    "mse": np.mean((preds - data["y"]) ** 2),
    "std": np.std(preds),
    "num_examples": len(data["x"]),
  }


def _line(run, process, scenario):
  line = run["lines"][process].get(scenario)
  assert line is not None, (
    f"process {process} printed no result for {scenario}; exit {run['exits'][process]}; "
    f"stderr: {run['stderr'][process]}"
  )
  return line


EXACT = ("known", "gen", "mixed", "tfds")


@pytest.mark.parametrize(
  "count,scenario",
  [(2, s) for s in TWO_HOSTS if s.split(":")[0] in EXACT]
  + [(3, s) for s in THREE_HOSTS if s.split(":")[0] in EXACT],
)
def test_exact_union_result_identical_on_every_process(request, count, scenario):
  run = _runs(request, count)
  results = [_line(run, p, scenario) for p in range(count)]
  for line in results:
    assert "error" not in line, str(line)
  kind, _, sizes = worker.parse(scenario)
  expected = reference(sizes, digits_train() if kind == "tfds" else None)
  shares = [line["result"].pop("share", None) for line in results]
  first = results[0]["result"]
  for line in results[1:]:
    assert line["result"] == first  # the same, global, result on every process
  assert first["num_examples"] == expected["num_examples"]
  for name in ("accuracy", "f1"):  # ratios of exact counts, rounded once to float32
    np.testing.assert_allclose(first[name], expected[name], rtol=1e-6, err_msg=name)
  for name in ("mse", "std"):  # float32 model outputs vs float64 ones
    np.testing.assert_allclose(first[name], expected[name], rtol=1e-5, err_msg=name)
  if kind == "tfds":  # tfds.split_for_jax_process shares are process_slice's rows
    from padded_eval.demo.datasets import digits_split_indices

    rows = digits_split_indices("train")
    for process, share in enumerate(shares):
      expected_rows = rows[process_slice(len(rows), process_index=process, process_count=count)]
      np.testing.assert_array_equal(share, expected_rows)


@pytest.mark.parametrize(
  "count,scenario",
  [(2, s) for s in TWO_HOSTS if s.startswith("outputs:")]
  + [(3, s) for s in THREE_HOSTS if s.startswith("outputs:")],
)
def test_each_process_gets_its_own_rows_and_gathers_everyones(request, count, scenario):
  """Per-row outputs with several processes: each gets exactly its share (ids offset by its first row), equal
  to a float64 forward pass; the HOWTO's all-gather recipe gives every process the whole dataset in id order."""
  run = _runs(request, count)
  _, _, sizes = worker.parse(scenario)
  data, params = worker.make_data(sum(sizes)), worker.make_params()
  logits = data["x"].astype(np.float64) @ params["w"].astype(np.float64) + params["b"]
  expected = reference(sizes)
  for process in range(count):
    line = _line(run, process, scenario)
    assert "error" not in line, str(line)
    result = line["result"]
    share = slice(sum(sizes[:process]), sum(sizes[: process + 1]))
    np.testing.assert_array_equal(result["local_index"], np.arange(sum(sizes))[share])
    assert result["local_shape"] == list(
      logits[share].shape
    )  # (JSON loses the shape of empty arrays)
    local_logits = np.reshape(result["local_logits"], result["local_shape"])
    np.testing.assert_allclose(local_logits, logits[share], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(result["gathered_index"], np.arange(sum(sizes)))
    np.testing.assert_allclose(result["gathered_logits"], logits, rtol=1e-6, atol=1e-6)
    assert (
      result["num_examples"] == expected["num_examples"]
    )  # the global count, as without outputs
    np.testing.assert_allclose(result["accuracy"], expected["accuracy"], rtol=1e-6)
    assert (
      result["misplaced_ids"] == 0.0
    )  # padding rows (lockstep's too) carry id -1, real rows not


def test_structure_mismatch_is_a_clear_error_on_every_process(two_hosts):
  for process in range(2):
    line = _line(two_hosts, process, "mismatch:pmap:20-20")
    assert line["error"] == "ValueError"
    assert "process 1 differ from those of process 0" in line["message"]
    assert (
      "'x' has shape (16, 4)" in line["message"] and "expected shape (16, 3)" in line["message"]
    )


def test_failure_before_the_first_step_is_reported_to_every_process(two_hosts):
  line = _line(two_hosts, 0, "fail:pmap:30-30")
  assert line["error"] == "RuntimeError", line
  assert "process 1 failed before the first step (OSError: disk on fire)" in line["message"]
  assert line["elapsed"] < 30  # at once, not after the 60 s timeout
  assert _line(two_hosts, 1, "fail:pmap:30-30")["error"] == "OSError"  # its own error, re-raised


def test_process_that_never_arrives_times_out_the_preflight(three_hosts):
  for process in range(2):
    line = _line(three_hosts, process, "absent:pmap:10-10-10")
    assert line["error"] == "TimeoutError", line
    assert "process(es) [2] did not reach the pre-flight check within 2 s" in line["message"]
    assert line["elapsed"] < 30  # timeout=2 s; generous for a loaded machine
  assert _line(three_hosts, 2, "absent:pmap:10-10-10")["result"] == {"skipped": True}
  # The session survives: the next call on all three processes is exact.
  expected = reference([5, 9, 0])
  for process in range(3):
    assert (
      _line(three_hosts, process, "known:pmap:5-9-0")["result"]["num_examples"]
      == expected["num_examples"]
    )


def test_killed_process_makes_the_other_raise_and_exit(two_hosts):
  line = _line(two_hosts, 0, "kill:pmap:200-200")
  # gloo reports a connection the dead peer closed at once (RuntimeError); a collective entered after the
  # peer died can instead wait for it, and then the step's deadline (timeout=5 s) raises TimeoutError.
  assert line["error"] in ("RuntimeError", "TimeoutError"), line
  assert "masked_eval step" in line["message"] and "another process" in line["message"]
  assert line["elapsed"] < 30  # generous for a loaded machine
  assert (
    two_hosts["exits"][0] == 0
  )  # exited by itself (os._exit after the error), not killed by this test's deadline
  assert two_hosts["exits"][1] == -signal.SIGKILL
  assert "kill:pmap:200-200" not in two_hosts["lines"][1]


def test_stuck_process_makes_the_others_time_out_and_exit(three_hosts):
  for process in range(2):
    line = _line(three_hosts, process, "stall:jit:200-200-200")
    assert line["error"] == "TimeoutError", line
    assert "did not finish within 5 s" in line["message"]
    assert 5 <= line["elapsed"] < 60
    assert three_hosts["exits"][process] == 0  # exited by itself
  # The stuck one: jax aborts it once the coordinator (process 0) has gone, else this test kills it.
  assert three_hosts["exits"][2] in (None, -signal.SIGABRT)


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
  """Session 1: a checkpointed run whose process 1 is SIGKILLed mid-way; session 2 (same directory): resumed,
  then called again (stored result), then the uninterrupted run for comparison, then a run with a progress
  bar (`test_only_process_0_draws_the_progress_bar`: the one call of either session that draws one)."""
  directory = tmp_path_factory.mktemp("resume")
  killed = _run(2, ["killresume:pmap:600-437"], directory)
  return killed, _run(2, SESSION_2, directory)


SESSION_2 = [
  "resume:pmap:600-437",
  "resumedone:pmap:600-437",
  "gen:pmap:600-437",
  "progress:pmap:40-23",
]


def test_killed_processes_resume_together_exactly(resumed):
  killed, run = resumed
  assert killed["exits"][1] == -signal.SIGKILL
  assert _line(killed, 0, "killresume:pmap:600-437")["error"] in ("RuntimeError", "TimeoutError")
  expected = reference([600, 437])
  for process in range(2):
    line = _line(run, process, "resume:pmap:600-437")
    assert "error" not in line, str(line)
    result = line["result"]
    saved = result.pop("saved")
    assert any(name.startswith("step_") for name in saved), saved  # it did resume from a checkpoint
    uninterrupted = _line(run, process, "gen:pmap:600-437")["result"]
    assert result == uninterrupted  # bit-identical, on every process
    assert result["num_examples"] == expected["num_examples"]
    np.testing.assert_allclose(result["accuracy"], expected["accuracy"], rtol=1e-6)
    np.testing.assert_allclose(result["mse"], expected["mse"], rtol=1e-5)
    again = _line(run, process, "resumedone:pmap:600-437")
    assert "error" not in again, again  # the stored result: the source was read no further
    assert again["result"].pop("saved") == ["result.state"]
    assert again["result"] == uninterrupted


@pytest.mark.parametrize("num_examples,count", [(5000, 3), (7, 2), (2, 3), (0, 2), (1037, 1)])
def test_process_slice_covers_every_row_once_like_tfds(num_examples, count):
  slices = [process_slice(num_examples, process_index=p, process_count=count) for p in range(count)]
  rows = np.concatenate([np.arange(num_examples)[s] for s in slices])
  np.testing.assert_array_equal(rows, np.arange(num_examples))
  sizes = [s.stop - s.start for s in slices]
  assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)  # 1667, 1667, 1666


def test_only_process_0_draws_the_progress_bar(resumed):
  """masked_eval(progress=True) on 2 real processes: one bar, on process 0's stderr (issue 28)."""
  _, run = resumed  # its last scenario
  assert run["exits"] == {0: 0, 1: 0}, run["stderr"]
  want = reference([40, 23])
  for process in range(2):
    line = _line(run, process, "progress:pmap:40-23")
    assert "error" not in line, str(line)
    got = line["result"]
    assert got["num_examples"] == want["num_examples"] == 63
    np.testing.assert_allclose(got["accuracy"], want["accuracy"], rtol=1e-6)
  assert "masked_eval: 100%" in run["stderr"][0], run["stderr"][0]
  assert "masked_eval:" not in run["stderr"][1], run["stderr"][1]
