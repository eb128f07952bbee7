"""masked_eval(checkpoint_dir=...): preempted (an exception, or SIGKILL) then resumed gives exactly the
uninterrupted result; consumed batches are not evaluated again; mismatched directories raise.

Every resumed run reads batches whose already-consumed part holds OTHER data (`_resume_worker.batches`,
``corrupt_before``): a resume that re-evaluated them would differ from the uninterrupted result.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import _resume_worker as w
import jax
import numpy as np
import pytest
from _backends import BACKENDS

import padded_eval as pe
from padded_eval.eval import checkpoint_files

WORKER = os.path.join(os.path.dirname(__file__), "_resume_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def data():
  return w.make_data()


@pytest.fixture(scope="module")
def params():
  return w.make_params()


@pytest.fixture(scope="module")
def uninterrupted(data, params):
  return {
    backend: pe.masked_eval(w.step_fn, params, w.batches(data), backend=backend)
    for backend in BACKENDS
  }


def _saved_steps(directory):
  names = os.listdir(os.path.join(directory, "process_0"))
  return sorted(
    int(name[5:15]) for name in names if name.startswith("step_") and name.endswith(".state")
  )


def _check_against_references(results, data, params):
  accuracy, score = w.references(data, params)
  assert results["num_examples"] == w.ROWS
  assert results["accuracy"] == pytest.approx(accuracy, abs=1e-7)  # float32 of an exact count
  assert results["score"] == pytest.approx(score, rel=1e-5)


def test_preempted_then_resumed_is_exact(backend, data, params, uninterrupted, tmp_path):
  with pytest.raises(RuntimeError, match="preempted"):
    pe.masked_eval(
      w.step_fn, params, w.batches(data, fail_at=13), backend=backend,
      checkpoint_dir=tmp_path, checkpoint_every=5,
    )  # fmt: skip
  (consumed,) = _saved_steps(tmp_path)  # the write in flight is finished, older ones pruned
  assert 5 <= consumed <= 13  # due at 5 and 10; deferred (never dropped) while a write runs
  resumed = pe.masked_eval(
    w.step_fn, params, w.batches(data, corrupt_before=consumed), backend=backend,
    checkpoint_dir=tmp_path, checkpoint_every=5,
  )  # fmt: skip
  assert resumed == uninterrupted[backend]
  _check_against_references(resumed, data, params)


def test_resume_from_pad_batches_seeks_and_keeps_row_ids(data, params, uninterrupted, tmp_path):
  """A Mapping behind pe.pad_batches is resumed by seeking (PaddedBatches.skip), not re-read."""
  common = dict(backend="pmap", checkpoint_dir=tmp_path, checkpoint_every=4)
  with pytest.raises(RuntimeError, match="preempted"):
    pe.masked_eval(w.step_fn, params, w.batches(data, fail_at=9), **common)
  padded = pe.pad_batches(data, w.BATCH, pad_value={"x": np.nan, "label": 99})
  skipped = []
  padded.skip = lambda n, skip=padded.skip: skipped.append(n) or skip(n)
  saved = _saved_steps(tmp_path)
  assert pe.masked_eval(w.step_fn, params, padded, **common) == uninterrupted["pmap"]
  assert skipped == saved and 4 <= saved[0] <= 9  # due at 4 and 8 (deferred while a write runs)


def test_finished_evaluation_returns_its_result_reading_only_its_first_batch(
  data, params, tmp_path
):
  """The first batch shows the question (batch spec, metric state): nothing after it is read, no
  step runs."""
  first = pe.masked_eval(
    w.step_fn, params, w.batches(data), backend="jit", checkpoint_dir=tmp_path, checkpoint_every=7
  )
  assert _saved_steps(tmp_path) == []  # the result replaces the step checkpoints

  def first_only():
    yield next(w.batches(data))
    raise AssertionError("the source was read past its first batch")

  again = pe.masked_eval(w.step_fn, params, first_only(), backend="jit", checkpoint_dir=tmp_path)
  assert again == first and type(again["num_examples"]) is int
  _check_against_references(again, data, params)


@pytest.mark.parametrize("mode", ["run", "write"])
@pytest.mark.parametrize("backend", ["pmap", "jit"])
def test_sigkilled_process_resumes_exactly(mode, backend, data, params, uninterrupted, tmp_path):
  """A real process SIGKILLed mid-run (``run``) or in the middle of a checkpoint write (``write``: after the
  data, before the rename) is rerun with the same directory: exactly the uninterrupted result."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.dirname(WORKER)]))
  proc = subprocess.Popen(
    [sys.executable, WORKER, mode, backend, str(tmp_path)],
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
  )
  try:
    deadline = time.monotonic() + 120
    while not _killed_moment(mode, tmp_path):
      assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
      assert time.monotonic() < deadline, "the worker never reached the moment to kill it"
      time.sleep(0.05)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
  saved = _saved_steps(tmp_path)
  if mode == "write":  # a half-done write: its temporary file is there, and is not read
    leftovers = os.listdir(tmp_path / "process_0")
    assert any(name.endswith(".tmp") for name in leftovers), leftovers
    assert saved[-1] in (4, 5)  # the write of 6 or later never completed
  consumed = saved[-1]
  assert 0 < consumed < 24
  resumed = pe.masked_eval(
    w.step_fn, params, w.batches(data, corrupt_before=consumed), backend=backend,
    checkpoint_dir=tmp_path, checkpoint_every=w.EVERY,
  )  # fmt: skip
  assert resumed == uninterrupted[backend]
  _check_against_references(resumed, data, params)
  assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path / "process_0"))


