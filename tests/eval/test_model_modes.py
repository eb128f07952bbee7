"""masked_eval warns when an nnx model passed as params is in training mode (issue 65).

The reference is numpy float64 of the same linear layers without dropout; padding rows are NaN.
"""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import padded_eval as pe
from padded_eval.eval import model_modes

ROWS = 203


class Net(nnx.Module):
  def __init__(self, rngs):
    self.hidden = nnx.Linear(4, 8, rngs=rngs)
    self.drop = nnx.Dropout(0.5, rngs=rngs)
    self.out = nnx.Linear(8, 3, rngs=rngs)

  def __call__(self, x):
    return self.out(self.drop(nnx.relu(self.hidden(x))))


def _step(model, batch):
  loss = jnp.sum(model(batch["x"]) ** 2, axis=-1)
  return pe.metrics.Mean("loss").batch_updates(loss=loss, mask=batch["mask"])


def _reference(model, x):
  x = x.astype(np.float64)
  w1, b1 = np.asarray(model.hidden.kernel[...]), np.asarray(model.hidden.bias[...])
  w2, b2 = np.asarray(model.out.kernel[...]), np.asarray(model.out.bias[...])
  out = np.maximum(x @ w1 + b1, 0) @ w2 + b2
  return np.mean(np.sum(out**2, -1))


@pytest.mark.parametrize("backend", ["pmap", "jit"])
def test_dropout_in_training_mode_warns_and_eval_mode_is_exact(backend):
  """Before: the model evaluated with dropout on, a number off the model's, without a word."""
  x = np.random.default_rng(65).standard_normal((ROWS, 4)).astype(np.float32)
  batches = lambda: pe.pad_batches({"x": x}, 32, pad_value=np.nan)
  model = Net(nnx.Rngs(0))
  with pytest.warns(
    UserWarning, match=r"training mode: Dropout at 'drop' \(rate 0.5.*model\.eval\(\)"
  ):
    pe.masked_eval(_step, model, batches(), backend=backend)
  model.eval()
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    got = pe.masked_eval(  # the model inside a pytree is found too
      lambda params, batch: _step(params["model"], batch),
      {"model": model},
      batches(),
      backend=backend,
    )
  np.testing.assert_allclose(got["mean"], _reference(model, x), rtol=1e-5)


def test_batch_norm_in_training_mode_is_named():
  model = nnx.Sequential(nnx.Linear(2, 2, rngs=nnx.Rngs(0)), nnx.BatchNorm(2, rngs=nnx.Rngs(0)))
  assert model_modes.training_layers({"m": model}) == [
    "BatchNorm at 'layers/1' (use_running_average=False)"
  ]
  model.eval()
  assert model_modes.training_layers(model) == []
  assert model_modes.training_layers({"w": np.ones(3)}) == []
