"""Alignment text metrics on token ids: ROUGE-L, word error rate, exact match.

The dynamic programmes run on the devices as one ``lax.scan`` over the hypothesis ids,
each step updating a whole row of the table at once: the row recurrence
``new[j] = max(a[j], new[j - 1])`` (LCS) is a running maximum of ``a``, and
``new[j] = min(a[j], new[j - 1] + 1)`` (Levenshtein) is ``j + running min(a[k] - k)``,
so a step costs ``O(R S)`` vector work instead of ``S`` sequential ones. Inputs, padding
and invalid ids: see :mod:`padded_eval.metrics.text.token_sequences`.
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from padded_eval.caches import registry
from padded_eval.exact.accumulate import ExactCount
from padded_eval.metrics.base import empty_count, invalid_state, state
from padded_eval.metrics.classification._inputs import config_field
from padded_eval.metrics.text.token_sequences import (
  MeanRowScore,
  Sequences,
  TokenBatch,
  TokenMetric,
  f_measure,
  row_sums,
)


@registry.jit  # one dispatch when updated eagerly
def lcs_lengths(hyps: Sequences, refs: Sequences) -> jax.Array:
  """int32 ``[B, R]``: the longest common subsequence of each hypothesis and reference.

  Args:
    hyps: ``[B, T]`` hypotheses.
    refs: ``[B, R, S]`` references.
  """
  tokens, valid = refs.tokens, refs.valid()
  if tokens.shape[-1] == 0:
    return jnp.zeros(tokens.shape[:-1], jnp.int32)

  def step(previous, hyp):  # previous: [B, R, S], the table's row for the hypothesis so far
    token, real = hyp
    same = (tokens == token[:, None, None]) & valid & real[:, None, None]
    diagonal = jnp.pad(previous[..., :-1], [(0, 0), (0, 0), (1, 0)])
    return jax.lax.cummax(jnp.maximum(previous, diagonal + same), axis=2), None

  start = tokens * 0  # derived from the data: varying over a shard_map axis like the steps
  table, _ = jax.lax.scan(step, start, (hyps.tokens.T, hyps.valid().T))
  return table[..., -1]


@registry.jit  # one dispatch when updated eagerly
def edit_distances(hyps: Sequences, refs: Sequences) -> jax.Array:
  """int32 ``[B]``: the Levenshtein distance between each hypothesis and its reference.

  Args:
    hyps: ``[B, T]`` hypotheses.
    refs: ``[B, S]`` references (one per row).
  """
  tokens = refs.tokens
  offsets = jnp.arange(tokens.shape[-1] + 1, dtype=jnp.int32)

  def step(previous, hyp):  # previous: [B, S + 1], distances to every reference prefix
    token, real = hyp
    cost = (tokens != token[:, None]).astype(jnp.int32)
    a = jnp.concatenate(
      [previous[:, :1] + 1, jnp.minimum(previous[:, 1:] + 1, previous[:, :-1] + cost)], axis=1
    )
    row = jax.lax.cummin(a - offsets[None], axis=1) + offsets[None]
    return jnp.where(real[:, None], row, previous), None

  # from the data: varying like the steps' rows
  start = offsets[None, :] + 0 * refs.lengths[:, None]
  table, _ = jax.lax.scan(step, start, (hyps.tokens.T, hyps.valid().T))
  return jnp.take_along_axis(table, refs.lengths[:, None], axis=1)[:, 0]


@registry.jit  # one dispatch when updated eagerly
def rouge_l_scores(batch: TokenBatch) -> jax.Array:
  """float32 ``[B]``: each row's best ROUGE-L F-measure over its references."""
  lcs = lcs_lengths(batch.hyps, batch.refs)
  scores = f_measure(lcs, batch.hyps.lengths[:, None], batch.refs.lengths)
  return jnp.max(jnp.where(batch.present, scores, 0.0), axis=-1)


class RougeL(MeanRowScore):
  """ROUGE-L: the mean over real rows of the longest-common-subsequence F-measure.

  Per row ``F = 2 lcs / (hyp length + ref length)``, 0 when nothing is shared
  (rouge-score's sentence-level ``rougeL``); with several references the best F of the
  row counts (rouge-score's ``score_multi``, torchmetrics' ``accumulate="best"``).

  Args:
    pad_id: the padding id, removed from every sentence.
    vocab_size: optional; ids ``>= vocab_size`` are counted as invalid (negative ids always).

  Update keywords: ``preds`` ``[B, T]`` int ids; ``target`` ``[B, S]`` or ``[B, R, S]``;
  ``mask`` bool ``[B]``. ``compute()`` is NaN when no real row was seen.

  Example:
    >>> import jax.numpy as jnp
    >>> m = RougeL().update(preds=jnp.array([[1, 3, 2, 0]]), target=jnp.array([[1, 2, 3, 4]]))
    >>> round(float(m.compute()), 4)  # lcs 2 of lengths 3 and 4: 2 * 2 / 7
    0.5714
  """

  pad_id: int = 0
  vocab_size: int | None = config_field(default=None)

  def _row_scores(self, batch: TokenBatch) -> jax.Array:
    return rouge_l_scores(batch)


