"""The backend registry and the multi-host lockstep wrapper, without starting processes.

The lockstep tests simulate several processes in one: each gets its own `Lockstep`, the
test sums their has-data flags as the compiled step would, and drives them in the
order `masked_eval`'s loop does (dispatch step t, fetch input t+1, wait on step
t+1-steps_in_flight). Every process must run the same number of steps, equal to the
longest one's (at least `Lockstep.LOOKAHEAD` with unknown lengths), with its real
batches first and in order.
"""

import collections
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import padded_eval as pe
from padded_eval.eval import backends
from padded_eval.eval.backends import StepInput
from padded_eval.eval.step import RowMask
from padded_eval.exact.accumulate import ExactCount
from padded_eval.multihost import distributed

# --- the registry -------------------------------------------------------------------------


def test_registry_names_every_backend_once():
  assert list(backends.BACKENDS) == ["pmap", "shard_map", "jit"]
  assert len(set(backends.BACKENDS.values())) == 3


@pytest.mark.parametrize("name", ["pmap", "shard_map", "jit"])
def test_make_backend_builds_the_registered_class(name):
  backend = backends.make_backend(name, "batch", None)
  assert type(backend) is backends.BACKENDS[name]
  assert isinstance(backend, backends.Backend)  # has every method of the protocol
  assert backend.data_axis == "batch" and backend.num_shards == jax.local_device_count()


def test_backends_on_the_same_mesh_are_distinct_cache_keys():
  mesh = jax.make_mesh((8,), ("batch",))
  shard_map = backends.make_backend("shard_map", "batch", mesh)
  jit = backends.make_backend("jit", "batch", mesh)
  assert shard_map != jit and shard_map == backends.make_backend("shard_map", "batch", mesh)


def test_unknown_backend_names_the_registered_ones():
  with pytest.raises(
    ValueError, match="backend must be one of 'pmap', 'shard_map', 'jit'; got 'x'"
  ):
    backends.make_backend("x", "batch", None)


class CountingJit(backends.JitBackend):
  """A new backend: the jit backend that counts the step inputs it places."""

  placed = []

  def place_batch(self, inputs):
    self.placed.append(inputs.batch["mask"].sum())
    return super().place_batch(inputs)


def test_a_registered_backend_is_used_by_masked_eval(monkeypatch):
  monkeypatch.setitem(backends.BACKENDS, "counting_jit", CountingJit)
  CountingJit.placed.clear()
  x = np.arange(37, dtype=np.float32)
  batches = pe.pad_batches({"x": x}, 16, num_devices=8, pad_value=np.nan)
  step_fn = lambda p, b: pe.metrics.Mean().batch_updates(values=b["x"], mask=b["mask"])
  result = pe.masked_eval(step_fn, None, batches, backend="counting_jit")
  np.testing.assert_allclose(result["mean"], x.astype(np.float64).mean(), rtol=1e-6)
  assert result["num_examples"] == 37 and CountingJit.placed == [16, 16, 5]


# --- the lockstep wrapper ---------------------------------------------------------------------


def batches_of(process, length):
  """``length`` real batches of 4 rows whose "x" names the process and the batch."""
  return [
    {"x": np.full(4, 100 * process + b, np.int32), "mask": np.ones(4, bool)} for b in range(length)
  ]


PADDING = {"x": np.full(4, -1, np.int32), "mask": np.zeros(4, bool)}


def drive(feeds, steps_in_flight):
  """Runs the feeds in lockstep as masked_eval's loop does; returns each one's batches."""
  inputs = [iter(feed) for feed in feeds]
  current = [next(i) for i in inputs]
  seen = [[] for _ in feeds]
  in_flight = collections.deque()
  for index in itertools.count():
    for process, step_input in enumerate(current):  # "dispatch" step t on every process
      seen[process].append(int(step_input.batch["x"][0]))
    sync = tuple(
      jnp.asarray(sum(s.sync[k].sum() for s in current)) for k in range(len(current[0].sync))
    )
    in_flight.append((index, (jnp.float32(index), sync)))
    following = [next(i, None) for i in inputs]
    assert len({f is None for f in following}) == 1, f"processes disagree at step {index + 1}"
    while in_flight and (following[0] is None or len(in_flight) >= steps_in_flight):
      step, token = in_flight.popleft()
      for feed in feeds:
        feed.wait(step, token)
    if following[0] is None:
      return seen
    current = following


