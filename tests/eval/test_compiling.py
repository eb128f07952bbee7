"""What masked_eval compiles: at most 4 programs per step and input shapes, each what ``jax.jit``
gives (padded_eval.eval.run, padded_eval.eval.compiling).

* Counted with JAX's own compile event (``jax.monitoring``), for every backend, a packed and a
  tree state, with and without per-row outputs: the first call compiles at most
  `PROGRAMS_PER_STEP`, a second call with the same shapes none. Results are checked against
  numpy float64.
* One compile tier: on ONE CPU device (a subprocess: the suite runs on 8), the per-row outputs
  of `masked_eval(..., outputs=True)` equal the user's own ``jax.jit`` of the same function on
  the same padded batches, bit for bit, on pmap and jit, with a dataset size (203) that the
  batch size (64) does not divide. (A tanh MLP: its elementwise polynomials are where an
  unoptimized compile rounds otherwise; the CPU quick tier of earlier versions differed in 1,505
  of the 2,030 values.)
"""

import functools
import json
import os
import subprocess
import sys
import textwrap

import _compiles
import jax.numpy as jnp
import numpy as np
import pytest

import padded_eval as pe
from padded_eval.eval import placement

compiles = _compiles.compiles  # the fixture (tests/_compiles.py)

PROGRAMS_PER_STEP = 4
FEATURES, CLASSES = 5, 4
W = np.random.default_rng(3).normal(size=(FEATURES, CLASSES)).astype(np.float32)


def dataset(rows, seed):
  rng = np.random.default_rng(seed)
  return {
    "x": rng.normal(size=(rows, FEATURES)).astype(np.float32),
    "y": rng.integers(0, CLASSES, rows).astype(np.int32),
  }


def step(params, batch, scale, outputs):
  """Accuracy and the mean of ``scale * tanh(logits).sum(-1)``; ``scale`` makes each case a new
  step (a new cache key: compiled afresh)."""
  logits = batch["x"] @ params
  metric = pe.Metrics({"accuracy": pe.metrics.Accuracy(), "mean": pe.metrics.Mean()})
  metric = metric.batch_updates(
    preds=logits, target=batch["y"], values=scale * jnp.tanh(logits).sum(-1), mask=batch["mask"]
  )
  return (metric, {"logits": logits}) if outputs else metric


def check(result, data, scale):
  logits = data["x"].astype(np.float64) @ W.astype(np.float64)
  assert result["num_examples"] == len(data["y"])
  np.testing.assert_allclose(result["accuracy"], np.mean(np.argmax(logits, -1) == data["y"]))
  np.testing.assert_allclose(result["mean"], scale * np.mean(np.tanh(logits).sum(-1)), rtol=1e-6)


_CASES = [
  (b, s, o) for b in ("pmap", "shard_map", "jit") for s in ("packed", "tree") for o in (0, 1)
]


@pytest.mark.parametrize("backend, carried, outputs", _CASES)
def test_a_step_compiles_at_most_four_programs_and_a_second_call_none(
  backend, carried, outputs, compiles, monkeypatch
):
  if carried == "tree":  # every state carried as its tree, donated
    monkeypatch.setattr(placement, "SMALL_STATE_BYTES", 0)
  data = dataset(203, seed=1)
  warm = functools.partial(step, scale=0.5, outputs=bool(outputs))
  pe.masked_eval(warm, W, pe.pad_batches(data, 64), backend=backend, outputs=bool(outputs))
  # JAX's eager programs of the empty state (zeros of its shapes) are compiled now, once per
  # process: what follows is the programs of the step under test alone
  scale = 1.0 + _CASES.index((backend, carried, outputs))
  fresh = functools.partial(step, scale=scale, outputs=bool(outputs))
  counts = []
  for rows, seed in ((203, 2), (150, 3)):  # the same shapes: 4 batches of 64
    compiles[0] = 0
    data = dataset(rows, seed)
    got = pe.masked_eval(fresh, W, pe.pad_batches(data, 64), backend=backend, outputs=bool(outputs))
    result, per_row = got if outputs else (got, None)
    check(result, data, scale)
    if outputs:
      want = data["x"].astype(np.float64) @ W.astype(np.float64)
      np.testing.assert_allclose(per_row["logits"], want, rtol=1e-5, atol=1e-5)
    counts.append(compiles[0])
  assert 1 <= counts[0] <= PROGRAMS_PER_STEP, counts
  assert counts[1] == 0, counts


