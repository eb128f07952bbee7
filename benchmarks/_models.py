"""Small pure-JAX models shared by the benchmarks (no framework, so timings measure the driver)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def mlp_params(sizes: tuple[int, ...], seed: int = 0) -> list[dict[str, np.ndarray]]:
  """He-initialised dense layers ``sizes[i] -> sizes[i + 1]`` as host float32 arrays.

  Args:
    sizes: ``(inputs, hidden, ..., outputs)``.
    seed: numpy seed.

  Returns:
    A list of ``{"w": [fan_in, fan_out], "b": [fan_out]}``.
  """
  rng = np.random.default_rng(seed)
  return [
    {
      "w": (rng.normal(size=(m, n)) * np.sqrt(2.0 / m)).astype(np.float32),
      "b": np.zeros(n, np.float32),
    }
    for m, n in zip(sizes[:-1], sizes[1:])
  ]


def mlp_apply(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
  """``x [B, inputs] -> logits [B, outputs]``: ReLU between layers, none after the last."""
  dense = lambda x, layer: x @ layer["w"] + layer["b"][None, :]  # explicit: promotion may raise
  for layer in params[:-1]:
    x = jax.nn.relu(dense(x, layer))
  return dense(x, params[-1])


def classification_data(num_rows: int, num_features: int, num_classes: int, seed: int = 1):
  """``{"x": [N, F] float32, "label": [N] int32}`` of random features and labels."""
  rng = np.random.default_rng(seed)
  return {
    "x": rng.normal(size=(num_rows, num_features)).astype(np.float32),
    "label": rng.integers(0, num_classes, num_rows).astype(np.int32),
  }


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example softmax cross entropy ``[B]``."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
  return -jnp.take_along_axis(log_probs, labels[:, None].astype(jnp.int32), axis=-1)[:, 0]