class WordErrorRate(TokenMetric):
  """Word error rate: summed edit distances over summed reference lengths (corpus WER).

  ``(substitutions + deletions + insertions) / reference ids`` over all real rows, as
  jiwer's ``wer`` and torchmetrics' ``WordErrorRate`` compute it (not a mean of per-row
  rates). An empty reference adds its hypothesis' length to the errors and nothing to the
  reference length.

  Args:
    pad_id: the padding id, removed from every sentence.
    vocab_size: optional; ids ``>= vocab_size`` are counted as invalid (negative ids always).

  Update keywords: ``preds`` ``[B, T]`` int ids; ``target`` ``[B, S]`` (one reference per
  row); ``mask`` bool ``[B]``. ``compute()`` is NaN when no real row was seen.

  Example:
    >>> import jax.numpy as jnp
    >>> preds = jnp.array([[1, 2, 3, 0], [4, 5, 0, 0]])
    >>> target = jnp.array([[1, 9, 3, 0], [4, 5, 6, 0]])
    >>> float(WordErrorRate().update(preds=preds, target=target).compute())  # 2 edits / 6
    0.3333333432674408
  """

  pad_id: int = 0
  vocab_size: int | None = config_field(default=None)
  errors: ExactCount = state(empty_count)
  reference_tokens: ExactCount = state(empty_count)
  invalid: ExactCount = state(invalid_state)
  example_rows: ExactCount = state(empty_count)

  several_references: ClassVar[bool] = False
  higher_is_better: ClassVar[bool | None] = False

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    batch = self.token_batch(preds, target, mask, weights)
    refs = Sequences(batch.refs.tokens[:, 0], batch.refs.lengths[:, 0])
    distances = edit_distances(batch.hyps, refs)
    ones = jnp.ones_like(distances)
    sums = row_sums([distances, refs.lengths, batch.bad_ids, ones], batch.real)
    return {
      "errors": ExactCount.of(sums[0]),
      "reference_tokens": ExactCount.of(sums[1]),
      "invalid": ExactCount.of(sums[2:3]),
      "example_rows": ExactCount.of(sums[3]),
    }

  def compute(self) -> jax.Array:
    """Errors / reference ids (float32); NaN if no real row was seen."""
    rate = self.errors.total() / self.reference_tokens.total()
    return jnp.where(self.example_rows.total() > 0, rate, jnp.nan)


class ExactMatch(MeanRowScore):
  """The fraction of real rows whose hypothesis equals a reference, id for id.

  Padding is removed first, so ``[5, 6, 0]`` matches ``[5, 6]``. With several references a
  row matches if any reference it has matches; an empty hypothesis matches only a row
  whose references are all empty.

  Args:
    pad_id: the padding id, removed from every sentence.
    vocab_size: optional; ids ``>= vocab_size`` are counted as invalid (negative ids always).

  Update keywords: ``preds`` ``[B, T]`` int ids; ``target`` ``[B, S]`` or ``[B, R, S]``;
  ``mask`` bool ``[B]``. ``compute()`` is NaN when no real row was seen.

  Example:
    >>> import jax.numpy as jnp
    >>> preds = jnp.array([[5, 6, 0], [5, 7, 0]])
    >>> target = jnp.array([[5, 6, 0, 0], [5, 6, 7, 0]])
    >>> float(ExactMatch().update(preds=preds, target=target).compute())
    0.5
  """

  pad_id: int = 0
  vocab_size: int | None = config_field(default=None)

  def _row_scores(self, batch: TokenBatch) -> jax.Array:
    return exact_matches(batch, self.pad_id)


@registry.jit(static_argnames="pad_id")  # one dispatch when updated eagerly
def exact_matches(batch: TokenBatch, pad_id: int) -> jax.Array:
  """float32 ``[B]``: 1 where the hypothesis equals a reference the row has, else 0."""
  hyp, ref = batch.hyps.tokens, batch.refs.tokens
  width = max(hyp.shape[-1], ref.shape[-1])
  hyp = jnp.pad(hyp, [(0, 0), (0, width - hyp.shape[-1])], constant_values=pad_id)
  ref = jnp.pad(ref, [(0, 0), (0, 0), (0, width - ref.shape[-1])], constant_values=pad_id)
  same = jnp.all(hyp[:, None, :] == ref, axis=-1) & batch.present
  return jnp.any(same, axis=-1).astype(jnp.float32)
