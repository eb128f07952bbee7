"""masked_eval: exact results against float64 references, one trace and one compilation.

Padded rows hold NaN features and out-of-range garbage labels; a result that is
right on them proves the mask is applied before any arithmetic. Traces are counted
with a Python counter inside ``step_fn``; compilations with JAX's compile events.
"""

import collections
import itertools

import _source_cases as source_cases
import jax
import jax.monitoring
import jax.numpy as jnp
import numpy as np
import pytest
from _backends import BACKENDS
from _source_cases import AccuracyAndMSE
from sklearn.metrics import accuracy_score

import padded_eval as pe
from padded_eval.exact.accumulate import ExactCount
from padded_eval.metrics.base import Metric, state

NUM_FEATURES, NUM_CLASSES, BATCH = 3, 5, 64
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def make_params(seed=0):
  """Small-integer weights with class biases k/8 (see _source_cases.make_params)."""
  return source_cases.make_params(seed)


def make_data(n, seed=1):
  rng = np.random.default_rng(seed)
  return {
    "x": rng.integers(-4, 5, (n, NUM_FEATURES)).astype(np.float32),
    "label": rng.integers(0, NUM_CLASSES, n).astype(np.int32),
    "y": rng.normal(size=n).astype(np.float32),
  }


def reference(params, data):
  """float64 numpy / scikit-learn results over the real rows only."""
  x = data["x"].astype(np.float64)
  logits = x @ params["w_cls"].astype(np.float64) + params["b_cls"].astype(np.float64)
  preds = x @ params["w_reg"].astype(np.float64)
  return {
    "accuracy": accuracy_score(data["label"], logits.argmax(-1)),
    "mse": np.mean((preds - data["y"].astype(np.float64)) ** 2),
    "num_examples": len(data["y"]),
  }


def garbage_batches(data, batch_size=BATCH, seed=2):
  """Fixed-size batches whose padded rows hold NaN/inf features and out-of-range labels."""
  rng = np.random.default_rng(seed)
  n = len(data["y"])
  batches = []
  for start in range(0, max(n, 1), batch_size):
    real = min(batch_size, n - start)
    pad = batch_size - real
    batches.append(
      {
        "x": np.concatenate(
          [
            data["x"][start : start + real],
            rng.choice([np.nan, np.inf, -1e30], (pad, NUM_FEATURES)),
          ]
        ).astype(np.float32),
        "label": np.concatenate(
          [data["label"][start : start + real], rng.integers(-99, 99, pad)]
        ).astype(np.int32),
        "y": np.concatenate([data["y"][start : start + real], np.full(pad, np.nan)]).astype(
          np.float32
        ),
        "mask": np.arange(batch_size) < real,
      }
    )
  return batches


def make_step(traces, expected_rows=None):
  """A fresh step_fn (a new compile-cache key) that counts its traces in ``traces``."""

  def step_fn(params, batch):
    traces.append(batch["x"].shape)
    if expected_rows is not None:
      assert batch["x"].shape[0] == expected_rows, batch["x"].shape
    logits = batch["x"] @ params["w_cls"] + params["b_cls"][None, :]
    preds = batch["x"] @ params["w_reg"]
    return AccuracyAndMSE().batch_updates(
      logits=logits, labels=batch["label"], preds=preds, target=batch["y"], mask=batch["mask"]
    )

  return step_fn


@pytest.fixture
def compiles():
  """Names of the XLA compilations made while the test runs."""
  names = []

  def listener(event, duration, **kwargs):
    del duration
    if event == _COMPILE_EVENT:
      names.append(kwargs.get("fun_name"))

  jax.monitoring.register_event_duration_secs_listener(listener)
  yield names
  # public from jax 0.9 on; the floors (.ci/floors) run older versions
  unregister = getattr(jax.monitoring, "unregister_event_duration_listener", None)
  if unregister is None:
    from jax._src import monitoring

    unregister = monitoring._unregister_event_duration_listener_by_callback
  unregister(listener)


def assert_matches(result, expected):
  assert set(result) == {"accuracy", "mse", "num_examples"}
  assert type(result["num_examples"]) is int and result["num_examples"] == expected["num_examples"]
  assert type(result["accuracy"]) is float and type(result["mse"]) is float
  np.testing.assert_allclose(result["accuracy"], expected["accuracy"], rtol=1e-6)
  np.testing.assert_allclose(result["mse"], expected["mse"], rtol=1e-5)


@pytest.mark.parametrize("backend, n", list(itertools.product(BACKENDS, (1, 63, 64, 65, 1003))))
def test_exact_and_traced_once(backend, n):
  params, data = make_params(), make_data(n)
  traces = []
  rows = BATCH if backend == "jit" else BATCH // jax.local_device_count()
  result = pe.masked_eval(make_step(traces, rows), params, garbage_batches(data), backend=backend)
  assert_matches(result, reference(params, data))
  assert len(traces) == 1, traces


