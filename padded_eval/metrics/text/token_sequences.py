"""Token sequences for the text metrics: checked ids, padding removed, bad ids counted.

Every text metric (``ngrams.py``: BLEU, RougeN; ``edit_distance.py``: RougeL,
WordErrorRate, ExactMatch) reads its inputs here, so the same ids mean the same sentence
everywhere:

* ``preds``: ``[B, T]`` int token ids, one hypothesis per row;
* ``target``: ``[B, S]`` (one reference per row) or ``[B, R, S]`` (``R`` references);
* ``mask``: optional bool ``[B]``, True for a real row (a padded row contributes nothing,
  whatever its ids).
* ``weights`` are refused (``ValueError``): these metrics count ids and rows, and
  ``Bootstrap`` then resamples rows through the mask.

``pad_id`` marks padding anywhere in a row: a sentence is its ids other than ``pad_id``,
in order (what a detokenizer that skips padding prints). A reference that is all padding
is absent, as a ``None`` reference is to sacrebleu (an empty string ``""`` is not: sacrebleu
keeps it, a reference of length 0 that the closest-length rule may pick); a row whose
references are all padding (every row, for a ``[B, 0, S]`` target) has one empty reference.
Ids that are negative, or ``>= vocab_size`` when a vocabulary size is given, are counted as
invalid (``"token id out of range"``) and still compared as ids.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from padded_eval import validation
from padded_eval.caches import registry
from padded_eval.exact.accumulate import ExactCount, ExactSum
from padded_eval.masking import broadcast_mask, leading_ones
from padded_eval.metrics.base import Metric, empty_count, empty_sum, invalid_state, state

BAD_ID = "token id out of range"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Sequences:
  """Sentences with their padding removed.

  Attributes:
    tokens: int32 ``[..., L]``: each sentence's ids first, in order, then ``pad_id``.
    lengths: int32 ``[...]``: the number of ids of each sentence.
  """

  tokens: jax.Array
  lengths: jax.Array

  def valid(self, order: int = 1) -> jax.Array:
    """bool ``[..., L]``: True where an n-gram of ``order`` ids starts inside the sentence."""
    positions = jnp.arange(self.tokens.shape[-1], dtype=jnp.int32)
    return leading_ones(positions + order, self.lengths.ndim) <= self.lengths[..., None]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TokenBatch:
  """One batch of hypotheses and references, padding removed (see the module docstring).

  Attributes:
    hyps: ``[B, T]`` hypotheses (padded rows are empty).
    refs: ``[B, R, S]`` references (``R = 1`` for a ``[B, S]`` target; padded rows empty).
    present: bool ``[B, R]``: the references a row has (non-empty ones; the first one
      when all are empty).
    real: bool ``[B]``: the rows the mask keeps.
    bad_ids: int32 ``[B]``: ids out of range in each real row (hypothesis and references).
  """

  hyps: Sequences
  refs: Sequences
  present: jax.Array
  real: jax.Array
  bad_ids: jax.Array

  def no_reference(self) -> jax.Array:
    """bool ``[B]``: real rows whose references are all empty."""
    return self.real & (jnp.max(self.refs.lengths, axis=-1) == 0)


def compact(tokens: jax.Array, pad_id: int) -> Sequences:
  """``tokens [..., L]`` with every ``pad_id`` moved to the end, the other ids kept in order."""
  keep = tokens != pad_id
  order = jnp.argsort(jnp.logical_not(keep).astype(jnp.int8), axis=-1, stable=True)
  return Sequences(
    jnp.take_along_axis(tokens, order, axis=-1), jnp.sum(keep, axis=-1, dtype=jnp.int32)
  )


def _int_ids(argname: str, value, owner: str) -> jax.Array:
  value = jnp.asarray(value)
  if not jnp.issubdtype(value.dtype, jnp.integer):
    raise ValueError(
      f"{owner}: {argname} must hold int token ids; got dtype {value.dtype}. Pass decoded "
      "ids (e.g. jnp.argmax(logits, -1)), not logits or strings"
    )
  return value.astype(jnp.int32)


def _row_mask(mask, rows: int, owner: str) -> jax.Array:
  if mask is None:
    return jnp.ones((rows,), bool)
  shape = tuple(jnp.shape(mask))
  if shape != (rows,):
    raise ValueError(
      f"{owner}: mask has shape {shape}; expected ({rows},), one bool per row (sentence) of "
      "preds. Padding inside a sentence is marked by pad_id, not by the mask"
    )
  return broadcast_mask(mask, (rows,), "preds")


class TokenMetric(Metric):
  """Base of the text metrics: input checks, ``pad_id`` / ``vocab_size`` and invalid ids.

  Subclasses declare the configuration fields ``pad_id: int`` and ``vocab_size: int |
  None`` (keyword-only) and read a batch with :meth:`token_batch`.
  """

  invalid_kinds: ClassVar[tuple[str, ...]] = (BAD_ID,)
  #: Whether ``target`` may hold several references per row (``[B, R, S]``).
  several_references: ClassVar[bool] = True

  def _token_config(self) -> tuple[int, int | None]:
    """``(pad_id, vocab_size)``: the configuration fields each subclass declares."""
    return getattr(self, "pad_id"), getattr(self, "vocab_size")  # noqa: B009

  def _check_config(self):
    pad_id, vocab_size = self._token_config()
    int32 = jnp.iinfo(jnp.int32)
    if not validation.is_int(pad_id) or not int32.min <= pad_id <= int32.max:
      raise ValueError(
        f"pad_id must be an int token id in int32's range [{int32.min}, {int32.max}] (ids are "
        f"int32); got {pad_id!r}"
      )
    validation.check_positive_int("vocab_size", vocab_size, allow_none=True)

  def token_batch(self, preds, target, mask, weights=None) -> TokenBatch:
    """The batch's sentences, padding removed (see the module docstring).

    Raises:
      ValueError: ``weights`` given: the text metrics count ids and rows (a bootstrap
        resamples them through the mask instead).
      ValueError: ``preds`` is not ``[B, T]`` ints, ``target`` not ``[B, S]`` (or
        ``[B, R, S]`` where several references are allowed) ints with the same ``B``, or
        ``mask`` not bool ``[B]``.
    """
    owner = f"{type(self).__name__}.update"
    pad_id, vocab_size = self._token_config()
    if weights is not None:
      raise ValueError(
        f"{owner}: {type(self).__name__} counts ids and rows and does not take sample weights; "
        "got weights. Drop the keyword, or mask rows out instead"
      )
    preds, target = _int_ids("preds", preds, owner), _int_ids("target", target, owner)
    shapes = "[B, S] or [B, R, S]" if self.several_references else "[B, S]"
    if preds.ndim != 2:
      raise ValueError(f"{owner}: preds has shape {preds.shape}; expected [B, T] token ids")
    if target.ndim not in ((2, 3) if self.several_references else (2,)) or (
      target.shape[0] != preds.shape[0]
    ):
      raise ValueError(
        f"{owner}: target has shape {target.shape} for preds {preds.shape}; expected "
        f"{shapes} token ids with B = {preds.shape[0]}"
        + ("" if self.several_references else " (one reference per row)")
      )
    if target.ndim == 2:
      target = target[:, None, :]
    if target.shape[1] == 0:  # no reference: as all padding (one empty reference per row)
      target = jnp.full((target.shape[0], 1, target.shape[2]), pad_id, jnp.int32)
    real = _row_mask(mask, preds.shape[0], owner)
    return sentences(preds, target, real, pad_id=pad_id, vocab_size=vocab_size)


@registry.jit(static_argnames=("pad_id", "vocab_size"))  # one dispatch eagerly
def sentences(
  preds: jax.Array, target: jax.Array, real: jax.Array, *, pad_id: int, vocab_size: int | None
) -> TokenBatch:
  """The :class:`TokenBatch` of int32 ``preds [B, T]``, ``target [B, R, S]``, ``real [B]``."""
  preds = jnp.where(real[:, None], preds, pad_id)
  target = jnp.where(real[:, None, None], target, pad_id)
  bad_ids = _bad(preds, pad_id, vocab_size).sum(-1, dtype=jnp.int32)
  bad_ids += _bad(target, pad_id, vocab_size).sum((-2, -1), dtype=jnp.int32)
  refs = compact(target, pad_id)
  present = refs.lengths > 0
  none = jnp.logical_not(jnp.any(present, axis=-1))
  present = present.at[:, 0].set(present[:, 0] | none)
  return TokenBatch(compact(preds, pad_id), refs, present, real, bad_ids)


def _bad(tokens: jax.Array, pad_id: int, vocab_size: int | None) -> jax.Array:
  bad = tokens < 0
  if vocab_size is not None and vocab_size <= jnp.iinfo(jnp.int32).max:  # else no id reaches it
    bad = bad | (tokens >= vocab_size)
  return bad & (tokens != pad_id)


@registry.jit  # one dispatch when updated eagerly
def row_sums(columns: list[jax.Array], real: jax.Array) -> jax.Array:
  """int32 ``[K]``: the totals over the real rows of ``K`` int ``[B]`` columns, from one
  reduction (under a sharded jit one all-reduce per step, whatever ``K``; see
  ``base.batch_totals``). Wrap slices in :class:`~padded_eval.exact.accumulate.ExactCount`."""
  stacked = jnp.where(real[:, None], jnp.stack(columns, axis=-1), 0)
  return jnp.sum(stacked, axis=0, dtype=jnp.int32)


def f_measure(overlap: jax.Array, hyp_count: jax.Array, ref_count: jax.Array) -> jax.Array:
  """float32 ``2 P R / (P + R)`` with ``P = overlap / hyp_count``, ``R = overlap / ref_count``,
  formed as ``2 overlap / (hyp_count + ref_count)`` (one rounding); 0 without overlap
  (rouge-score's convention, empty sentences included)."""
  overlap = overlap.astype(jnp.float32)
  denominator = jnp.maximum(hyp_count + ref_count, 1).astype(jnp.float32)
  return jnp.where(overlap > 0, 2.0 * overlap / denominator, 0.0)


class MeanRowScore(TokenMetric):
  """Base of the text metrics that average a per-row score (``[0, 1]``) over real rows.

  Subclasses define ``_row_scores(batch: TokenBatch) -> float32 [B]``.
  """

  score: ExactSum = state(empty_sum)  # sum of the real rows' scores
  invalid: ExactCount = state(invalid_state)
  example_rows: ExactCount = state(empty_count)

  higher_is_better: ClassVar[bool | None] = True

  @abc.abstractmethod
  def _row_scores(self, batch: TokenBatch) -> jax.Array:
    """float32 ``[B]``: each row's score (any value on padded rows)."""

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    batch = self.token_batch(preds, target, mask, weights)
    scores = self._row_scores(batch)
    bad, rows = row_sums([batch.bad_ids, jnp.ones_like(batch.bad_ids)], batch.real)
    return {
      "score": ExactSum.of_sum(scores, where=batch.real),
      "invalid": ExactCount.of(bad[None]),
      "example_rows": ExactCount.of(rows),
    }

  def compute(self) -> jax.Array:
    """The mean score over real rows (float32); NaN if no real row was seen."""
    return self.score.total() / self.example_rows.total()
