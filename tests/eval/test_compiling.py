"""The XLA options masked_eval compiles its programs with (padded_eval.eval.compiling).

On CPU the driver turns XLA's fusion emitters off (they compile a small evaluation's step about
1.5x slower) and splits each program's machine code into four parts per core. That must not
change a single bit: the results here are compared bit for bit
with the same programs compiled with XLA's defaults, and against numpy float64, on data whose
padded rows hold NaN, inf and out-of-range labels. The error-free transformations compiled
both ways are checked in ``tests/exact/test_numerics_regressions.py``.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _padding_reference import garbage_padded
from _xla_defaults import XLA_DEFAULTS

import padded_eval as pe
from padded_eval.eval import backends, compiling
from padded_eval.eval import cache as _cache
from padded_eval.eval import packing as _packing
from padded_eval.eval import run as _run

FEATURES, CLASSES = 6, 5


def test_options_are_set_on_cpu_only_and_the_users_xla_flags_win(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  split = {"xla_cpu_parallel_codegen_split_count": 1 if cores == 1 else min(4 * cores, 32)}
  assert compiling.compiler_options("cpu") == {"xla_cpu_use_fusion_emitters": False, **split}
  assert compiling.compiler_options("gpu") is None
  assert compiling.compiler_options("tpu") is None
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=true")
  assert compiling.compiler_options("cpu") == split  # the user's flag is left to XLA_FLAGS
  monkeypatch.setenv(
    "XLA_FLAGS", "--xla_cpu_use_fusion_emitters=true --xla_cpu_parallel_codegen_split_count=3"
  )
  assert compiling.compiler_options("cpu") is None
  monkeypatch.delenv("XLA_FLAGS")
  assert compiling.compiler_options("cpu") == compiling.CPU_COMPILER_OPTIONS


def test_the_logs_program_adds_its_option_on_cpu_and_the_users_flag_wins(monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  want = {**compiling.CPU_COMPILER_OPTIONS, "xla_backend_optimization_level": 0}
  assert compiling.logs_compiler_options("cpu") == want
  assert compiling.logs_compiler_options("gpu") is None
  monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=2")
  assert compiling.logs_compiler_options("cpu") == compiling.CPU_COMPILER_OPTIONS


def _data(rows, seed):
  rng = np.random.default_rng(seed)
  return {
    "x": rng.normal(size=(rows, FEATURES)).astype(np.float32),
    "y": rng.integers(0, CLASSES, rows).astype(np.int32),
  }


W = np.random.default_rng(11).normal(size=(FEATURES, CLASSES)).astype(np.float32)


METRICS = pe.Metrics({"accuracy": pe.metrics.Accuracy(), "offset_mean": pe.metrics.Mean()})


def _step(params, batch):
  logits = jnp.tanh(batch["x"] @ params) * 3
  return METRICS.batch_updates(
    preds=logits,
    target=batch["y"],
    values=1e6 + jnp.sum(logits, -1),  # an offset the exact sums must not lose
    mask=batch["mask"],
  )


def _mse_step(params, batch):
  del params
  return pe.metrics.MSE().batch_updates(
    preds=batch["x"][:, 0], target=batch["x"][:, 1], mask=batch["mask"]
  )


def _reference(data):
  logits = np.tanh(data["x"].astype(np.float64) @ W.astype(np.float64)) * 3
  return {
    "accuracy": np.mean(np.argmax(logits, -1) == data["y"]),
    "offset_mean": np.mean(1e6 + logits.sum(-1)),
  }


def _evaluate(backend, data, options, monkeypatch):
  monkeypatch.setattr(compiling, "CPU_COMPILER_OPTIONS", options)
  monkeypatch.delenv("XLA_FLAGS", raising=False)  # read when a program is built, not at start
  pe.clear_caches()
  try:
    result = pe.masked_eval(_step, W, garbage_padded(data, 24), backend=backend)
    mse = pe.masked_eval(_mse_step, None, garbage_padded(data, 24), backend=backend)
  finally:
    pe.clear_caches()  # nothing compiled with these options outlives the test
  return {**result, "mse": mse["mse"]}


TIERS = {"quick": 1 << 40, "optimized": -1}  # compiling.QUICK_BYTES that forces each tier


@pytest.mark.parametrize("tier", sorted(TIERS))
@pytest.mark.parametrize("backend", ("jit", "pmap", "shard_map"))
def test_results_are_the_same_bits_with_xla_defaults(backend, tier, monkeypatch):
  """In either tier of the step (`compiling.TieredStep`): the same bits with the driver's options
  as with XLA's defaults, and float64's values."""
  monkeypatch.setattr(compiling, "QUICK_BYTES", TIERS[tier])
  data = _data(203, seed={"jit": 1, "pmap": 2, "shard_map": 3}[backend])  # 203: not 24k, not 8k
  ours = _evaluate(backend, data, {"xla_cpu_use_fusion_emitters": False}, monkeypatch)
  defaults = _evaluate(backend, data, XLA_DEFAULTS, monkeypatch)
  assert ours["num_examples"] == defaults["num_examples"] == 203
  for name in ("accuracy", "offset_mean", "mse"):
    assert np.asarray(ours[name]).tobytes() == np.asarray(defaults[name]).tobytes(), name
  want = _reference(data)
  np.testing.assert_allclose(ours["accuracy"], want["accuracy"], rtol=1e-7)
  np.testing.assert_allclose(ours["offset_mean"], want["offset_mean"], rtol=1e-7)
  x = data["x"].astype(np.float64)
  np.testing.assert_allclose(ours["mse"], np.mean((x[:, 0] - x[:, 1]) ** 2), rtol=1e-6)


@pytest.mark.parametrize("backend", ("jit", "pmap", "shard_map"))
def test_every_program_of_a_call_is_compiled_with_the_options(backend, monkeypatch):
  """An option XLA does not know fails every program compiled with it: the step, the logs and
  the combination of the partial states each fail."""
  monkeypatch.setattr(compiling, "CPU_COMPILER_OPTIONS", {"no_such_option": True})
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  pe.clear_caches()
  try:
    with pytest.raises(Exception, match="no_such_option"):
      pe.masked_eval(_step, W, garbage_padded(_data(50, seed=1), 24), backend=backend)
    assert backends.make_backend(backend, "batch", None).compiler_options == {
      "no_such_option": True
    }
    with pytest.raises(Exception, match="no_such_option"):
      _cache._logs_program()(jax.device_get(METRICS.empty()))
    packing = _packing.StatePacking(jax.device_get(METRICS.empty()))
    with pytest.raises(Exception, match="no_such_option"):
      _packing.aggregate_packed(np.stack([packing.empty] * 8), packing)
  finally:
    pe.clear_caches()


def test_a_flax_models_outputs_are_the_same_bits():
  """Flax mnist's model (``examples/from_flax``), its loss, softmax and a few transcendental
  functions: compiled with the options or without, the same bits."""
  from flax import nnx

  from examples.from_flax import mnist_nnx

  model, split = mnist_nnx.make_inputs()
  model.eval()
  graph, state = nnx.split(model)
  images = jnp.asarray(split["image"][:256], jnp.float32) / 255
  labels = jnp.asarray(split["label"][:256])

  def outputs(state, images):
    logits = nnx.merge(graph, state)(images)
    log_probs = jax.nn.log_softmax(logits)
    return logits, -jnp.take_along_axis(log_probs, labels[:, None], -1), jnp.exp(log_probs)

  ours = jax.jit(outputs, compiler_options=compiling.CPU_COMPILER_OPTIONS)(state, images)
  defaults = jax.jit(outputs, compiler_options=XLA_DEFAULTS)(state, images)
  for a, b in zip(ours, defaults, strict=True):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
  # The quick tier rounds each float operation as written (no multiply-add contracted into one
  # rounding, in the model and in XLA's exp and log): other bits, float32's precision.
  quick_options = {**compiling.CPU_COMPILER_OPTIONS, **compiling.QUICK_OPTIONS}
  quick = jax.jit(outputs, compiler_options=quick_options)(state, images)
  x = np.asarray(images, np.float64).reshape(len(images), -1)
  linear1, norm, linear2 = (state[name] for name in ("linear1", "batch_norm", "linear2"))
  hidden = x @ np.asarray(linear1["kernel"][...], np.float64) + np.asarray(linear1["bias"][...])
  hidden = (hidden - np.asarray(norm["mean"][...])) / np.sqrt(np.asarray(norm["var"][...]) + 1e-5)
  hidden = np.maximum(hidden * np.asarray(norm["scale"][...]) + np.asarray(norm["bias"][...]), 0)
  logits = hidden @ np.asarray(linear2["kernel"][...], np.float64) + np.asarray(
    linear2["bias"][...]
  )
  for got, optimized in zip(quick, ours, strict=True):
    np.testing.assert_allclose(got, optimized, rtol=2e-6, atol=2e-6)
  np.testing.assert_allclose(quick[0], logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ours[0], logits, rtol=1e-5, atol=1e-5)


def _logs_cases(rng):
  """``(metric, update keywords, numpy float64 reference)`` of metrics whose ``compute`` does
  more than one division: Chan's merge, correlations, confusion-matrix scores, an ``exp``."""
  from sklearn import metrics as sk

  n = 509  # neither the batch (24) nor the devices (8) divide it
  x = (rng.normal(size=n) * 3 + 1e3).astype(np.float32)
  y = (0.7 * x + rng.normal(size=n)).astype(np.float32)
  logits = (rng.normal(size=(n, CLASSES)) * 2).astype(np.float32)
  labels = rng.integers(0, CLASSES, n).astype(np.int32)
  x64, y64 = x.astype(np.float64), y.astype(np.float64)
  predicted = np.argmax(logits, -1)
  log_probs = logits - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
  return [
    (pe.metrics.Std(), {"values": x}, np.std(x64)),
    (pe.metrics.PearsonCorrelation(), {"preds": x, "target": y}, np.corrcoef(x64, y64)[0, 1]),
    (pe.metrics.R2Score(), {"preds": x, "target": y}, sk.r2_score(y64, x64)),
    (
      pe.metrics.ExplainedVariance(),
      {"preds": x, "target": y},
      sk.explained_variance_score(y64, x64),
    ),
    (
      pe.metrics.MatthewsCorrCoef(num_classes=CLASSES),
      {"preds": logits, "target": labels},
      sk.matthews_corrcoef(labels, predicted),
    ),
    (
      pe.metrics.CohenKappa(num_classes=CLASSES),
      {"preds": logits, "target": labels},
      sk.cohen_kappa_score(labels, predicted),
    ),
    (
      pe.metrics.F1Score(num_classes=CLASSES, average="macro"),
      {"preds": logits, "target": labels},
      sk.f1_score(labels, predicted, average="macro"),
    ),
    (
      pe.metrics.Perplexity(),
      {"preds": logits[:, None], "target": labels[:, None]},
      np.exp(-np.mean(log_probs[np.arange(n), labels])),
    ),
  ]