def expected(process, length, num_steps):
  return [100 * process + b for b in range(length)] + [-1] * (num_steps - length)


@pytest.mark.parametrize(
  "lengths", [[5, 2, 0], [0, 3], [1, 1], [4], [3, 3, 7], [2, 0, 0, 1], [1, 0]]
)
@pytest.mark.parametrize("known", [False, True])
def test_every_process_runs_the_longest_ones_steps(lengths, known):
  num_steps = max(lengths) if known else None
  feeds = [
    distributed.Lockstep(iter(batches_of(p, n)), PADDING, num_steps, 2, timeout=5.0)
    for p, n in enumerate(lengths)
  ]
  seen = drive(feeds, distributed.Lockstep.steps_in_flight)
  # Unknown lengths: the end is known LOOKAHEAD steps ahead, so at least LOOKAHEAD steps run.
  # The loop reads step t's sum after fetching steps_in_flight inputs past t: no later.
  lookahead = distributed.Lockstep.steps_in_flight + 1
  steps = max(lengths) if known else max(max(lengths), lookahead)
  for process, length in enumerate(lengths):
    assert seen[process] == expected(process, length, steps), (process, seen[process])


def test_flag_says_whether_a_real_batch_lies_lookahead_steps_on():
  feed = distributed.Lockstep(iter(batches_of(0, 4)), PADDING, None, 3, timeout=5.0)
  flags = [int(step_input.sync[0][0]) for step_input in itertools.islice(feed, 6)]
  lookahead = distributed.Lockstep.LOOKAHEAD
  assert flags == [int(t + lookahead < 4) for t in range(6)]
  assert all(s.sync[0].shape == (3,) for s in [next(feed)])  # one flag per shard


def test_known_lengths_carry_no_flag_and_catch_a_wrong_len():
  feed = distributed.Lockstep(iter(batches_of(0, 3)), PADDING, 2, 2, timeout=5.0)
  assert [s.sync for s in itertools.islice(feed, 2)] == [(), ()]
  with pytest.raises(
    ValueError, match="more batches than their len\\(\\) said; they were cut at 2"
  ):
    next(feed)


def test_one_process_feed_yields_every_batch_without_sync():
  options = distributed.FeedOptions(mask_key="mask", settings={}, num_shards=8)
  feed = distributed.step_feed(iter(batches_of(0, 3)), 3, options, steps_in_flight=2)
  assert isinstance(feed, distributed.OneProcess) and feed.steps_in_flight == 2
  inputs = list(feed)
  assert all(isinstance(s, StepInput) and s.sync == () for s in inputs)
  assert [int(s.batch["x"][0]) for s in inputs] == [0, 1, 2]
  feed.wait(0, (jnp.float32(0), ()))


# --- the compiled step: collectives -----------------------------------------------------------


def _lowered_step(name, sync):
  backend = backends.make_backend(name, "batch", None)
  step_fn = lambda p, b: pe.metrics.Mean().batch_updates(values=b["x"] * p, mask=b["mask"])
  compiled = backend.compile_step(step_fn, RowMask("mask"))
  batch = {"x": np.ones(16, np.float32), "mask": np.ones(16, bool)}
  flags = (np.ones(backend.num_shards, np.int32),) if sync else ()
  params, placed = backend.place_params(np.float32(2)), backend.place_batch(StepInput(batch, flags))
  shapes = compiled.state_shapes(params, placed.batch)
  empty = (shapes[0].empty(), ExactCount.zeros(shapes[1].shape))
  return compiled.step.lower(params, backend.place_state(empty), placed).as_text()


@pytest.mark.parametrize("name", ["pmap", "shard_map"])
def test_mapped_steps_merge_locally_and_sum_only_the_sync_flags(name):
  assert "all_reduce" not in _lowered_step(name, sync=False)  # no collective per step
  assert _lowered_step(name, sync=True).count("all_reduce") == 1  # the has-data flag's psum
