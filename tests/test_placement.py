"""What masked_eval reuses between calls (padded_eval.eval._placement): replicated copies of jax.Array
params, and small per-shard states combined on one device instead of by a collective.

References are numpy (float64, or exact integer counts); padded rows hold NaN/inf garbage.
"""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import padded_eval as pe
from padded_eval.eval import _placement as placement

FEATURES, CLASSES = 6, 5


def dataset(rows, seed=0):
  rng = np.random.default_rng(seed)
  return {
    "x": rng.normal(size=(rows, FEATURES)).astype(np.float32),
    "y": rng.integers(0, CLASSES, rows).astype(np.int32),
  }


def garbage_padded(data, batch_size):
  """pe.pad_batches, with NaN/inf in the features and out-of-range labels in padded rows."""
  for batch in pe.pad_batches(data, batch_size):
    x, y = batch["x"].copy(), batch["y"].copy()
    x[~batch["mask"]] = np.where(np.arange(FEATURES) % 2, np.nan, np.inf)
    y[~batch["mask"]] = 10**6
    yield {**batch, "x": x, "y": y}


def step(params, batch):
  logits = batch["x"] @ params["w"] + params["b"]
  return pe.collections.Metrics([pe.metrics.Accuracy(), pe.metrics.Mean()]).batch_updates(
    preds=logits,
    target=batch["y"],
    values=jnp.tanh(logits).sum(-1),
    mask=batch["mask"],
  )


def reference(data, w, b):
  logits = data["x"].astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64)
  correct = int(np.sum(np.argmax(logits, -1) == data["y"]))
  return correct, float(np.mean(np.tanh(logits).sum(-1)))


def check(got, data, w, b):
  correct, mean = reference(data, w, b)
  assert got["num_examples"] == len(data["y"])
  assert round(got["accuracy"] * len(data["y"])) == correct
  np.testing.assert_allclose(got["mean"], mean, rtol=1e-5, atol=1e-6)


def weights(seed):
  rng = np.random.default_rng(seed)
  w = rng.normal(size=(FEATURES, CLASSES)).astype(np.float32)
  return w, rng.normal(size=CLASSES).astype(np.float32)


# --- replicated copies of params -----------------------------------------------------------


def test_a_jax_array_is_placed_once_and_its_copy_reused():
  mesh = Mesh(np.array(jax.devices()), ("batch",))
  replicated = NamedSharding(mesh, PartitionSpec())
  source = jnp.arange(4.0)  # uncommitted, one device
  first = placement.place_reusing([source], replicated)[0]
  again = placement.place_reusing([source], replicated)[0]
  assert again is first and first.sharding.is_fully_replicated
  np.testing.assert_array_equal(np.asarray(again), np.arange(4.0))
  other = placement.place_reusing([jnp.arange(4.0) + 1], replicated)[0]
  assert other is not first
  np.testing.assert_array_equal(np.asarray(other), np.arange(4.0) + 1)


def test_numpy_and_deleted_arrays_are_placed_again():
  mesh = Mesh(np.array(jax.devices()), ("batch",))
  replicated = NamedSharding(mesh, PartitionSpec())
  host = np.arange(3.0, dtype=np.float32)
  first = placement.place_reusing([host], replicated)[0]
  host[:] = 7.0  # numpy can change in place: never reused
  again = placement.place_reusing([host], replicated)[0]
  assert again is not first
  np.testing.assert_array_equal(np.asarray(again), 7.0)

  source = jnp.ones(3)
  copy = placement.place_reusing([source], replicated)[0]
  source.delete()  # as donation does
  fresh = jnp.full(3, 2.0)
  assert placement.place_reusing([fresh], replicated)[0] is not copy


def test_a_copy_is_dropped_with_its_source():
  mesh = Mesh(np.array(jax.devices()), ("batch",))
  replicated = NamedSharding(mesh, PartitionSpec())
  before = len(placement._placed)  # noqa: SLF001 - the cache's size
  source = jnp.arange(5.0)
  placement.place_reusing([source], replicated)
  assert len(placement._placed) == before + 1  # noqa: SLF001
  del source
  gc.collect()
  assert len(placement._placed) == before  # noqa: SLF001


