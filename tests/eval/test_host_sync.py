"""No host synchronisation per step that a hand loop would not have (issue 64, "Accelerators
first"), one process, every backend, a packed and a tree state, with and without per-row outputs:

* no implicit device-to-host transfer at all (the run passes under
  ``jax.transfer_guard_device_to_host("disallow")``): nothing reads a device value by accident;
* the explicit fetches (``jax.device_get``) do not grow with the number of batches without
  per-row outputs (the final state and its logs, once); with outputs, the rows come back and
  that is the transfer itself;
* the driver waits on a step only once a later step is dispatched (the bounded queue of
  ``steps_in_flight``, step t-1 waited for after step t is dispatched): the devices always have a
  step queued while the host waits, except on the last one.
"""

import functools

import jax
import numpy as np
import pytest

import padded_eval as pe
from padded_eval.eval import placement
from padded_eval.eval import run as run_lib
from padded_eval.multihost import distributed

ROWS_PER_BATCH = 16


def step(params, batch, outputs):
  logits = batch["x"] @ params
  metric = pe.Metrics({"accuracy": pe.metrics.Accuracy(), "mean": pe.metrics.Mean()})
  metric = metric.batch_updates(
    preds=logits, target=batch["y"], values=logits.sum(-1), mask=batch["mask"]
  )
  return (metric, {"logits": logits}) if outputs else metric


def dataset(rows):
  rng = np.random.default_rng(rows)
  return {
    "x": rng.normal(size=(rows, 5)).astype(np.float32),
    "y": rng.integers(0, 4, rows).astype(np.int32),
  }


W = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)


class Recorder:
  """Counts ``jax.device_get`` calls, step dispatches and, per wait, ``(step, dispatched)``."""

  def __init__(self, monkeypatch):
    self.fetches, self.dispatched, self.waits = 0, 0, []
    device_get, dispatch = jax.device_get, run_lib.CompiledRun.step
    wait = distributed.OneProcess.wait

    def counted_get(tree):
      self.fetches += 1
      return device_get(tree)

    def counted_step(run, state, placed):
      self.dispatched += 1
      return dispatch(run, state, placed)

    def recorded_wait(feed, index, token):
      self.waits.append((index, self.dispatched))
      return wait(feed, index, token)

    monkeypatch.setattr(jax, "device_get", counted_get)
    monkeypatch.setattr(run_lib.CompiledRun, "step", counted_step)
    monkeypatch.setattr(distributed.OneProcess, "wait", recorded_wait)

  def reset(self):
    self.fetches, self.dispatched, self.waits = 0, 0, []


@pytest.mark.parametrize("carried", ["packed", "tree"])
@pytest.mark.parametrize("outputs", [False, True])
def test_no_host_sync_per_step(backend, carried, outputs, monkeypatch):
  if carried == "tree":
    monkeypatch.setattr(placement, "SMALL_STATE_BYTES", 0)
  fn = functools.partial(step, outputs=outputs)
  warm = pe.pad_batches(dataset(50), ROWS_PER_BATCH)
  pe.masked_eval(fn, W, warm, backend=backend, outputs=outputs)  # compiled now
  recorder = Recorder(monkeypatch)
  fetches = {}
  for batches in (5, 20):
    data = dataset(batches * ROWS_PER_BATCH - 3)
    recorder.reset()
    with jax.transfer_guard_device_to_host("disallow"):
      got = pe.masked_eval(
        fn, W, pe.pad_batches(data, ROWS_PER_BATCH), backend=backend, outputs=outputs
      )
    result = got[0] if outputs else got
    assert result["num_examples"] == len(data["y"])
    assert recorder.dispatched == batches
    assert sorted(index for index, _ in recorder.waits) == list(range(batches))  # each once
    for index, dispatched in recorder.waits:
      if index < batches - 1:  # a later step was queued on the devices while the host waited
        assert dispatched > index + 1, recorder.waits
    fetches[batches] = recorder.fetches
  if outputs:  # the rows of every step come back: that is the transfer itself
    assert fetches[20] - fetches[5] <= 15 * 2, fetches
  else:
    assert fetches[20] == fetches[5], fetches
