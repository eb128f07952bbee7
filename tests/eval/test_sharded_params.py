"""Sharded models under masked_eval: params keep their shardings (jit), the batch is split over
the data axes (jit and shard_map), and a step compiles once per step function, not per object.

References are numpy float64 sums over the real rows; padded rows hold NaN/inf garbage.
"""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import padded_eval as pe
from padded_eval.data import sharding
from padded_eval.eval import backends
from padded_eval.eval import cache as step_cache
from padded_eval.eval.step import RowMask

FEATURES = 16


def mesh_of(shape, names):
  return Mesh(np.array(jax.devices()).reshape(shape), names)


def dataset(rows, seed=0):
  rng = np.random.default_rng(seed)
  return {"x": rng.normal(size=(rows, FEATURES)).astype(np.float32)}


def garbage_padded(data, batch_size):
  """pe.pad_batches, with NaN and inf written into every padded row."""
  for batch in pe.pad_batches(data, batch_size):
    x = batch["x"].copy()
    x[~batch["mask"]] = np.where(np.arange(FEATURES) % 2, np.nan, np.inf)
    yield {**batch, "x": x}


def weights(seed=1):
  return np.random.default_rng(seed).normal(size=(FEATURES, 8 * 4)).astype(np.float32)


def assert_close(got, data, w, scale=1.0):
  """float32 forward passes against float64: error relative to the mean |row value|."""
  x, w = data["x"].astype(np.float64), w.astype(np.float64)
  rows = scale * np.tanh(x @ w).sum(-1)
  assert abs(got - float(np.mean(rows))) <= 1e-5 * float(np.mean(np.abs(rows)))


def mlp_step(params, batch):
  values = jnp.tanh(batch["x"] @ params["w"]).sum(-1)
  return pe.metrics.Mean().batch_updates(values=values, mask=batch["mask"])


# --- params keep their shardings under jit ---------------------------------------------------


def scaled_sum_step(params, batch):
  """Uses the sharded param only through a sum: XLA needs no all-gather of it."""
  seen = params["w"]
  jax.debug.inspect_array_sharding(seen, callback=SEEN.append)
  values = jnp.where(batch["mask"], batch["x"][:, 0], 0.0) * jnp.sum(seen)
  return pe.metrics.Mean().batch_updates(values=values, mask=batch["mask"])


SEEN: list = []


def test_fsdp_params_are_neither_copied_nor_gathered_under_jit():
  mesh = mesh_of((2, 4), ("data", "fsdp"))
  fsdp = NamedSharding(mesh, PartitionSpec(None, "fsdp"))
  w = weights()
  params = {"w": jax.device_put(w, fsdp), "scale": 2.0}
  runner = backends.make_backend("jit", "batch", mesh)
  placed = runner.place_params(params)
  assert placed["w"] is params["w"]  # the same buffers: no copy
  assert placed["scale"].sharding.is_fully_replicated  # a Python scalar is replicated

  data = dataset(45)
  SEEN.clear()
  got = pe.masked_eval(scaled_sum_step, params, garbage_padded(data, 16), backend="jit", mesh=mesh)
  want = float(np.mean(data["x"][:, 0].astype(np.float64)) * np.sum(w.astype(np.float64)))
  np.testing.assert_allclose(got["mean"], want, rtol=2e-5)
  assert SEEN and all(s.spec == fsdp.spec and not s.is_fully_replicated for s in SEEN)

  cached = step_cache.cached_step(scaled_sum_step, runner, RowMask("mask"), False)
  first = next(garbage_padded(data, 16))
  batch = runner.place_batch(backends.StepInput(first))
  empty = cached.empty_state(placed, batch.batch)
  state = runner.place_state(empty)
  compiled = cached.compiled.step.lower(placed, state, batch).compile()
  param_sharding = compiled.input_shardings[0][0]["w"]
  assert param_sharding.is_equivalent_to(fsdp, 2)
  hlo = compiled.as_text()
  assert "all-to-all" not in hlo
  # The sums are reduced, not the params gathered: the only gathers are of the metric's
  # per-device (sum, error) pairs, from its compensated sums (a few floats per device).
  gathered = re.findall(r"= f32\[([\d,]*)\]\S* all-gather(?:-start)?\(", hlo)
  assert hlo.count("all-gather(") == len(gathered)
  assert all(math.prod(int(d) for d in shape.split(",") if d) <= 8 * 8 for shape in gathered)
  assert "all-reduce" in hlo or gathered


