"""Text metrics: token-level perplexity."""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from padded_eval.exact.accumulate import ExactCount, upcast
from padded_eval.masking import broadcast_mask, element_weights
from padded_eval.metrics.averages import NAN_VALUE, WeightedMean, weighted_totals
from padded_eval.metrics.base import invalid_state, state
from padded_eval.metrics.classification._formatting import (
  PROBABILITIES_AS_LOGITS,
  TARGET_OUT_OF_RANGE,
  looks_like_probabilities,
)
from padded_eval.metrics.classification._inputs import check_ignore_index


def token_cross_entropy(logits: jax.Array, target: jax.Array) -> jax.Array:
  """``-log softmax(logits)[target]`` per token, computed stably in float32.

  Args:
    logits: ``[..., V]`` float (bf16/f16 are upcast to float32).
    target: ``[...]`` int class ids in ``[0, V)``.

  Returns:
    ``[...]`` float32 cross entropy; NaN for a target outside ``[0, V)``.
  """
  logits = upcast(logits)
  # Shift by the row's max first: logits - top is exact for logits of one magnitude, so a
  # common offset (1e4, 1e6) cancels before anything is rounded. logsumexp(logits) - picked
  # would round both terms at the offset's magnitude and lose the difference.
  top = jnp.max(logits, axis=-1, keepdims=True)
  shifted = logits - jax.lax.stop_gradient(jnp.where(jnp.isfinite(top), top, 0.0))
  log_normalizer = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
  picked = jnp.take_along_axis(shifted, target[..., None], axis=-1, mode="fill", fill_value=jnp.nan)
  return log_normalizer - picked[..., 0]


class Perplexity(WeightedMean):
  """Token perplexity: ``exp`` of the token-weighted mean cross entropy over real tokens.

  Every real token counts once, whatever its sequence or batch, so the result over
  padded batches equals one pass over the corpus (not a mean of per-batch values).

  Args:
    ignore_index: a ``target`` id (e.g. a padding token) whose tokens are not counted.

  Update keywords: ``preds`` ``[B, T, V]`` logits (any float dtype; upcast to float32);
  ``target`` ``[B, T]`` int token ids; ``mask`` bool ``[B]`` or ``[B, T]``; ``weights``
  the same shape rule. ``compute()`` is NaN when no real token was seen.

  A real token of nonzero weight whose target is outside ``[0, V)`` (and is not
  ``ignore_index``: -100 without ``ignore_index=-100`` is one) is not averaged but counted as
  invalid, kind ``"target out of range"`` (:meth:`invalid_counts`, :meth:`invalid_report`). A
  real token of nonzero weight whose ``preds`` row looks like probabilities (all in ``[0, 1]``,
  summing to 1: softmax outputs instead of logits, which give a wrong perplexity) is averaged
  as given and counted, kind ``"preds look like probabilities, not logits"``, so `masked_eval`
  reports it. A real token of nonzero weight whose cross entropy is NaN (a NaN logit, or +inf
  logits) is counted, kind ``"nan value"``, and makes the perplexity NaN. A weight-0 token is
  not seen: counted under no kind.

  Examples:
    >>> import jax.numpy as jnp
    >>> m = Perplexity().update(preds=jnp.zeros((1, 2, 4)), target=jnp.array([[0, 3]]))
    >>> round(float(m.compute()), 4)
    4.0
  """

  higher_is_better: ClassVar[bool | None] = False

  ignore_index: int | None = None
  invalid: ExactCount = state(invalid_state)

  invalid_kinds: ClassVar[tuple[str, ...]] = (
    TARGET_OUT_OF_RANGE,
    PROBABILITIES_AS_LOGITS,
    NAN_VALUE,
  )

  def _check_config(self):
    check_ignore_index(self.ignore_index)

  def number_inputs(self) -> tuple[str, ...]:
    return ()  # target holds token ids

  def _values(self, *, preds, target, **_):
    logits, target = jnp.asarray(preds), jnp.asarray(target)
    if not jnp.issubdtype(target.dtype, jnp.integer):
      raise ValueError(f"target must hold int token ids; got dtype {target.dtype}")
    if not jnp.issubdtype(logits.dtype, jnp.floating):
      raise ValueError(f"preds must be float logits; got dtype {logits.dtype}")
    if logits.ndim != target.ndim + 1 or logits.shape[:-1] != target.shape:
      raise ValueError(
        f"preds has shape {logits.shape} and target {target.shape}; expected "
        "preds [B, T, V] logits for target [B, T] (target's shape + [V])"
      )
    if logits.shape[-1] == 0:
      raise ValueError(
        f"preds has shape {logits.shape}: logits over V = 0 classes; expected at least one class "
        "(the last axis of preds [B, T, V])"
      )
    return token_cross_entropy(logits, target), "target"

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    cross_entropy, ref = self._values(preds=preds, target=target)
    target = jnp.asarray(target)
    real = broadcast_mask(mask, target.shape, ref)
    if self.ignore_index is not None:
      real = real & (target != self.ignore_index)
    in_vocabulary = (target >= 0) & (target < jnp.shape(preds)[-1])
    # a weight-0 token is not seen: counted under no kind
    weighed = real & (element_weights(mask, weights, target.shape, ref)[1] != 0)
    seen = weighed & in_vocabulary
    bad = self.invalid_flags(
      **{
        TARGET_OUT_OF_RANGE: weighed & ~in_vocabulary,
        PROBABILITIES_AS_LOGITS: seen & looks_like_probabilities(preds),
        NAN_VALUE: seen & jnp.isnan(cross_entropy),
      }
    )
    totals = weighted_totals(
      cross_entropy, real & in_vocabulary, weights, ref, invalid=bad, nonnegative=True
    )
    return totals.then(
      lambda t: {"total": t[0], "weight": t[1], "invalid": ExactCount.of(jnp.stack(t[2]))}
    )

  def compute(self) -> jax.Array:
    """``exp(sum(w * ce) / sum(w))`` as a float32 scalar; NaN if no real token."""
    return jnp.exp(super().compute())
