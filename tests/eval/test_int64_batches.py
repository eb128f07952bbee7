"""int64 batches through `masked_eval` (issue 26): exact or refused, never wrapped.

Without ``jax_enable_x64`` JAX wraps int64 to int32 when a batch is placed on the devices,
before any metric sees it: the mean of [2**40, 3] came out 1.5 and a target of 2**32 matched a
prediction of 0. Such a batch is now refused naming the key; int64 values inside int32, and
garbage outside it in padded rows only, evaluate exactly.
"""

import numpy as np
import pytest

import padded_eval as pe


def _mean_step(params, batch):
  del params
  return pe.metrics.Mean("x").batch_updates(x=batch["x"], mask=batch["mask"])


def _accuracy_step(params, batch):
  del params
  return pe.metrics.Accuracy().batch_updates(
    preds=batch["p"], target=batch["t"], mask=batch["mask"]
  )


@pytest.mark.parametrize("backend", ["pmap", "jit"])
def test_int64_values_beyond_int32_are_refused_naming_the_key(backend):
  data = {"x": np.array([2**40, 3] + [5] * 35, np.int64)}
  with pytest.raises(ValueError, match=r"'x'.*outside int32"):
    pe.masked_eval(_mean_step, None, pe.pad_batches(data, 16), backend=backend)


def test_int64_labels_beyond_int32_are_refused():
  data = {"p": np.zeros(37, np.int64), "t": np.full(37, 2**32, np.int64)}
  with pytest.raises(ValueError, match=r"'t'.*outside int32"):
    pe.masked_eval(_accuracy_step, None, pe.pad_batches(data, 16), backend="jit")


def test_int64_within_int32_and_garbage_in_padding_evaluate_exactly():
  rng = np.random.default_rng(0)
  x = rng.integers(-(2**24), 2**24, 37, dtype=np.int64)  # exact in float32
  batches = pe.pad_batches({"x": x}, 16, pad_value=2**40)  # padding outside int32: never read
  result = pe.masked_eval(_mean_step, None, batches, backend="shard_map")
  assert result["num_examples"] == 37
  np.testing.assert_allclose(result["mean"], x.astype(np.float64).mean(), rtol=1e-6)