@pytest.mark.parametrize("explicit", [True, False])
@pytest.mark.parametrize("call_mesh", [None, ((2, 4), ("data", "model"))])
def test_params_sharded_over_another_mesh_of_the_same_devices(explicit, call_mesh):
  """Params sharded over the user's ``(fsdp=4, tensor=2)`` mesh while masked_eval splits rows over
  another mesh of the same 8 devices (its default, or one passed): before, a ``jax.make_mesh``
  (Explicit axes) one raised JAX's "Mesh for all inputs should be equal". Exact, like every
  other backend, against numpy float64."""
  devices = np.array(jax.devices()[:8])
  if explicit:
    mesh = jax.make_mesh((4, 2), ("fsdp", "tensor"), devices=devices.tolist())
  else:
    mesh = Mesh(devices.reshape(4, 2), ("fsdp", "tensor"))
  w = weights()
  params = {"w": jax.device_put(w, NamedSharding(mesh, PartitionSpec(None, "fsdp")))}
  other = None if call_mesh is None else mesh_of(*call_mesh)
  data = dataset(45)
  for backend in ("jit", "pmap", "shard_map"):
    kwargs = {"mesh": other} if backend != "pmap" else {}
    got = pe.masked_eval(mlp_step, params, garbage_padded(data, 16), backend=backend, **kwargs)
    assert_close(got["mean"], data, w)


def test_replicated_params_are_still_replicated_in_every_backend():
  mesh = mesh_of((8,), ("batch",))
  w = weights()
  data = dataset(37, seed=3)
  for backend, backend_mesh in (("pmap", None), ("shard_map", mesh), ("jit", mesh)):
    for params in ({"w": w}, {"w": jnp.asarray(w)}):
      got = pe.masked_eval(
        mlp_step, params, garbage_padded(data, 16), backend=backend, mesh=backend_mesh
      )
      assert_close(got["mean"], data, w)
      assert got["num_examples"] == 37


# --- the batch is split over the data axes ------------------------------------------------


@pytest.mark.parametrize(
  "shape,names,want",
  [
    ((8,), ("batch",), ("batch",)),
    ((8,), ("x",), ("x",)),
    ((2, 4), ("x", "y"), ("x",)),
    ((4, 2), ("fsdp", "tensor"), ("fsdp",)),
    ((1, 8, 1), ("data", "fsdp", "tensor"), ("data", "fsdp")),
    ((2, 2, 2), ("tensor", "batch", "data"), ("batch", "data")),
  ],
)
def test_default_data_axes_rule(shape, names, want):
  assert sharding.data_axes(mesh_of(shape, names)) == want


def test_data_axes_errors_name_the_argument():
  mesh = mesh_of((2, 4), ("data", "model"))
  for bad in ("rows", ("data", "rows"), (), ("data", "data"), 3):
    with pytest.raises(ValueError, match="data_axes"):
      pe.masked_eval(mlp_step, {"w": weights()}, [], backend="jit", mesh=mesh, data_axes=bad)
  with pytest.raises(ValueError, match="data_axes is used by .*backend='pmap'"):
    pe.masked_eval(mlp_step, {"w": weights()}, [], backend="pmap", data_axes="batch")


def test_divisibility_is_checked_against_the_product_of_the_data_axes():
  mesh = mesh_of((1, 8, 1), ("data", "fsdp", "tensor"))
  batches = [{"x": np.zeros((12, FEATURES), np.float32), "mask": np.ones(12, bool)}]
  with pytest.raises(ValueError, match="batch size 12 is not divisible by the 8 shards"):
    pe.masked_eval(mlp_step, {"w": weights()}, batches, backend="jit", mesh=mesh)
  # split over "tensor" (size 1) only, 12 rows are fine
  got = pe.masked_eval(
    mlp_step, {"w": weights()}, batches, backend="jit", mesh=mesh, data_axes="tensor"
  )
  assert got["num_examples"] == 12


def shapes_step(params, batch):
  SHAPES.append(batch["x"].shape[0])
  jax.debug.inspect_array_sharding(batch["x"], callback=SPECS.append)
  return mlp_step(params, batch)


SHAPES: list = []
SPECS: list = []