def _padded_rows(data, batch_size):
  """``pe.pad_batches`` of ``data`` with NaN (floats) and 10**6 (ints) in the padded rows."""
  for batch in pe.pad_batches(data, batch_size):
    padded = ~batch["mask"]
    out = dict(batch)
    for key, value in data.items():
      value = batch[key].copy()
      value[padded] = np.nan if value.dtype.kind == "f" else 10**6
      out[key] = value
    yield out


def test_the_logs_program_gives_the_eager_bits_and_xla_defaults_bits():
  """The logs program, compiled without LLVM's optimizations (`compiling.logs_compiler_options`),
  computes each metric's formula as written: the same bits as ``compute_logs()`` run eagerly,
  and as a ``jax.jit`` of it with XLA's defaults, and numpy float64 to float32 precision."""
  for metric, inputs, want in _logs_cases(np.random.default_rng(5)):
    keys = sorted(inputs)

    def step(params, batch, metric=metric, keys=keys):
      del params
      return metric.batch_updates(**{k: batch[k] for k in keys}, mask=batch["mask"])

    pe.clear_caches()
    results = pe.masked_eval(step, None, _padded_rows(inputs, 24), backend="jit")
    assert results["num_examples"] == 509
    name = next(k for k in results if k != "num_examples")
    final = results.metric
    eager = final.compute_logs()[name]
    defaults = jax.jit(lambda m: m.compute_logs(), compiler_options=XLA_DEFAULTS)(final)[name]
    got = np.asarray(results[name], np.float32)
    assert got.tobytes() == np.asarray(eager, np.float32).tobytes(), type(metric).__name__
    assert got.tobytes() == np.asarray(defaults, np.float32).tobytes(), type(metric).__name__
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=type(metric).__name__)
  pe.clear_caches()


