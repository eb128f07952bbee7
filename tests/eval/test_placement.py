"""What masked_eval keeps between calls and what it does not (padded_eval.eval.placement, _cache):
no copy of the params outlives a call; small states are packed and placed once per compiled step.

References are numpy (float64, or exact integer counts); padded rows hold NaN/inf garbage.
"""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import padded_eval as pe
from padded_eval.eval import placement
from padded_eval.eval.step import RowMask

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
  logits = batch["x"] @ params["w"] + params["b"][None, :]
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


# --- params: placed for the call, nothing kept after it ---------------------------------------


def live_device_bytes() -> int:
  """Bytes of every live device buffer (a replicated copy counts once per device; a buffer two
  arrays share, once)."""
  gc.collect()
  shards = {
    s.data.unsafe_buffer_pointer(): s.data for x in jax.live_arrays() for s in x.addressable_shards
  }
  return sum(data.nbytes for data in shards.values())


def test_no_replicated_copy_of_the_params_outlives_the_call(backend):
  """A large params tree on one device: after masked_eval returns, the device memory held is the
  params' own (no replicated copy kept while the source lives), and the result is exact."""
  data = dataset(203, seed=12)
  w, b = weights(13)
  big = jnp.ones((1024, 1024), jnp.float32)  # 4 MiB on one device, replicated 8 ways in a call
  params = {"w": jnp.asarray(w), "b": jnp.asarray(b), "big": big}

  def step_big(params, batch):
    return step({"w": params["w"], "b": params["b"] + 0.0 * params["big"][0, :CLASSES]}, batch)

  before = live_device_bytes()
  got = pe.masked_eval(step_big, params, garbage_padded(data, 32), backend=backend)
  check(got, data, w, b)
  left = live_device_bytes() - before
  assert left < big.nbytes // 4, f"{left} bytes stay on the devices after the call"
  pe.clear_caches()
  assert live_device_bytes() - before <= left


def _buffers(tree):
  return sorted(
    s.data.unsafe_buffer_pointer() for x in jax.tree.leaves(tree) for s in x.addressable_shards
  )


def test_params_placed_once_by_place_params_are_taken_as_they_are(backend):
  """pe.place_params lays the params out as masked_eval takes them: the call copies nothing
  (the step's params are the same device buffers), the copy lives while the caller keeps it,
  and the results are exact on garbage-padded batches."""
  from padded_eval.eval.backends import make_backend

  data = dataset(203, seed=21)
  w, b = weights(22)
  big = np.ones((512, 512), np.float32)  # 1 MiB on the host, 8 MiB replicated

  def step_big(params, batch):
    return step({"w": params["w"], "b": params["b"] + 0.0 * params["big"][0, :CLASSES]}, batch)

  before = live_device_bytes()
  placed = pe.place_params({"w": w, "b": b, "big": big}, backend=backend)
  kept = live_device_bytes() - before  # on CPU the copy may alias the host array: not 8 MiB
  runner = make_backend(backend, "batch", None)
  step_params = runner.place_params(placed)
  step_params = step_params[1] if backend == "pmap" else step_params  # pmap's anchored tuple
  assert _buffers(step_params) == _buffers(placed)
  for _ in range(2):
    got = pe.masked_eval(step_big, placed, garbage_padded(data, 32), backend=backend)
    check(got, data, w, b)
  assert live_device_bytes() - before < kept + big.nbytes // 4  # the caller's copy, no other
  assert all(len(x.sharding.device_set) == len(jax.devices()) for x in jax.tree.leaves(placed))
  del placed, step_params
  assert live_device_bytes() - before < big.nbytes // 4  # dropped with the caller's reference


def test_place_params_names_a_bad_backend():
  with pytest.raises(ValueError, match="backend"):
    pe.place_params({"w": np.ones(2)}, backend="vmap")


def test_repeated_calls_with_new_and_same_params_are_exact(backend):
  data = dataset(203, seed=3)
  for seed in (1, 1, 2):
    w, b = weights(seed)
    params = {"w": jnp.asarray(w), "b": jnp.asarray(b)}
    for _ in range(2):  # the second call places them again (nothing kept between calls)
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


# --- small states packed, large ones as a tree; both reduced by the collective ------------------


@pytest.mark.parametrize("limit", [1 << 16, 0])
def test_small_and_large_states_are_exact(backend, limit, monkeypatch):
  """Small: the packed state placed once (a step that keeps it); large (limit 0, the one switch
  off): a fresh tree donated to the step. Both reduced once by the collective (pmap, shard_map)."""
  monkeypatch.setattr(placement, "SMALL_STATE_BYTES", limit)
  data = dataset(301, seed=6)
  w, b = weights(7)
  got = pe.masked_eval(step, {"w": w, "b": b}, garbage_padded(data, 40), backend=backend)
  check(got, data, w, b)