@pytest.mark.parametrize(
  "shape,names,data_axes,shards",
  [
    ((8,), ("batch",), None, 8),
    ((2, 4), ("data", "model"), None, 2),
    ((2, 4), ("data", "fsdp"), None, 8),
    ((2, 4), ("model", "rows"), ("rows", "model"), 8),
    ((1, 8, 1), ("data", "fsdp", "tensor"), None, 8),
    ((2, 2, 2), ("data", "fsdp", "tensor"), "tensor", 2),
  ],
)
@pytest.mark.parametrize("backend", ["jit", "shard_map"])
def test_batch_is_split_over_the_data_axes_and_results_are_exact(
  backend, shape, names, data_axes, shards
):
  mesh = mesh_of(shape, names)
  data, w = dataset(53, seed=len(names)), weights(seed=shards)
  SHAPES.clear(), SPECS.clear()
  got = pe.masked_eval(
    shapes_step,
    {"w": w},
    garbage_padded(data, 16),
    backend=backend,
    mesh=mesh,
    data_axes=data_axes,
  )
  assert_close(got["mean"], data, w)
  assert got["num_examples"] == 53
  axes = sharding.data_axes(mesh, data_axes)
  if backend == "shard_map":  # step_fn sees one shard's rows
    assert set(SHAPES) == {16 // shards}
  else:  # the global batch, sharded over the data axes
    assert set(SHAPES) == {16}
    spec = sharding.partition_spec(axes)
    assert SPECS and all(s.is_equivalent_to(NamedSharding(mesh, spec), 2) for s in SPECS)


def test_layout_and_settings_name_the_data_axes():
  mesh = mesh_of((1, 8, 1), ("data", "fsdp", "tensor"))
  runner = backends.make_backend("jit", "batch", mesh)
  assert runner.data_axes == ("data", "fsdp") and runner.num_shards == 8
  assert runner.layout["data_axis"] == ["data", "fsdp"]


# --- one compilation per step function ------------------------------------------------------


TRACES: list = []


def configured_step(params, batch, *, scale, names):
  TRACES.append((scale, names))
  values = scale * jnp.tanh(batch["x"] @ params["w"]).sum(-1)
  return pe.metrics.Mean().batch_updates(values=values, mask=batch["mask"])


def evaluate_like_lm1b(params, data, scale):
  step = functools.partial(configured_step, scale=scale, names=("a", "b"))  # new each call
  return pe.masked_eval(step, params, garbage_padded(data, 16), backend="jit")


def test_a_per_call_partial_traces_once_across_three_calls():
  data, w = dataset(40, seed=5), weights(seed=5)
  TRACES.clear()
  for _ in range(3):
    got = evaluate_like_lm1b({"w": w}, data, scale=3.0)
    assert_close(got["mean"], data, w, scale=3.0)
  assert TRACES == [(3.0, ("a", "b"))]
  evaluate_like_lm1b({"w": w}, data, scale=4.0)  # other arguments: another compilation
  assert TRACES[1:] == [(4.0, ("a", "b"))]


def test_step_keys():
  f = functools.partial(configured_step, scale=1, names=("a",))
  assert step_cache.step_key(f) == step_cache.step_key(
    functools.partial(configured_step, names=("a",), scale=1)
  )
  assert step_cache.step_key(f) != step_cache.step_key(
    functools.partial(configured_step, scale=1.0, names=("a",))
  )
  unhashable = functools.partial(configured_step, scale=np.ones(2), names=())
  assert step_cache.step_key(unhashable) == step_cache.step_key(unhashable)
  assert step_cache.step_key(unhashable) != step_cache.step_key(
    functools.partial(configured_step, scale=np.ones(2), names=())
  )


def test_a_step_rebuilt_every_call_warns_on_the_third_compilation():
  data, w = dataset(24, seed=6), weights(seed=6)
  count = []

  def evaluate(scale):
    def step(params, batch):  # a new closure each call: keyed by identity
      count.append(1)
      return configured_step(params, batch, scale=scale, names=())

    return pe.masked_eval(step, {"w": w}, garbage_padded(data, 8), backend="jit")

  evaluate(1.0), evaluate(1.0)
  with pytest.warns(pe.RecompileWarning, match="module level.*functools.partial"):
    got = evaluate(1.0)
  assert len(count) == 3
  assert_close(got["mean"], data, w)


def test_a_mask_fn_rebuilt_every_call_warns_on_the_third_compilation():
  data, w = dataset(24, seed=7), weights(seed=7)
  step = functools.partial(configured_step, scale=1.0, names=())

  def evaluate():
    mask_fn = jax.jit(lambda batch: batch["mask"])  # a new function object each call
    return pe.masked_eval(step, {"w": w}, garbage_padded(data, 8), backend="jit", mask_fn=mask_fn)

  evaluate(), evaluate()
  with pytest.warns(pe.RecompileWarning, match="mask_fn"):
    got = evaluate()
  assert_close(got["mean"], data, w)