def _bytes_step(params, batch):
  """A step whose written bytes grow with its ``[B, width]`` input: exact accuracy and mean."""
  logits = jnp.tanh(batch["x"] @ params) * 3
  return METRICS.batch_updates(
    preds=logits, target=batch["y"], values=1e6 + jnp.sum(logits, -1), mask=batch["mask"]
  )


def test_a_small_step_compiles_quick_and_a_large_one_optimized(monkeypatch):
  """The tier is chosen from the bytes one batch's statistics write, per input shapes: once per
  shapes (one compilation each, also when the number of batches changes), exact in both tiers,
  and one tier when ``XLA_FLAGS`` names the optimization level."""
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  pe.clear_caches()
  chosen = []
  choose = compiling.choose_tier

  def recording(step, written):
    program = choose(step, written)
    chosen.append("quick" if program is step.quick else "optimized")
    return program

  monkeypatch.setattr(_run, "choose_tier", recording)
  small, large = _data(203, seed=4), _data(20_003, seed=5)
  compiles = []

  def listener(event, duration, **kwargs):
    del duration, kwargs
    if event.endswith("backend_compile_duration"):
      compiles.append(event)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    for data, batch_size in ((small, 24), (large, 4096), (small, 24), (large, 4096)):
      result = pe.masked_eval(_step, W, garbage_padded(data, batch_size), backend="jit")
      want = _reference(data)
      assert result["num_examples"] == len(data["y"])
      np.testing.assert_allclose(result["accuracy"], want["accuracy"], rtol=1e-7)
      np.testing.assert_allclose(result["offset_mean"], want["offset_mean"], rtol=1e-7)
    assert chosen == ["quick", "optimized", "quick", "optimized"]
    # more batches of the same shapes: the same tier, nothing compiles again
    before = len(compiles)
    more = _data(2003, seed=6)
    result = pe.masked_eval(_step, W, garbage_padded(more, 24), backend="jit")
    np.testing.assert_allclose(result["offset_mean"], _reference(more)["offset_mean"], rtol=1e-7)
    assert chosen[-1] == "quick" and len(compiles) == before
  finally:
    pe.clear_caches()
    _unregister(listener)
  step = compiling.TieredStep(lambda x: x + 1, compiling.compiler_options("cpu"), "cpu")
  assert step.quick is not None
  assert compiling.TieredStep(lambda x: x, None, "gpu").quick is None  # CPU only
  monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=2")
  one = compiling.TieredStep(lambda x: x + 1, compiling.compiler_options("cpu"), "cpu")
  assert one.quick is None  # the user's level: one tier
  assert compiling.choose_tier(one, 0) is one
  assert compiling.choose_tier(step, compiling.QUICK_BYTES) is step.quick
  assert compiling.choose_tier(step, compiling.QUICK_BYTES + 1) is step