def test_a_zero_size_leaf_of_a_pmap_state_is_saved_as_zeros_of_its_shape():
  """Under ``jax.disable_jit()`` (a user debugging a checkpointed pmap run, whose state is carried
  as a tree), pmap returns zero-size leaves (Accuracy's empty per-class weights) that cannot be
  fetched: "could not broadcast input array from shape (8,4,0) into shape (1,4,0)". A
  checkpoint saves such a leaf as zeros of its shape."""
  rng = np.random.default_rng(23)
  logits = [rng.normal(size=(9, CLASSES)).astype(np.float32) for _ in range(8)]
  labels = [rng.integers(0, CLASSES, 9) for _ in range(8)]
  parts = [
    jax.device_get(pe.metrics.Accuracy().batch_updates(preds=p, target=t))
    for p, t in zip(logits, labels)
  ]
  host = jax.tree.map(lambda *x: np.stack(x), *parts)
  assert any(np.size(x) == 0 for x in jax.tree.leaves(host))
  with jax.disable_jit():
    mapped = jax.pmap(lambda state: state)(host)
  empty = next(x for x in jax.tree.leaves(mapped) if np.size(x) == 0)
  from padded_eval.eval.backends import make_backend

  saved = make_backend("pmap", "batch", None).local_part(empty)
  assert saved.shape == empty.shape and saved.dtype == empty.dtype


def test_the_reused_empty_state_is_never_donated_or_changed(backend):
  data = dataset(90, seed=8)
  w, b = weights(9)
  for _ in range(3):
    got = pe.masked_eval(step, {"w": w, "b": b}, garbage_padded(data, 24), backend=backend)
    check(got, data, w, b)
  from padded_eval.eval import cache as _cache

  entries = [e for c in _cache._cache.values() for _, e in c._entries.values()]  # noqa: SLF001
  entries = [e for e in entries if e.placed is not None]  # the packed ones
  assert entries
  for entry in entries:  # the placed packed empty state
    packing, placed = entry.carrier, entry.placed
    assert not placed.is_deleted()
    got_leaf = np.asarray(placed)
    np.testing.assert_array_equal(got_leaf, np.broadcast_to(packing.empty, got_leaf.shape))


@pytest.mark.parametrize("backend", ["pmap", "shard_map"])
def test_pmap_and_shard_map_steps_run_no_collective(backend):
  """Per-shard partial states: the compiled step has no collective; the reduce is once, at the
  end."""
  import re

  from padded_eval.eval import backends
  from padded_eval.eval import cache as step_cache

  data = dataset(64, seed=10)
  w, b = weights(11)
  runner = backends.make_backend(backend, "batch", None)
  cached = step_cache.cached_step(step, runner, RowMask("mask"), False)
  params = runner.place_params({"w": w, "b": b})
  placed = runner.place_batch(backends.StepInput(next(garbage_padded(data, 32))))
  pe.masked_eval(step, {"w": w, "b": b}, garbage_padded(data, 32), backend=backend)

  empty = cached.empty_state(params, placed.batch)
  state = runner.place_state(empty)
  text = cached.compiled.step.lower(params, state, placed).compile().as_text()
  collective = r" (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\("
  assert not re.findall(collective, text)
  _, packed_step, packed = cached.packed(empty)  # the state as one word vector per shard
  text = packed_step.lower(params, packed, placed).compile().as_text()
  assert not re.findall(collective, text)


# --- caches: bounded, and emptied by pe.clear_caches() ----------------------------------------


def test_clear_caches_drops_compiled_steps_and_placed_states_and_results_stay_exact():
  from padded_eval.eval import cache as _cache

  data = dataset(97, seed=14)
  w, b = weights(15)
  check(
    pe.masked_eval(step, {"w": w, "b": b}, garbage_padded(data, 16), backend="pmap"), data, w, b
  )
  assert _cache._cache  # noqa: SLF001 - the compiled steps kept between calls
  pe.clear_caches()
  assert not _cache._cache and not _cache._compiles and not _cache._logs_programs  # noqa: SLF001
  check(
    pe.masked_eval(step, {"w": w, "b": b}, garbage_padded(data, 16), backend="pmap"), data, w, b
  )


def test_the_recompile_counts_are_bounded():
  from padded_eval.eval import cache as _cache

  pe.clear_caches()
  for i in range(_cache.COMPILES_KEPT + 10):
    _cache._count_compile(("distinct step code", i))  # noqa: SLF001
  assert len(_cache._compiles) <= _cache.COMPILES_KEPT  # noqa: SLF001
  pe.clear_caches()
