"""`padded_eval.multihost.distributed`'s one-process feed: the default bound on steps in flight
(issue 64: on an accelerator the driver does not wait on step t-1, which cost a TPU v5e the
transfer's overlap), checked against the rule worked out here by hand."""

import numpy as np
import pytest

import padded_eval as pe
from padded_eval.multihost import distributed


class FakeDevice:
  def __init__(self, platform, bytes_limit=None):
    self.platform, self._limit = platform, bytes_limit

  def memory_stats(self):
    if self._limit == "raises":
      raise RuntimeError("no memory statistics on this backend")
    return None if self._limit is None else {"bytes_limit": self._limit}


def batch_of(nbytes):
  return {"x": np.zeros(nbytes // 4, np.float32), "mask": np.ones(0, bool)}


MiB = 1 << 20


@pytest.mark.parametrize(
  ("devices", "nbytes", "expected"),
  [
    ([FakeDevice("cpu")] * 8, 4 * MiB, 2),  # CPU: step t-1 waited for, as before
    ([FakeDevice("tpu", 16 << 30)], 16 * MiB, 32),  # 1 GiB / 16 MiB = 64, capped at 32
    ([FakeDevice("tpu", 16 << 30)], 100 * MiB, 10),  # 10 batches of 100 MiB in 1 GiB
    ([FakeDevice("gpu", 2 << 30)], 16 * MiB, 16),  # an eighth of 2 GiB: 256 MiB
    ([FakeDevice("gpu", 2 << 30)] * 4, 100 * MiB, 10),  # 4 devices: an eighth of 8 GiB, 1 GiB
    ([FakeDevice("tpu", None)], 600 * MiB, 2),  # no statistics: 1 GiB; never below 2
    ([FakeDevice("tpu", "raises")], 64 * MiB, 16),
    ([], 64 * MiB, 2),
  ],
)
def test_default_bound_keeps_a_gibibyte_of_batches_in_flight_on_accelerators(
  devices, nbytes, expected
):
  got = distributed.default_steps_in_flight(batch_of(nbytes), devices)
  assert got == expected


def test_the_bound_is_set_from_the_first_batch_unless_given():
  batches = [batch_of(16 * MiB)] * 3
  feed = distributed.OneProcess(iter(batches), None, devices=[FakeDevice("tpu", 16 << 30)])
  assert feed.steps_in_flight is None
  next(feed)
  assert feed.steps_in_flight == distributed.MAX_STEPS_IN_FLIGHT
  given = distributed.OneProcess(iter(batches), 3, devices=[FakeDevice("tpu", 16 << 30)])
  next(given)
  assert given.steps_in_flight == 3


def test_masked_eval_on_cpu_keeps_two_steps_in_flight(monkeypatch):
  seen = []
  wait = distributed.OneProcess.wait

  def recorded(feed, step, token):
    seen.append(feed.steps_in_flight)
    return wait(feed, step, token)

  monkeypatch.setattr(distributed.OneProcess, "wait", recorded)
  data = {"v": np.arange(10, dtype=np.float32)}
  step = lambda params, b: pe.metrics.Mean().batch_updates(values=b["v"], mask=b["mask"])
  logs = pe.masked_eval(step, None, pe.pad_batches(data, 8), backend="jit")
  assert float(logs["mean"]) == pytest.approx(4.5) and seen and set(seen) == {2}
