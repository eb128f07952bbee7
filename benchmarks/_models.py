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

  def dense(x, layer):  # the bias's rank made explicit: implicit rank promotion may raise
    return x @ layer["w"] + layer["b"].reshape((1,) * (x.ndim - 1) + (-1,))

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


def cnn_params(channels: tuple[int, ...], num_classes: int, seed: int = 0) -> dict:
  """3x3 conv layers ``3 -> channels[0] -> ...`` (HWIO) and a dense head, host float32."""
  rng = np.random.default_rng(seed)
  convs, fan_in = [], 3
  for width in channels:
    scale = np.sqrt(2.0 / (9 * fan_in))
    convs.append(
      {
        "w": (rng.normal(size=(3, 3, fan_in, width)) * scale).astype(np.float32),
        "b": np.zeros(width, np.float32),
      }
    )
    fan_in = width
  return {"convs": convs, "head": mlp_params((fan_in, num_classes), seed + 1)}


def cnn_apply(params: dict, images: jax.Array) -> jax.Array:
  """``images [B, H, W, 3] -> logits``: ReLU convs, every second one of stride 2, mean pool."""
  x = images
  for i, layer in enumerate(params["convs"]):
    stride = 2 if i % 2 else 1
    x = jax.lax.conv_general_dilated(
      x, layer["w"], (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    x = jax.nn.relu(x + layer["b"].reshape(1, 1, 1, -1))
  return mlp_apply(params["head"], x.mean(axis=(1, 2)))


def transformer_params(
  vocab: int, width: int, layers: int, length: int, num_classes: int, seed: int = 0
) -> dict:
  """A pre-norm encoder (``layers`` blocks of attention and a 4x MLP), host float32."""
  rng = np.random.default_rng(seed)
  dense = lambda m, n: (rng.normal(size=(m, n)) / np.sqrt(m)).astype(np.float32)
  blocks = [
    {
      "qkv": dense(width, 3 * width),
      "out": dense(width, width),
      "up": dense(width, 4 * width),
      "down": dense(4 * width, width),
    }
    for _ in range(layers)
  ]
  return {
    "embed": (rng.normal(size=(vocab, width)) * 0.02).astype(np.float32),
    "position": (rng.normal(size=(length, width)) * 0.02).astype(np.float32),
    "blocks": blocks,
    "head": mlp_params((width, num_classes), seed + 1),
  }


def transformer_apply(params: dict, tokens: jax.Array, heads: int = 8) -> jax.Array:
  """``tokens [B, T] int32 -> logits``: embedding, the blocks, mean over positions, a dense head."""

  def norm(x):
    x = x - x.mean(-1, keepdims=True)
    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6)

  x = params["embed"][tokens] + params["position"][None]
  batch, length, width = x.shape
  for block in params["blocks"]:
    q, k, v = jnp.split(norm(x) @ block["qkv"], 3, axis=-1)
    split = lambda t: t.reshape(batch, length, heads, width // heads)
    scores = jnp.einsum("bqhd,bkhd->bhqk", split(q), split(k)) / np.sqrt(width // heads)
    attended = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), split(v))
    x = x + attended.reshape(batch, length, width) @ block["out"]
    x = x + jax.nn.gelu(norm(x) @ block["up"]) @ block["down"]
  return mlp_apply(params["head"], norm(x).mean(axis=1))


def causal_lm_params(
  vocab: int, dim: int, width: int, scales: dict[str, float], seed: int = 0
) -> dict[str, np.ndarray]:
  """Random weights of `causal_lm_apply`'s model, host float32, drawn in the order of ``scales``.

  Args:
    vocab: token ids.
    dim: the embedding width.
    width: how many positions the causal convolution sees.
    scales: the normal's standard deviation per weight: ``embed``, ``conv``, ``mean``, ``out``
      and, for output biases, ``bias``.
    seed: numpy seed.
  """
  rng = np.random.default_rng(seed)
  shapes = {
    "embed": (vocab, dim),
    "conv": (width, dim, dim),
    "mean": (dim, dim),
    "out": (dim, vocab),
    "bias": (vocab,),
  }
  return {k: rng.normal(0, scale, shapes[k]).astype(np.float32) for k, scale in scales.items()}


def causal_lm_apply(params: dict, tokens: jax.Array) -> jax.Array:
  """``int32 [B, T] -> float32 logits [B, T, V]``, causal: token embedding, a convolution over the
  last ``width`` positions plus the running mean of the embeddings, tanh, an output layer (and its
  bias where ``params`` has one)."""
  x = params["embed"][tokens]  # [B, T, D]
  h = jnp.zeros_like(x)
  for k in range(params["conv"].shape[0]):
    h = h + jnp.pad(x, ((0, 0), (k, 0), (0, 0)))[:, : x.shape[1]] @ params["conv"][k]
  counts = jnp.arange(1, x.shape[1] + 1, dtype=x.dtype)[None, :, None]  # [1, T, 1]
  logits = jnp.tanh(h + (jnp.cumsum(x, axis=1) / counts) @ params["mean"]) @ params["out"]
  return logits + params["bias"][None, None, :] if "bias" in params else logits