def test_written_bytes_counts_nested_programs():
  """What `compiling.choose_tier` measures: every value a traced program computes, those of
  nested programs (a call's, a loop body's) too, each once."""
  inner = jax.jit(lambda x: jnp.sin(x) * 2)  # sin, mul: 2 x 4000 bytes

  def outer(x):
    y = inner(x) + 1  # the call's result and the add: 2 x 4000
    return jax.lax.scan(lambda v, _: (v * 2, None), y, None, length=3)[0]  # loop, body: 2 x 4000

  jaxpr = jax.make_jaxpr(outer)(np.zeros(1000, np.float32)).jaxpr
  assert compiling.written_bytes(jaxpr) == 6 * 4000


def _unregister(listener) -> None:
  unregister = getattr(jax.monitoring, "unregister_event_duration_listener", None)
  if unregister is None:
    from jax._src import monitoring

    unregister = monitoring._unregister_event_duration_listener_by_callback  # noqa: SLF001
  unregister(listener)


def test_the_partial_states_combination_is_the_same_bits_at_every_level(monkeypatch):
  """The combination of a small state's partial states (`packing.aggregate_packed`) is compiled
  as the logs program is (LLVM unoptimized on CPU): exact arithmetic, so the same bits as with
  the driver's optimized options and with XLA's defaults, and float64's totals."""
  from padded_eval.exact.accumulate import ExactCount

  rng = np.random.default_rng(23)
  parts, rows = [], []
  for _ in range(8):
    data = _data(int(rng.integers(1, 40)), seed=int(rng.integers(1 << 30)))
    logits = jnp.tanh(data["x"] @ W) * 3
    values = 1e6 + jnp.sum(logits, -1)
    state = METRICS.batch_updates(preds=logits, target=data["y"], values=values)
    parts.append((jax.device_get(state), jax.device_get(ExactCount.of(len(data["y"])))))
    rows.append((np.asarray(logits, np.float64), data["y"], np.asarray(values, np.float64)))
  packing = _packing.StatePacking(parts[0])
  packed = np.stack([packing.pack_host(part) for part in parts])
  combined = {}
  for name, options in (
    ("quick", compiling.logs_compiler_options("cpu")),
    ("driver", compiling.compiler_options("cpu")),
    ("defaults", XLA_DEFAULTS),
  ):
    program = jax.jit(_packing._combined, static_argnums=1, compiler_options=options)  # noqa: SLF001
    combined[name] = np.asarray(program(packed, packing))
  assert combined["quick"].tobytes() == combined["driver"].tobytes()
  assert combined["quick"].tobytes() == combined["defaults"].tobytes()
  pe.clear_caches()
  got = np.asarray(_packing.aggregate_packed(packed, packing))  # the driver's own program
  assert got.tobytes() == combined["quick"].tobytes()
  (total, count) = packing.unpack_host(got)
  logits = np.concatenate([r[0] for r in rows])
  labels = np.concatenate([r[1] for r in rows])
  values = np.concatenate([r[2] for r in rows])
  logs = total.compute_logs()
  np.testing.assert_allclose(logs["accuracy"], np.mean(np.argmax(logits, -1) == labels), rtol=1e-7)
  np.testing.assert_allclose(logs["offset_mean"], np.mean(values), rtol=1e-7)
  assert int(count.to_numpy()) == len(labels)
