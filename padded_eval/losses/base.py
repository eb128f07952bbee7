"""Masked losses: scalar means over real elements, and their batch totals.

A :class:`Loss` is a frozen, hashable dataclass (configuration only, no state). Called
as ``loss(**kw)`` it returns the scalar mean of its per-element loss over the real
elements of the batch (``mask``, optional ``weights``), ready for ``jax.grad``. Inside
:class:`padded_eval.Losses` it contributes ``batch_terms(**kw) = (sum of the weighted
per-element loss, sum of the weights)``, so accumulating over padded batches gives the
loss of one pass over the whole dataset.

Masked-out rows never influence a value or a gradient: ``preds`` and ``target`` are
set to 0 there with ``where`` before any arithmetic, so NaN padding is harmless.

Examples:
  >>> import jax.numpy as jnp
  >>> import padded_eval as pe
  >>> xent = pe.losses.Crossentropy()
  >>> logits = jnp.array([[0.0, 0.0], [jnp.nan, 1.0]])
  >>> round(float(xent(preds=logits, target=jnp.array([1, 7]),
  ...                  mask=jnp.array([True, False]))), 4)
  0.6931
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from padded_eval.exact.accumulate import upcast
from padded_eval.masking import broadcast_mask, element_weights, masked
from padded_eval.routing import KeywordReader, dataclass_transform

EPSILON = 1e-7  # probabilities are clipped to [EPSILON, 1 - EPSILON] (Keras)


@dataclass_transform(frozen_default=True)
@dataclasses.dataclass(frozen=True)
class Loss(KeywordReader, abc.ABC):
  """Base of every loss: hashable configuration, ``loss(**kw)`` -> scalar mean.

  Subclasses implement ``_batch_terms(**kw) -> (total, weight)`` (float32 scalars; the
  weighted per-element loss summed over real elements, and the summed weights) and
  must accept and ignore unknown keywords. Its keyword-only parameters without a
  default are the keywords the loss needs: a missing one raises ``ValueError``.
  :class:`ElementwiseLoss` does this for losses of ``preds`` and ``target``.

  ``name``, ``arg_routes``, :meth:`map_arg`, :meth:`index_into` and the configuration
  hook ``_check_config`` come from :class:`padded_eval.routing.KeywordReader`, shared
  with metrics.

  Attributes:
    name: the key in logs; the lowercase class name unless given.
    arg_routes: keyword routing set by :meth:`map_arg` / :meth:`index_into`.
  """

  input_readers: ClassVar[tuple[str, ...]] = ("_batch_terms",)

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    dataclasses.dataclass(frozen=True)(cls)

  def batch_terms(self, **kwargs) -> tuple[jax.Array, jax.Array]:
    """``(total, weight)`` of one batch: float32 scalars, ``total / weight`` is the mean.

    Raises:
      ValueError: a keyword the loss needs is missing (after routing), or an input does
        not fit (shapes, mask).
    """
    kwargs = self.routed(kwargs)
    self.check_inputs_present(kwargs, type(self).__name__)
    return self._batch_terms(**kwargs)

  @abc.abstractmethod
  def _batch_terms(self, *args: Any, **kwargs: Any) -> tuple[jax.Array, jax.Array]:
    """``(total, weight)`` of one batch, after keyword routing."""

  def __call__(self, **kwargs) -> jax.Array:
    """The scalar mean over the batch's real elements (0 if there is none).

    An all-padding batch gives 0 and a zero gradient (not NaN), so it cannot poison
    a training step.
    """
    total, weight = self.batch_terms(**kwargs)
    return safe_mean(total, weight)


def safe_mean(total: jax.Array, weight: jax.Array) -> jax.Array:
  """``total / weight``, and 0 (with a finite gradient) where ``weight == 0``."""
  return total / jnp.where(weight > 0, weight, 1.0)


def _zero_masked(x: jax.Array, mask) -> jax.Array:
  """``x`` with the masked-out rows (``mask`` a prefix of its shape) set to 0."""
  if mask is None:
    return x
  return masked(x, broadcast_mask(mask, x.shape, "preds"))


class ElementwiseLoss(Loss):
  """A loss given per element by ``_element_losses(preds, target)``, averaged over real
  elements with the mask rule (``mask``/``weights`` a prefix of the element shape)."""

  def _check_shapes(self, preds: jax.Array, target: jax.Array) -> None:
    if preds.shape != target.shape:
      raise ValueError(
        f"{type(self).__name__}: preds has shape {preds.shape} but target "
        f"has shape {target.shape}; expected equal shapes"
      )

  @abc.abstractmethod
  def _element_losses(self, preds: jax.Array, target: jax.Array) -> jax.Array:
    """The unreduced loss; padded rows already hold 0 in both inputs."""

  def _batch_terms(self, *, preds, target, mask=None, weights=None, **_):
    preds, target = jnp.asarray(preds), jnp.asarray(target)
    self._check_shapes(preds, target)
    preds, target = _zero_masked(upcast(preds), mask), _zero_masked(target, mask)
    values = self._element_losses(preds, target)
    real, w = element_weights(mask, weights, values.shape, "preds")
    total = jnp.sum(masked(w * values, real))
    return total, jnp.sum(w)


class MeanSquaredError(ElementwiseLoss):
  """``mean((preds - target)**2)`` over real elements. ``preds``, ``target``: same shape."""

  def _element_losses(self, preds, target):
    return jnp.square(preds - upcast(target))


class MeanAbsoluteError(ElementwiseLoss):
  """``mean(|preds - target|)`` over real elements. ``preds``, ``target``: same shape."""

  def _element_losses(self, preds, target):
    return jnp.abs(preds - upcast(target))


class Crossentropy(ElementwiseLoss):
  """Cross entropy, categorical (softmax) or binary (sigmoid), averaged over real elements.

  Categorical (``binary=False``): ``preds`` ``[..., C]`` logits (or probabilities with
  ``from_logits=False``); ``target`` either ``[...]`` integer class ids or ``[..., C]``
  float class probabilities (one-hot or soft). One loss per ``[...]`` element.
  Binary (``binary=True``): ``preds`` ``[...]`` logits (or probabilities) of the positive
  class, ``target`` ``[...]`` in ``[0, 1]``; one loss per element (Keras BCE).

  Args:
    from_logits: ``preds`` are logits (default) or probabilities (clipped to
      ``[1e-7, 1 - 1e-7]`` before the log, like Keras).
    label_smoothing: in ``[0, 1)``; targets become ``t * (1 - s) + s / C``
      (``s / 2`` for binary).
    binary: sigmoid / binary cross entropy instead of softmax.

  Raises:
    ValueError: for a bad configuration, or shapes that fit neither target form.
  """

  from_logits: bool = True
  label_smoothing: float = 0.0
  binary: bool = False

  def _check_config(self):
    if not 0.0 <= float(self.label_smoothing) < 1.0:
      raise ValueError(f"label_smoothing must be in [0, 1); got {self.label_smoothing!r}")

  def _check_shapes(self, preds, target):
    if self.binary or preds.shape == target.shape:
      super()._check_shapes(preds, target)
      return
    if preds.ndim == 0 or target.shape != preds.shape[:-1]:
      raise ValueError(
        f"Crossentropy: preds has shape {preds.shape} and target {target.shape}; "
        "expected preds [..., C] with target [...] class ids or [..., C] "
        "probabilities (or binary=True for per-element sigmoid)"
      )
    if not jnp.issubdtype(target.dtype, jnp.integer):
      raise ValueError(
        f"Crossentropy: target of shape {target.shape} (class ids) must be "
        f"integers; got dtype {target.dtype}"
      )

  def _element_losses(self, preds, target):
    smoothing = float(self.label_smoothing)
    if self.binary:
      target = upcast(target)
      if smoothing:
        target = target * (1.0 - smoothing) + 0.5 * smoothing
      if self.from_logits:  # stable log(1 + exp(-|x|)) form
        return jnp.maximum(preds, 0.0) - preds * target + jnp.log1p(jnp.exp(-jnp.abs(preds)))
      probs = jnp.clip(preds, EPSILON, 1.0 - EPSILON)
      return -(target * jnp.log(probs) + (1.0 - target) * jnp.log1p(-probs))
    if self.from_logits:
      log_probs = jax.nn.log_softmax(preds, axis=-1)
    else:
      log_probs = jnp.log(jnp.clip(preds, EPSILON, 1.0 - EPSILON))
    num_classes = preds.shape[-1]
    if target.shape == preds.shape:  # dense class probabilities
      target = upcast(target)
      if smoothing:
        target = target * (1.0 - smoothing) + smoothing / num_classes
      return -jnp.sum(target * log_probs, axis=-1)
    picked = jnp.take_along_axis(log_probs, target[..., None].astype(jnp.int32), axis=-1)[..., 0]
    if not smoothing:
      return -picked
    return -((1.0 - smoothing) * picked + smoothing / num_classes * jnp.sum(log_probs, axis=-1))


def parameter_leaves(parameters: Any) -> list[jax.Array]:
  """The float32 leaves of a parameter pytree (ValueError if it has none)."""
  leaves = [upcast(jnp.asarray(p)) for p in jax.tree.leaves(parameters)]
  if not leaves:
    raise ValueError("parameters has no array leaves; pass the model parameters pytree")
  return leaves
