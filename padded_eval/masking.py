"""The one mask rule: which elements are real, and their weights.

A leaf module (it imports nothing from the package): metrics and losses both select
their real elements here, so ``mask`` and ``weights`` mean the same everywhere.

The rule (see docs/architecture.md, "The mask rule"):

* ``mask`` is a bool array whose shape is a *prefix* of the values' shape: ``[B]``
  marks examples, ``[B, T]`` tokens, and so on; ``None`` means every element is real.
  It is broadcast over the trailing axes (:func:`broadcast_prefix`).
* ``weights`` (optional float sample weights) follows the same prefix rule.
* Masked-out elements are selected away with ``jnp.where`` (:func:`masked`) before any
  arithmetic, never multiplied by 0, so NaN or inf in padded rows never leaks.

Examples:
  >>> import jax.numpy as jnp
  >>> from padded_eval import masking
  >>> real, w = masking.element_weights(jnp.array([True, False]), None, (2, 3))
  >>> real.shape, float(w.sum())
  ((2, 3), 3.0)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def leading_ones(x, ndim: int) -> jax.Array:
  """``x`` with ``ndim`` leading axes of size 1: an explicit broadcast against ``[..., *x.shape]``
  (``jnp.arange(C)`` against ``labels[..., None]``), which JAX allows under
  ``jax_numpy_rank_promotion="raise"`` too."""
  x = jnp.asarray(x)
  return jnp.reshape(x, (1,) * ndim + x.shape)


def prefix_shapes(shape: tuple[int, ...]) -> str:
  """The shapes that fit ``shape`` under the prefix rule, for messages: ``"(4,) or (4, 3)"``."""
  return " or ".join(str(tuple(shape[:k])) for k in range(1, len(shape) + 1)) or "()"


def broadcast_prefix(x: jax.Array, shape, argname: str, ref: str) -> jax.Array:
  """Broadcasts ``x``, whose shape is a prefix of ``shape``, to ``shape``.

  Args:
    x: an array of shape ``shape[:k]`` for some ``k <= len(shape)``.
    shape: the target shape.
    argname: the name of ``x`` (``"mask"``, ``"weights"``), for messages.
    ref: the name of the values of shape ``shape`` (``"preds"``), for messages.

  Returns:
    ``x`` with trailing axes added and broadcast: shape ``shape``.

  Raises:
    ValueError: if ``x``'s shape is not a prefix of ``shape``.
  """
  shape = tuple(shape)
  if not shape and x.ndim:  # one value for the whole batch, with a per-row mask or weights
    raise ValueError(
      f"{ref} is a scalar (one value for the whole batch), but {argname} has shape "
      f"{tuple(x.shape)}: pass one value per row ({ref} of shape {tuple(x.shape)}, e.g. the "
      "per-example loss before its mean), so that the padded rows can be left out"
    )
  if x.ndim > len(shape) or tuple(x.shape) != shape[: x.ndim]:
    raise ValueError(
      f"{argname} has shape {tuple(x.shape)}, which does not fit {ref} of shape "
      f"{shape}; expected {prefix_shapes(shape)} (a prefix of {ref}'s shape)"
    )
  return jnp.broadcast_to(x.reshape(x.shape + (1,) * (len(shape) - x.ndim)), shape)


def broadcast_mask(mask, shape, ref: str = "preds") -> jax.Array:
  """The boolean mask broadcast to ``shape`` (all True if ``mask`` is None).

  Args:
    mask: ``None`` or a bool array whose shape is a prefix of ``shape``
      (``[B]`` for examples, ``[B, T]`` for tokens, ...).
    shape: the shape of the values the mask selects.
    ref: the name of those values, for error messages.

  Returns:
    A bool array of shape ``shape``, True for real elements.

  Raises:
    ValueError: if the mask is not bool or its shape is not a prefix of ``shape``.
  """
  shape = tuple(shape)
  if mask is None:
    return jnp.ones(shape, bool)
  mask = jnp.asarray(mask)
  if mask.dtype != jnp.bool_:
    raise ValueError(
      f"mask must be a bool array; got dtype {mask.dtype}. "
      "Pass mask.astype(bool) (True marks real elements)."
    )
  return broadcast_prefix(mask, shape, "mask", ref)


def element_weights(mask, weights, shape, ref: str = "preds") -> tuple[jax.Array, jax.Array]:
  """``(real, w)``: the broadcast bool mask and float32 weights, 0 where not real.

  Args:
    mask: ``None`` or a bool array, a prefix of ``shape`` (see :func:`broadcast_mask`).
    weights: ``None`` (every real element weighs 1) or float sample weights whose shape
      is a prefix of ``shape``; any float or int dtype, computed in float32.
    shape: the shape of the values.
    ref: the name of those values, for error messages.

  Returns:
    ``real``: bool ``shape``; ``w``: float32 ``shape``, the weights of real elements and
    0 elsewhere (replaced with ``where``, so NaN weights of padded rows are harmless).

  Raises:
    ValueError: if ``mask`` or ``weights`` does not fit ``shape``.
  """
  real = broadcast_mask(mask, shape, ref)
  if weights is None:
    return real, real.astype(jnp.float32)
  weights = jnp.asarray(weights).astype(jnp.float32)
  weights = broadcast_prefix(weights, tuple(shape), "weights", ref)
  return real, jnp.where(real, weights, 0.0)


def masked(values: jax.Array, real: jax.Array, fill=0) -> jax.Array:
  """``values`` where ``real``, else ``fill``; NaN or inf in masked-out places never leaks.

  Args:
    values: any array.
    real: bool, broadcastable to ``values``.
    fill: the value of masked-out places, cast to ``values``' dtype.

  Returns:
    An array of ``values``' shape and dtype.
  """
  return jnp.where(real, values, jnp.asarray(fill, values.dtype))
