"""masked_eval's programs compiled on worker threads: the final ``compute_logs`` program
(padded_eval.eval.cache.prepare_logs, metric_logs) and the final reduce of the partial states
(padded_eval.eval.cache.RunEntry, pmap and shard_map).

Each is traced and lowered on the calling thread before the first step, and compiled on a worker
thread while the step compiles; the answer must be the same as computing at the end: every
result here is checked against numpy float64 or scikit-learn, with NaN/inf and out-of-range
labels in the padded rows.
"""

import threading

import _compiles
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _padding_reference import garbage_padded
from sklearn.metrics import roc_auc_score

import padded_eval as pe
from padded_eval.eval import cache as _cache
from padded_eval.eval import placement

compile_spans = _compiles.compile_spans  # the fixture (tests/_compiles.py)

FEATURES, CLASSES = 5, 4


def dataset(rows, seed):
  rng = np.random.default_rng(seed)
  return {
    "x": rng.normal(size=(rows, FEATURES)).astype(np.float32),
    "y": rng.integers(0, CLASSES, rows).astype(np.int32),
  }


W = np.random.default_rng(3).normal(size=(FEATURES, CLASSES)).astype(np.float32)


def logits_of(x):
  return x @ W


def reference(data):
  logits = data["x"].astype(np.float64) @ W.astype(np.float64)
  accuracy = np.mean(np.argmax(logits, -1) == data["y"])
  return accuracy, np.mean(np.tanh(logits).sum(-1))


def step(params, batch):
  logits = batch["x"] @ params
  return pe.Metrics({"accuracy": pe.metrics.Accuracy(), "mean": pe.metrics.Mean()}).batch_updates(
    preds=logits, target=batch["y"], values=jnp.tanh(logits).sum(-1), mask=batch["mask"]
  )


class HostMean(pe.metrics.Mean):
  """A Mean whose ``compute_logs`` reads its value on the host: it does not trace."""

  def compute_logs(self):
    return {"host_mean": float(np.asarray(self.compute()))}


def host_step(params, batch):
  return HostMean().batch_updates(values=jnp.tanh(batch["x"] @ params).sum(-1), mask=batch["mask"])


def auroc_step(params, batch):
  scores = jax.nn.sigmoid((batch["x"] @ params)[:, 0])
  return pe.metrics.AUROC(exact=True, capacity=4096).batch_updates(
    preds=scores, target=batch["y"] == 0, mask=batch["mask"]
  )


def check(result, data):
  """``result``'s accuracy and mean against numpy float64 over every row of ``data``."""
  accuracy, mean = reference(data)
  np.testing.assert_allclose(result["accuracy"], accuracy, rtol=1e-7)
  np.testing.assert_allclose(result["mean"], mean, rtol=1e-6)


def worker_compiles(seen):
  return [c for c in seen if c[0] == _cache.LOGS_COMPILE_THREAD]


@pytest.mark.parametrize("backend", ("jit", "pmap", "shard_map"))
def test_the_logs_program_compiles_on_a_worker_while_the_step_compiles(backend, compile_spans):
  pe.clear_caches()
  data = dataset(203, seed=1)
  result = pe.masked_eval(step, W, garbage_padded(data, 32), backend=backend)
  assert result["num_examples"] == 203
  check(result, data)
  on_worker = worker_compiles(compile_spans)
  assert len(on_worker) == 1, compile_spans  # the logs program, compiled once, on the worker
  elsewhere = [c for c in compile_spans if c[0] != _cache.LOGS_COMPILE_THREAD]
  step_end = max(end for _, _, end in elsewhere)  # the step (and the final reduce) compiled
  assert on_worker[0][1] < step_end  # ... while the logs program was compiling
  assert not any(t.name == _cache.LOGS_COMPILE_THREAD for t in threading.enumerate())
  compile_spans.clear()
  again = dataset(41, seed=2)
  result = pe.masked_eval(step, W, garbage_padded(again, 32), backend=backend)
  assert compile_spans == []  # the compiled logs program is reused, nothing compiles
  check(result, again)