def _killed_moment(mode, directory):
  if mode == "write":
    return os.path.exists(directory / "writing")
  return os.path.isdir(directory / "process_0") and any(s >= 6 for s in _saved_steps(directory))


def _other_step(params, batch):
  return pe.metrics.Mean().batch_updates(values=batch["x"][:, 0], mask=batch["mask"])


def _rewrite_process_count(directory):
  (path,) = [p for p in (directory / "process_0").iterdir() if p.suffix == ".state"]
  header, leaves = checkpoint_files.read_state_file(path)
  header["fingerprint"]["process_count"] = 2
  checkpoint_files.write_state_file(path, header, leaves)


@pytest.mark.parametrize(
  "change, message",
  [
    (dict(step_fn=_other_step), "the metric"),
    (dict(batch_size=32), "the batch size"),
    (dict(extra_key=True), "the batch structure"),
    (
      dict(params={"w": np.zeros((3, w.CLASSES), np.float32), "b": np.zeros(2)}),
      "the params structure",
    ),
    (dict(params={"w": np.zeros((3, w.CLASSES), np.float64)}), "the params structure"),
    (dict(backend="jit"), "the backend layout"),
    (dict(rewrite=_rewrite_process_count), "the process count"),
  ],
)
def test_a_directory_of_another_evaluation_is_refused(change, message, data, params, tmp_path):
  common = dict(checkpoint_dir=tmp_path, checkpoint_every=3)
  with pytest.raises(RuntimeError, match="preempted"):
    pe.masked_eval(w.step_fn, params, w.batches(data, fail_at=4), **common)
  change.pop("rewrite", lambda directory: None)(tmp_path)
  rows = dict(data, extra=np.zeros(w.ROWS, np.int8)) if change.pop("extra_key", False) else data
  batches = pe.pad_batches(rows, change.pop("batch_size", w.BATCH))
  with pytest.raises(ValueError, match=f"{message} differs") as error:
    pe.masked_eval(
      change.pop("step_fn", w.step_fn), change.pop("params", params), batches, **change, **common
    )
  assert "one evaluation" in str(error.value)


def test_a_finished_directory_of_other_params_is_refused(data, params, tmp_path):
  pe.masked_eval(w.step_fn, params, w.batches(data), checkpoint_dir=tmp_path)
  with pytest.raises(ValueError, match="the params structure differs"):
    pe.masked_eval(w.step_fn, {"v": params["w"]}, w.batches(data), checkpoint_dir=tmp_path)


def _mean_step(params, batch):
  return pe.metrics.Mean().batch_updates(values=batch["x"], mask=batch["mask"])


@pytest.mark.parametrize("shorter", ["mapping", "list", "generator"])
def test_a_resume_over_fewer_batches_than_consumed_is_refused(shorter, tmp_path):
  """Fuzzing: a checkpoint of 7 consumed batches resumed over a pe.pad_batches of a shorter
  Mapping or generator returned the old rows' partial result (mean 27.5 over 56 rows, where numpy's
  mean of the 30 rows given is 14.5); a list of batches raised. All raise now."""
  rows = np.arange(80, dtype=np.float32)

  def first_seven():
    for index, batch in enumerate(pe.pad_batches({"x": rows}, 8, num_devices=8)):
      if index == 7:
        raise RuntimeError("preempted")
      yield batch

  with pytest.raises(RuntimeError, match="preempted"):
    pe.masked_eval(
      _mean_step, None, first_seven(), backend="jit", checkpoint_dir=tmp_path, checkpoint_every=7
    )
  assert _saved_steps(tmp_path) == [7]
  short = pe.pad_batches({"x": rows[:30]}, 8, num_devices=8)  # 4 batches
  batches = {
    "mapping": short,
    "list": list(short),
    "generator": pe.pad_batches((chunk for chunk in [{"x": rows[:30]}]), 8, num_devices=8),
  }[shorter]
  held = "fewer" if shorter == "generator" else "only 4"
  with pytest.raises(ValueError, match=f"consumed 7 batches but batches holds {held}"):
    pe.masked_eval(_mean_step, None, batches, backend="jit", checkpoint_dir=tmp_path)


