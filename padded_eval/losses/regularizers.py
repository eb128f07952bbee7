"""Weight regularizers: losses of the ``parameters`` keyword (any pytree).

``L1(l)`` is ``l * sum(|p|)`` and ``L2(l)`` is ``l * sum(p**2)``, summed over every leaf.

How a regularizer is weighted when accumulated (:class:`padded_eval.Losses`): it does
not depend on the examples, so each batch contributes its value weighted by the
batch's number of real examples -- the rows of ``mask`` with any real element; without
a mask, the leading size of ``target`` (else ``preds``), else 1. An all-padding batch
adds nothing, and for fixed parameters the accumulated value is exactly the
regularizer, however the data was batched or padded. While parameters change (during
training) it is the mean over examples of the regularizer at the step that saw them.

Examples:
  >>> import jax.numpy as jnp
  >>> import padded_eval as pe
  >>> float(pe.regularizers.L2(0.5)(parameters={"w": jnp.array([1.0, 2.0])}))
  2.5
"""

from __future__ import annotations

import abc

import jax
import jax.numpy as jnp

from padded_eval.losses.base import Loss, parameter_leaves
from padded_eval.masking import broadcast_mask


def real_example_count(mask=None, target=None, preds=None) -> jax.Array:
  """The batch's number of real examples, float32 (see the module docstring)."""
  if mask is not None:
    mask = jnp.asarray(mask)
    if mask.ndim == 0:
      raise ValueError("mask must have a leading batch axis, shape [B, ...]; got a scalar")
    rows = broadcast_mask(mask, mask.shape, "mask").reshape(mask.shape[0], -1)
    return jnp.sum(jnp.any(rows, axis=1)).astype(jnp.float32)
  for values in (target, preds):
    if values is not None and jnp.ndim(values) >= 1:
      return jnp.float32(jnp.shape(values)[0])
  return jnp.float32(1.0)


class Regularizer(Loss):
  """A loss of the ``parameters`` keyword, weighted by the batch's real examples.

  Args:
    l: the regularization factor, a Python float (static configuration).
  """

  l: float = 0.01

  def _check_config(self):
    try:
      factor = float(self.l)
    except TypeError as e:
      raise ValueError(f"l must be a Python float (static); got {self.l!r}") from e
    object.__setattr__(self, "l", factor)

  @abc.abstractmethod
  def _penalty(self, leaf: jax.Array) -> jax.Array:
    """The elementwise penalty of one parameter array (``|p|`` or ``p**2``)."""

  def _batch_terms(self, *, parameters, mask=None, target=None, preds=None, **_):
    value = self.l * sum(jnp.sum(self._penalty(p)) for p in parameter_leaves(parameters))
    count = real_example_count(mask, target, preds)
    # where, not a product: an all-padding batch adds exactly 0 even if value is inf.
    return jnp.where(count > 0, value * count, 0.0), count


class L1(Regularizer):
  """``l * sum(|p|)`` over every leaf of ``parameters``."""

  def _penalty(self, leaf):
    return jnp.abs(leaf)


class L2(Regularizer):
  """``l * sum(p**2)`` over every leaf of ``parameters``."""

  def _penalty(self, leaf):
    return jnp.square(leaf)