@pytest.mark.parametrize("packed", (True, False))
@pytest.mark.parametrize("backend", ("jit", "pmap", "shard_map"))
def test_the_final_reduce_compiles_on_a_worker_while_the_step_compiles(
  backend, packed, compile_spans, monkeypatch
):
  if not packed:
    monkeypatch.setattr(placement, "SMALL_STATE_BYTES", 0)
  pe.clear_caches()
  jax.clear_caches()  # JAX keeps compiled programs of its own, keyed by the lowered module
  data = dataset(117, seed=7)
  result = pe.masked_eval(step, W, garbage_padded(data, 24), backend=backend)
  assert result["num_examples"] == 117
  check(result, data)
  ahead = [c for c in compile_spans if c[0] == _cache.FINAL_COMPILE_THREAD]
  if backend == "jit":  # one global state: nothing to reduce
    assert ahead == []
    return
  assert len(ahead) == 1, compile_spans  # compiled once, on the worker
  main = [c for c in compile_spans if c[0] == threading.main_thread().name]
  assert ahead[0][1] < max(end for _, _, end in main)  # while the step compiled
  assert not any(t.name == _cache.FINAL_COMPILE_THREAD for t in threading.enumerate())
  compile_spans.clear()
  again = dataset(53, seed=8)
  result = pe.masked_eval(step, W, garbage_padded(again, 24), backend=backend)
  assert compile_spans == []  # the compiled reduce is reused
  check(result, again)


def test_a_compute_logs_that_does_not_trace_runs_eagerly(compile_spans):
  pe.clear_caches()
  data = dataset(77, seed=4)
  for _ in range(2):
    result = pe.masked_eval(host_step, W, garbage_padded(data, 16), backend="jit")
    _, mean = reference(data)
    assert type(result["host_mean"]) is float
    np.testing.assert_allclose(result["host_mean"], mean, rtol=1e-6)
  assert worker_compiles(compile_spans) == []


def test_a_metric_whose_final_shapes_depend_on_the_data_is_compiled_at_the_end(compile_spans):
  pe.clear_caches()
  data = dataset(150, seed=5)
  result = pe.masked_eval(auroc_step, W, garbage_padded(data, 32), backend="jit")
  scores = 1 / (1 + np.exp(-(data["x"].astype(np.float64) @ W.astype(np.float64))[:, 0]))
  np.testing.assert_allclose(result["auroc"], roc_auc_score(data["y"] == 0, scores), atol=1e-6)
  assert worker_compiles(compile_spans) == []  # its score buffer is trimmed to what it saw first


@pytest.mark.parametrize("backend", ("jit", "pmap", "shard_map"))
def test_a_warm_call_compiles_nothing_and_starts_no_thread(backend, compile_spans, monkeypatch):
  pe.clear_caches()
  jax.clear_caches()
  data = dataset(203, seed=11)
  result = pe.masked_eval(step, W, garbage_padded(data, 32), backend=backend)
  assert result["num_examples"] == 203
  check(result, data)
  assert len(worker_compiles(compile_spans)) == 1, compile_spans  # the logs program
  compile_spans.clear()
  again = dataset(45, seed=12)  # a warm call: no compile, nothing started on a worker
  started = []

  class Recorded(_cache.Compiling):
    def __init__(self, *args):
      started.append(args)
      super().__init__(*args)

  monkeypatch.setattr(_cache, "Compiling", Recorded)
  result = pe.masked_eval(step, W, garbage_padded(again, 32), backend=backend)
  assert compile_spans == [] and started == []
  assert result["num_examples"] == 45
  check(result, again)


def test_a_checkpointed_run_compiles_its_final_reduce_ahead_too(compile_spans, tmp_path):
  pe.clear_caches()
  jax.clear_caches()
  data = dataset(150, seed=13)
  result = pe.masked_eval(
    step,
    W,
    garbage_padded(data, 16),
    backend="shard_map",
    checkpoint_dir=tmp_path / "ckpt",
    checkpoint_every=3,
  )
  assert result["num_examples"] == 150
  check(result, data)
  assert len([c for c in compile_spans if c[0] == _cache.FINAL_COMPILE_THREAD]) == 1, compile_spans


def test_masked_eval_runs_under_disable_jit(compile_spans):
  """Under ``jax.disable_jit()`` (a user debugging their step) nothing is compiled ahead."""
  pe.clear_caches()
  data = dataset(61, seed=21)
  with jax.disable_jit():
    result = pe.masked_eval(step, W, garbage_padded(data, 16), backend="jit")
  assert result["num_examples"] == 61
  check(result, data)
  assert not [c for c in compile_spans if c[0] == _cache.FINAL_COMPILE_THREAD]
  pe.clear_caches()