@pytest.mark.parametrize("steps_in_flight", (1, 2, 3))
def test_steps_in_flight_do_not_change_results(steps_in_flight):
  params, data = make_params(), make_data(300)
  result = pe.masked_eval(
    make_step([]),
    params,
    garbage_batches(data, batch_size=16),
    backend="pmap",
    steps_in_flight=steps_in_flight,
  )
  assert_matches(result, reference(params, data))


def test_one_compilation_and_reuse_across_calls(backend, compiles):
  params = make_params()
  # Warm the eager host-side ops (compute, state placement) with another step_fn.
  pe.masked_eval(make_step([]), params, garbage_batches(make_data(5)), backend=backend)
  compiles.clear()
  traces = []
  step_fn = make_step(traces)
  first = pe.masked_eval(step_fn, params, garbage_batches(make_data(1003)), backend=backend)
  # the step, once, for 16 steps and a short last batch; under pmap and shard_map its final
  # reduce of the partial states, once (jit's state is global: no final program)
  assert len(compiles) == (1 if backend == "jit" else 2), compiles
  assert len(traces) == 1
  compiles.clear()
  data = make_data(65, seed=7)
  second = pe.masked_eval(step_fn, params, garbage_batches(data), backend=backend)
  assert compiles == [] and len(traces) == 1  # the cached compiled step is reused
  assert_matches(second, reference(params, data))
  assert first["num_examples"] == 1003


@pytest.mark.parametrize("backend", ("shard_map", "jit"))
def test_two_dimensional_mesh_splits_rows_over_first_axis(backend):
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  params, data = make_params(), make_data(203)
  traces = []
  rows = BATCH if backend == "jit" else BATCH // 4
  result = pe.masked_eval(
    make_step(traces, rows), params, garbage_batches(data), backend=backend, mesh=mesh
  )
  assert_matches(result, reference(params, data))
  assert len(traces) == 1


def test_jit_step_sees_global_array_sharded_over_mesh():
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  seen = []

  def step_fn(params, batch):
    seen.append(jax.typeof(batch["x"]).shape)
    return pe.metrics.Mean().batch_updates(values=batch["x"][:, 0] * params, mask=batch["mask"])

  data = make_data(70)
  result = pe.masked_eval(
    step_fn, 2.0, garbage_batches(data, batch_size=16), backend="jit", mesh=mesh
  )
  assert seen == [(16, NUM_FEATURES)]
  np.testing.assert_allclose(
    result["mean"], 2 * data["x"][:, 0].astype(np.float64).mean(), rtol=1e-6
  )


def test_tf_data_source_through_pad_batches(backend):
  tf = pytest.importorskip("tensorflow")
  params, data = make_params(), make_data(1003, seed=3)
  dataset = tf.data.Dataset.from_tensor_slices(data).batch(100)  # 100 rows: re-chunked to 64
  batches = pe.pad_batches(dataset, BATCH, pad_value=-7)
  traces = []
  result = pe.masked_eval(make_step(traces), params, batches, backend=backend)
  assert_matches(result, reference(params, data))
  assert len(traces) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_tf_data_of_203_rows_in_batches_of_64_on_8_devices_loses_no_row(backend):
  """Issue 26: with drop_remainder=True 192 of 203 rows were counted; now refused, and every pipeline that
  reads each row once gives scikit-learn's numbers (padded rows: NaN features, label -7)."""
  tf = pytest.importorskip("tensorflow")
  assert jax.local_device_count() == 8
  params, data = make_params(), make_data(203, seed=5)
  rows = tf.data.Dataset.from_tensor_slices(data)
  pad = {"x": np.nan, "label": -7, "y": np.nan}
  expected, traces = reference(params, data), []
  step = make_step(traces)
  for pipeline in (
    rows,
    rows.batch(16),
    rows.batch(16).repeat(1),
    rows.shuffle(7, seed=0).batch(20),
  ):
    result = pe.masked_eval(
      step, params, pe.pad_batches(pipeline, BATCH, pad_value=pad), backend=backend
    )
    assert_matches(result, expected)
    assert result["num_examples"] == 203
  assert len(traces) == 1
  with pytest.raises(ValueError, match=r"drop_remainder=True.*11 of 203 rows in batches of 16"):
    pe.pad_batches(rows.batch(16, drop_remainder=True), BATCH, pad_value=pad)


def test_progress_bar_counts_batches(capsys):
  data = make_data(130)
  result = pe.masked_eval(
    make_step([]), make_params(), garbage_batches(data), backend="jit", progress=True
  )
  assert result["num_examples"] == 130
  err = capsys.readouterr().err
  assert "3/3" in err and "ex_per_s" in err