@pytest.mark.parametrize("backend", ["pmap", "shard_map", "jit"])
def test_repeated_calls_with_new_and_same_params_are_exact(backend):
  data = dataset(203, seed=3)
  for seed in (1, 1, 2):
    w, b = weights(seed)
    params = {"w": jnp.asarray(w), "b": jnp.asarray(b)}
    for _ in range(2):  # the second call reuses the placed params
      got = pe.masked_eval(step, params, garbage_padded(data, 32), backend=backend)
      check(got, data, w, b)


def test_numpy_params_changed_in_place_between_calls():
  data = dataset(77, seed=4)
  w, b = weights(5)
  params = {"w": w.copy(), "b": b.copy()}
  check(pe.masked_eval(step, params, garbage_padded(data, 16), backend="jit"), data, w, b)
  params["w"] *= -1.0
  got = pe.masked_eval(step, params, garbage_padded(data, 16), backend="jit")
  check(got, data, -w, b)


# --- small states combined on one device, large ones by the collective ------------------------


@pytest.mark.parametrize("backend", ["pmap", "shard_map", "jit"])
@pytest.mark.parametrize("limit", [1 << 16, 0])
def test_small_and_large_states_are_exact(backend, limit, monkeypatch):
  """Small: the empty state placed once (a step that keeps it) and one-device combine; large
  (limit 0): a fresh state donated to the step, and the collective reduce."""
  monkeypatch.setattr(placement, "SMALL_STATE_BYTES", limit)
  monkeypatch.setattr(placement, "REUSED_STATE_BYTES", limit)
  data = dataset(301, seed=6)
  w, b = weights(7)
  got = pe.masked_eval(step, {"w": w, "b": b}, garbage_padded(data, 40), backend=backend)
  check(got, data, w, b)


def test_combined_on_one_device_declines_large_states(monkeypatch):
  mesh = Mesh(np.array(jax.devices()), ("batch",))
  split = NamedSharding(mesh, PartitionSpec("batch"))
  state = (pe.accumulate.ExactCount.of(jax.device_put(jnp.arange(8, dtype=jnp.int32), split)),)
  combined = placement.combined_on_one_device(state)
  assert int(combined[0].to_numpy()) == 28
  monkeypatch.setattr(placement, "SMALL_STATE_BYTES", 8)
  assert placement.combined_on_one_device(state) is None


@pytest.mark.parametrize("backend", ["pmap", "shard_map", "jit"])
def test_the_reused_empty_state_is_never_donated_or_changed(backend):
  data = dataset(90, seed=8)
  w, b = weights(9)
  for _ in range(3):
    got = pe.masked_eval(step, {"w": w, "b": b}, garbage_padded(data, 24), backend=backend)
    check(got, data, w, b)
  reused = [placed for host, placed in placement._placed_states.values()]  # noqa: SLF001
  assert reused
  for placed in reused:
    for leaf in jax.tree.leaves(placed):
      assert not leaf.is_deleted()
  hosts = [host for host, placed in placement._placed_states.values()]  # noqa: SLF001
  for host, placed in zip(hosts, reused):
    for want, leaf in zip(jax.tree.leaves(host), jax.tree.leaves(placed)):
      got_leaf = np.asarray(leaf)
      np.testing.assert_array_equal(got_leaf, np.broadcast_to(want, got_leaf.shape))


@pytest.mark.parametrize("backend", ["pmap", "shard_map"])
def test_pmap_and_shard_map_steps_run_no_collective(backend):
  """Per-shard partial states: the compiled step has no collective; the reduce is once, at the
  end (on one device when small, so a short evaluation runs no collective at all)."""
  import re

  from padded_eval.eval import _cache as step_cache
  from padded_eval.eval import backends

  data = dataset(64, seed=10)
  w, b = weights(11)
  runner = backends.make_backend(backend, "batch", None)
  cached = step_cache.cached_step(step, runner, "mask", False)
  params = runner.place_params({"w": w, "b": b})
  placed = runner.place_batch(backends.StepInput(next(garbage_padded(data, 32))))
  pe.masked_eval(step, {"w": w, "b": b}, garbage_padded(data, 32), backend=backend)

  def not_called(shapes):
    raise AssertionError("the empty state comes from the call above")

  empty = cached.empty_state(params, placed.batch, not_called)
  state = runner.place_state(empty)
  text = cached.step_for(empty).lower(params, state, placed).compile().as_text()
  collective = r" (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\("
  assert not re.findall(collective, text)
  layout, packed_step = cached.packed_for(empty)  # the state as one byte vector per shard
  text = packed_step.lower(params, runner.place_packed(layout), placed).compile().as_text()
  assert not re.findall(collective, text)