_ONE_DEVICE_SCRIPT = textwrap.dedent(
  """
  import json, sys
  import jax, jax.numpy as jnp, numpy as np
  import padded_eval as pe

  assert jax.device_count() == 1, jax.devices()
  rng = np.random.default_rng(0)
  sizes = [(32, 64), (64, 10)]
  params = [
    (rng.normal(size=s).astype(np.float32), rng.normal(size=s[1]).astype(np.float32))
    for s in sizes
  ]
  x = (3 * rng.normal(size=(203, 32))).astype(np.float32)
  y = rng.integers(0, 10, 203).astype(np.int32)

  def model(params, x):
    for i, (w, b) in enumerate(params):
      x = x @ w + b
      x = jnp.tanh(x) if i < len(params) - 1 else x
    return jax.nn.log_softmax(x)

  def step_fn(params, batch):
    logp = model(params, batch["x"])
    metric = pe.metrics.Accuracy().batch_updates(preds=logp, target=batch["y"], mask=batch["mask"])
    return metric, {"logp": logp}

  users_jit = jax.jit(model)  # the user's own loop: the same padded batches
  batches = list(pe.pad_batches({"x": x, "y": y}, 64))
  want = np.concatenate([np.asarray(users_jit(params, b["x"]))[b["mask"]] for b in batches])
  out = {}
  for backend in ("pmap", "jit"):
    results, per_row = pe.masked_eval(step_fn, params, batches, backend=backend, outputs=True)
    got = per_row["logp"]
    out[backend] = {
      "rows": int(results["num_examples"]),
      "shape": list(got.shape),
      "equal": bool(np.array_equal(got, want)),
      "differ": int(np.sum(got != want)),
      "accuracy": float(results["accuracy"]),
    }
  out["want_accuracy"] = float(np.mean(np.argmax(want, -1) == y))
  h = x.astype(np.float64)  # numpy float64: the reference is near the exact model
  for i, (w, b) in enumerate(params):
    h = h @ w.astype(np.float64) + b
    h = np.tanh(h) if i < len(params) - 1 else h
  h = h - h.max(-1, keepdims=True)
  exact = h - np.log(np.exp(h).sum(-1, keepdims=True))
  out["want_close"] = bool(np.allclose(want, exact, atol=1e-4))
  print(json.dumps(out))
  """
)


def test_per_row_outputs_equal_the_users_own_jit_bit_for_bit_on_one_device():
  env = dict(os.environ)
  flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
  env["XLA_FLAGS"] = " ".join(flags + ["--xla_force_host_platform_device_count=1"])
  env["JAX_PLATFORMS"] = "cpu"
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
  env["JAX_NUMPY_RANK_PROMOTION"] = "allow"  # user code: x @ w + b
  done = subprocess.run(
    [sys.executable, "-c", _ONE_DEVICE_SCRIPT],
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  out = json.loads(done.stdout.strip().splitlines()[-1])
  assert out["want_close"]  # the reference itself: near float64
  for backend in ("pmap", "jit"):
    got = out[backend]
    assert got["rows"] == 203 and got["shape"] == [203, 10], got
    assert got["equal"] and got["differ"] == 0, (backend, got)
    assert got["accuracy"] == pytest.approx(out["want_accuracy"], rel=1e-6), (backend, got)


_BACKENDS, _CARRIED = ("pmap", "shard_map", "jit"), ("packed", "tree")
_CHECKPOINTED = [(b, s) for b in _BACKENDS for s in _CARRIED]


class _Preempted(RuntimeError):
  pass


def _failing(batches, fail_at):
  """``batches``, raising `_Preempted` instead of batch ``fail_at``."""
  for i, batch in enumerate(batches):
    if i == fail_at:
      raise _Preempted("preempted")
    yield batch


@pytest.mark.parametrize("backend, carried", _CHECKPOINTED)
def test_a_checkpointed_step_compiles_at_most_four_programs_and_resumes_exactly(
  backend, carried, compiles, monkeypatch, tmp_path
):
  """With ``checkpoint_dir`` the step runs on the carrier it runs on without (packed when its
  state is small): a step evaluated without then with a checkpoint compiles at most
  `PROGRAMS_PER_STEP` programs in all, a second checkpointed call none; and a run preempted
  after a save under the other carrier (a file holds the state's tree either way) resumes to
  what an uninterrupted run gives, exactly, near numpy float64, compiling nothing."""
  small = placement.SMALL_STATE_BYTES
  use = lambda which: monkeypatch.setattr(
    placement, "SMALL_STATE_BYTES", small if which == "packed" else 0
  )
  use(carried)
  data = dataset(203, seed=4)
  # JAX's eager programs, the params checksum and the on-device copy of a tree state for a
  # save are compiled now, once per process: what follows is the step under test alone
  warm = functools.partial(step, scale=0.25, outputs=False)
  for which in _CARRIED:
    use(which)
    pe.masked_eval(
      warm, W, pe.pad_batches(data, 16), backend=backend, checkpoint_dir=tmp_path / which,
      checkpoint_every=3,
    )  # fmt: skip
  use(carried)
  scale = 100.0 + _CHECKPOINTED.index((backend, carried))
  fresh = functools.partial(step, scale=scale, outputs=False)
  compiles[0] = 0
  uninterrupted = pe.masked_eval(fresh, W, pe.pad_batches(data, 16), backend=backend)
  counts = []
  for name in ("first", "second"):  # the same shapes: 13 batches of 16
    got = pe.masked_eval(
      fresh, W, pe.pad_batches(data, 16), backend=backend, checkpoint_dir=tmp_path / name,
      checkpoint_every=3,
    )  # fmt: skip
    assert got == uninterrupted
    counts.append(compiles[0])
    compiles[0] = 0
  assert 1 <= counts[0] <= PROGRAMS_PER_STEP, counts  # the call without and the first with
  assert counts[1] == 0, counts
  check(uninterrupted, data, scale)
  common = dict(backend=backend, checkpoint_dir=tmp_path / "resumed", checkpoint_every=3)
  use("tree" if carried == "packed" else "packed")
  with pytest.raises(_Preempted):
    pe.masked_eval(fresh, W, _failing(pe.pad_batches(data, 16), fail_at=8), **common)
  assert any(p.name.startswith("step_") for p in (tmp_path / "resumed" / "process_0").iterdir())
  use(carried)
  compiles[0] = 0
  resumed = pe.masked_eval(fresh, W, pe.pad_batches(data, 16), **common)
  assert compiles[0] == 0
  assert resumed == uninterrupted