def test_array_metric_comes_back_as_numpy():
  class Histogram(Metric):
    counts: ExactCount = state(lambda self: ExactCount.zeros((3,)))

    def _batch_state(self, *, target, mask, **_):
      hits = (target[:, None] == jnp.arange(3)[None, :]) & mask[:, None]
      return {"counts": ExactCount.of(hits.sum(0, dtype=jnp.int32))}

    def compute(self):
      return self.counts.total()

  data = make_data(99)
  result = pe.masked_eval(
    lambda p, b: Histogram().batch_updates(target=b["label"], mask=b["mask"]),
    None,
    garbage_batches(data),
    backend="pmap",
  )
  assert isinstance(result["histogram"], np.ndarray)
  np.testing.assert_array_equal(result["histogram"], np.bincount(data["label"], minlength=5)[:3])


@pytest.mark.parametrize("backend, params", list(itertools.product(BACKENDS, (None, {}, ()))))
def test_params_without_leaves(backend, params):
  # jax.pmap misaligns in_axes=None for an argument without leaves; masked_eval works around it.
  data = make_data(37)
  step_fn = lambda p, b: pe.metrics.Mean().batch_updates(values=b["x"], mask=b["mask"])
  result = pe.masked_eval(step_fn, params, garbage_batches(data, batch_size=16), backend=backend)
  np.testing.assert_allclose(result["mean"], data["x"].astype(np.float64).mean(), rtol=1e-6)
  assert result["num_examples"] == 37


# --- errors -------------------------------------------------------------------------


def _step_mean(params, batch):
  return pe.metrics.Mean().batch_updates(values=batch["x"], mask=batch["mask"])


def _batches(batch_size=16, n=2):
  return [{"x": np.ones((batch_size, 2), np.float32), "mask": np.ones(batch_size, bool)}] * n


def test_step_that_returns_no_metric(backend):
  with pytest.raises(ValueError, match="must return a padded_eval Metric.*dict"):
    pe.masked_eval(lambda p, b: {"loss": b["x"].sum()}, None, _batches(), backend=backend)


def test_batch_without_mask_key():
  with pytest.raises(ValueError, match="no mask key 'mask'.*\\['x'\\]"):
    pe.masked_eval(_step_mean, None, [{"x": np.ones((16, 2))}], backend="jit")


def test_batch_size_not_divisible_by_devices(backend):
  with pytest.raises(ValueError, match="batch size 12 is not divisible by the 8 devices"):
    pe.masked_eval(_step_mean, None, _batches(12), backend=backend)


@pytest.mark.parametrize("backend", ("shard_map", "jit"))
def test_mesh_first_axis_does_not_divide_batch(backend):
  mesh = jax.make_mesh((4, 2), ("data", "model"))
  with pytest.raises(ValueError, match="batch size 6 is not divisible by the 4 shards.*'data'"):
    pe.masked_eval(_step_mean, None, _batches(6), backend=backend, mesh=mesh)


def test_unknown_backend():
  with pytest.raises(
    ValueError, match="backend must be one of 'pmap', 'shard_map', 'jit'; got 'vmap'"
  ):
    pe.masked_eval(_step_mean, None, _batches(), backend="vmap")


def test_mesh_with_pmap_backend():
  with pytest.raises(ValueError, match="mesh is used by the 'shard_map' and 'jit' backends"):
    pe.masked_eval(_step_mean, None, _batches(), mesh=jax.make_mesh((8,), ("batch",)))


def test_batch_whose_shape_changes():
  batches = _batches(16, 1) + _batches(24, 1)
  with pytest.raises(ValueError, match="batch 1 has .*\\(24, 2\\).*expected the first batch's"):
    pe.masked_eval(_step_mean, None, batches, backend="jit")


def test_batch_whose_containers_change(backend):
  """Same keys, shapes and dtypes in an OrderedDict: the step would retrace, so it is refused."""
  first, second = _batches(16, 2)
  with pytest.raises(
    ValueError, match="batch 1 has structure .*OrderedDict.*expected the first batch's"
  ):
    pe.masked_eval(_step_mean, None, [first, collections.OrderedDict(second)], backend=backend)


@pytest.mark.parametrize(
  "kwargs, match",
  [  # issue 26: a plain TypeError (or a batch named None) before
    ({"step_fn": None}, r"^step_fn must be a function \(params, batch\) -> Metric.*; got None$"),
    ({"batches": None}, r"^batches must be an iterable of padded dict batches.*; got None$"),
    ({"batches": 3}, r"^batches must be an iterable .*; got 3$"),
    (
      {"batches": _batches(16, 1)[0]},
      r"^batches must be an iterable .*; got a dict \(one batch\?\)$",
    ),
    ({"mask_key": None}, r"^mask_key must be a non-empty string.*; got None$"),
    ({"mask_key": ""}, r"^mask_key must be a non-empty string.*; got ''$"),
  ],
)
def test_bad_arguments_are_named(kwargs, match):
  arguments = {"step_fn": _step_mean, "batches": _batches()} | kwargs
  step_fn, batches = arguments.pop("step_fn"), arguments.pop("batches")
  with pytest.raises(ValueError, match=match):
    pe.masked_eval(step_fn, None, batches, backend="jit", **arguments)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("axis_name", (3, None, "", b"batch"))