def test_stray_temporary_files_are_never_read(data, params, uninterrupted, tmp_path):
  with pytest.raises(RuntimeError, match="preempted"):
    pe.masked_eval(
      w.step_fn, params, w.batches(data, fail_at=7), checkpoint_dir=tmp_path, checkpoint_every=3
    )
  torn = tmp_path / "process_0" / "step_0000000009.state.4242.tmp"
  torn.write_bytes(b"PK\x03\x04 half a zip")
  resumed = pe.masked_eval(
    w.step_fn,
    params,
    w.batches(data, corrupt_before=_saved_steps(tmp_path)[-1]),
    checkpoint_dir=tmp_path,
  )
  assert resumed == uninterrupted["pmap"]


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (dict(outputs=True), "outputs=True"),
    (dict(checkpoint_every=0), "checkpoint_every"),
    (dict(checkpoint_every=2.5), "checkpoint_every"),
  ],
)
def test_bad_arguments(kwargs, message, data, params, tmp_path):
  with pytest.raises(ValueError, match=message):
    pe.masked_eval(w.step_fn, params, w.batches(data), checkpoint_dir=tmp_path, **kwargs)
  with pytest.raises(ValueError, match="checkpoint_dir"):
    pe.masked_eval(w.step_fn, params, w.batches(data), checkpoint_dir=3)


def _skip_sources():
  rows = {"x": np.arange(203.0), "y": {"z": np.arange(406).reshape(203, 2)}}

  def generator():
    for start in range(0, 203, 7):
      yield {"x": rows["x"][start : start + 7], "y": {"z": rows["y"]["z"][start : start + 7]}}

  sources = {"mapping": lambda: rows, "generator": generator}
  tf = pytest.importorskip("tensorflow")
  sources["tf.data rows"] = lambda: tf.data.Dataset.from_tensor_slices(rows)
  sources["tf.data batches"] = lambda: tf.data.Dataset.from_tensor_slices(rows).batch(9)
  grain = pytest.importorskip("grain")
  elements = [{"x": x, "y": {"z": z}} for x, z in zip(rows["x"], rows["y"]["z"])]
  sources["grain MapDataset"] = lambda: grain.MapDataset.source(elements)
  return sources


@pytest.mark.parametrize("num_batches", [None, 16])
def test_skip_equals_the_batches_after_those_skipped(num_batches):
  """PaddedBatches.skip(k) (a resume's seek) yields exactly list(batches)[k:], row ids included, for every
  source kind, up to and past the end (13 batches of 16 rows, the last short)."""
  for name, make in _skip_sources().items():
    padded = lambda: pe.pad_batches(
      make(), 16, num_devices=1, index_key="id", num_batches=num_batches
    )  # noqa: E731
    whole = list(padded())
    for skipped in (0, 1, 5, 12, 13, 15):
      rest = list(padded().skip(skipped))
      assert len(rest) == max(0, len(whole) - skipped), (name, skipped)
      for got, want in zip(rest, whole[skipped:]):
        for got_leaf, want_leaf in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
          np.testing.assert_array_equal(got_leaf, want_leaf, err_msg=f"{name}, skip {skipped}")


def test_a_failed_run_does_not_wait_for_a_save_that_cannot_finish(
  data, params, tmp_path, monkeypatch
):
  """A save in flight fetches a state whose step may never finish (another process died inside
  its collective): the failing run must raise within its timeout, not wait for that save. Here
  the fetch blocks until the test releases it, and the source fails two batches later."""
  from padded_eval.eval import backends

  release = threading.Event()
  fetch = backends.MeshBackend.local_part

  def stuck_fetch(self, leaf):
    release.wait()
    return fetch(self, leaf)

  monkeypatch.setattr(backends.MeshBackend, "local_part", stuck_fetch)
  raised = []

  def run():
    try:
      pe.masked_eval(
        w.step_fn,
        params,
        w.batches(data, fail_at=3),
        backend="jit",
        checkpoint_dir=tmp_path / "ckpt",
        checkpoint_every=1,
        timeout=2.0,
      )
    except RuntimeError as error:
      raised.append(str(error))

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(60)
  finished = not thread.is_alive()
  release.set()
  assert finished, "masked_eval waited for a save whose fetch never finished"
  assert raised == ["preempted"]