def test_bad_axis_name_is_named(backend, axis_name):
  """Fuzzing: a TypeError from MLIR, a squeeze error or a mesh error before, naming no argument
  ('' ran under shard_map and jit but not under pmap)."""
  with pytest.raises(
    ValueError, match=rf"^axis_name must be a non-empty string.*; got {axis_name!r}$"
  ):
    pe.masked_eval(_step_mean, None, _batches(), backend=backend, axis_name=axis_name)


def test_no_batches():
  with pytest.raises(ValueError, match="batches yielded no batch"):
    pe.masked_eval(_step_mean, None, [], backend="jit")


@pytest.mark.parametrize("steps_in_flight", (0, 1.5, True))
def test_bad_steps_in_flight(steps_in_flight):
  with pytest.raises(ValueError, match="steps_in_flight must be an int >= 1"):
    pe.masked_eval(_step_mean, None, _batches(), steps_in_flight=steps_in_flight)


def test_mask_must_be_bool_rows():
  with pytest.raises(
    ValueError, match="'mask' has shape \\(16,\\) and dtype int64; expected a bool"
  ):
    pe.masked_eval(_step_mean, None, [{"x": np.ones((16, 2)), "mask": np.ones(16, np.int64)}])


def _real_rows(batch):
  """A mask function: the rows a batch marks real (masked_eval(mask_key=<function>))."""
  return batch["mask"]


def test_mask_key_may_be_the_mask_function(backend):
  """One name, one switch: ``mask_key`` is a key or a function; a function counts num_examples
  like the key does, on every carrier (packed host count under jit, in-step elsewhere)."""
  params, data = make_params(3), make_data(203, seed=4)
  traces = []
  by_key = pe.masked_eval(make_step(traces), params, garbage_batches(data), backend=backend)
  by_fn = pe.masked_eval(
    make_step(traces), params, garbage_batches(data), backend=backend, mask_key=_real_rows
  )
  assert_matches(by_fn, reference(params, data))
  assert by_fn == by_key
  with pytest.raises(ValueError, match="mask_key must be a non-empty string .* or a function"):
    pe.masked_eval(make_step(traces), params, garbage_batches(data), backend=backend, mask_key=3)


class _RefillingLoader:
  """A source that yields one numpy buffer, refilled in place for each chunk of ``rows``."""

  def __init__(self, x: np.ndarray, rows: int):
    self.x, self.rows = x, rows

  def __iter__(self):
    buffer = np.empty((self.rows, *self.x.shape[1:]), self.x.dtype)
    ids = np.empty(self.rows, np.int32)
    for start in range(0, len(self.x), self.rows):
      size = min(self.rows, len(self.x) - start)
      buffer[:size], ids[:size] = self.x[start : start + size], np.arange(start, start + size)
      yield {"x": buffer[:size], "id": ids[:size]}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("rows", [64, 256])
def test_a_source_that_refills_its_buffer_loses_no_row(backend, rows):
  """A source may refill the arrays it yielded once it is asked for the next chunk: before,
  full batches (and the slices of a larger chunk) went to the devices uncopied while the source
  refilled them, and a step whose copy was still in flight read the next batch's rows (a wrong
  mean, the right row count). 1000 rows (no multiple of 64 or 8), a slow step."""
  rng = np.random.default_rng(3)
  x = rng.integers(0, 100, (1000, 64)).astype(np.float32)
  kernel = np.eye(64, dtype=np.float32)
  metrics = pe.Metrics([pe.metrics.Mean("x")])

  def step(params, batch):
    slow = batch["x"]
    for _ in range(12):  # a slower model: steps queue up behind the copies
      slow = jnp.tanh(slow @ params) * 0.0
    outputs = {"id": batch["id"], "x0": batch["x"][:, 0]}
    return metrics.batch_updates(x=batch["x"] + slow, mask=batch["mask"]), outputs

  for _ in range(3):
    batches = pe.pad_batches(_RefillingLoader(x, rows), 64)
    results, per_row = pe.masked_eval(step, kernel, batches, backend=backend, outputs=True)
    assert results["num_examples"] == len(x)
    np.testing.assert_allclose(results["mean"], np.mean(x.astype(np.float64)), rtol=1e-6)
    np.testing.assert_array_equal(per_row["id"], np.arange(len(x)))
    np.testing.assert_array_equal(per_row["x0"], x[:, 0])
