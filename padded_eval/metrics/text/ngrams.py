"""N-gram text metrics on token ids: corpus BLEU and ROUGE-N.

Both count n-grams on the devices, exactly: an n-gram of the hypothesis is compared with
every n-gram of the hypothesis and of each reference (``[T, T]`` and ``[R, T, S]`` equality
tables per row, built order after order from the unigram tables), so no hashing and no
vocabulary-sized array is needed. Inputs, padding and invalid ids: see
:mod:`padded_eval.metrics.text.token_sequences`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import jax
import jax.numpy as jnp

from padded_eval import validation
from padded_eval.caches import registry
from padded_eval.exact.accumulate import ExactCount
from padded_eval.metrics.base import empty_count, invalid_state, state
from padded_eval.metrics.classification._inputs import config_field
from padded_eval.metrics.text.token_sequences import (
  BAD_ID,
  MeanRowScore,
  Sequences,
  TokenBatch,
  TokenMetric,
  f_measure,
  row_sums,
)

NO_REFERENCE = "row without a reference"


def ngram_counts(
  hyps: Sequences, refs: Sequences, max_order: int
) -> Iterator[tuple[int, jax.Array, jax.Array, jax.Array]]:
  """Per order ``n = 1 .. max_order``, each hypothesis n-gram's rank and reference counts.

  A distinct n-gram seen ``c`` times in the hypothesis has ranks ``0 .. c - 1`` there, so
  ``sum(in_hyp & (rank < k))`` over its positions is ``min(c, k)``: clipped counts need no
  count of the hypothesis' own n-grams.

  Args:
    hyps: ``[B, T]`` hypotheses.
    refs: ``[B, R, S]`` references.
    max_order: the largest n-gram order.

  Yields:
    ``(n, rank, in_hyp, ref_count)`` over the ``P = max(T - n + 1, 0)`` positions where an
    n-gram can start: int32 ``[B, P]``, how many times the n-gram starting there occurred
    earlier in the hypothesis; bool ``[B, P]``, True where one starts; int32 ``[B, R, P]``,
    its occurrences in each reference.
  """
  h, r = hyps.tokens, refs.tokens
  length = h.shape[-1]
  earlier = jnp.tril(jnp.ones((length, length), bool), -1)  # [i, j]: j < i
  same_h = (h[:, :, None] == h[:, None, :]) & earlier[None]  # [B, T, T]
  same_r = h[:, None, :, None] == r[:, :, None, :]  # [B, R, T, S]
  eq_h, eq_r = same_h, same_r  # order n: [B, T - n + 1, T - n + 1], [B, R, T - n + 1, S - n + 1]
  for n in range(1, max_order + 1):
    if (
      n > 1
    ):  # the n-gram at (i, j) is the (n - 1)-gram there and the ids at (i + n - 1, j + n - 1)
      eq_h = eq_h[:, :-1, :-1] & same_h[:, n - 1 :, n - 1 :]
      eq_r = eq_r[..., :-1, :-1] & same_r[..., n - 1 :, n - 1 :]
    starts = eq_h.shape[-1]
    in_hyp, in_ref = hyps.valid(n)[:, :starts], refs.valid(n)[..., : eq_r.shape[-1]]
    rank = jnp.sum(eq_h, axis=-1, dtype=jnp.int32)  # j < i: an n-gram inside the hypothesis
    ref_count = jnp.sum(eq_r & in_ref[:, :, None, :], axis=-1, dtype=jnp.int32)
    yield n, rank, in_hyp, ref_count


def ngram_totals(sequences: Sequences, n: int) -> jax.Array:
  """int32: the number of n-grams of each sentence, ``max(length - n + 1, 0)``."""
  return jnp.maximum(sequences.lengths - n + 1, 0)


def closest_reference_lengths(batch: TokenBatch) -> jax.Array:
  """int32 ``[B]``: the length of each row's reference closest to its hypothesis' length,
  the shorter on a tie (sacrebleu's rule), among the references the row has."""
  lengths, span = batch.refs.lengths, batch.refs.tokens.shape[-1] + 1
  distance = jnp.abs(lengths - batch.hyps.lengths[:, None])
  key = jnp.where(batch.present, distance * span + lengths, jnp.iinfo(jnp.int32).max)
  return jnp.min(key, axis=-1) % span


@registry.jit(static_argnames="max_order")  # one dispatch when updated eagerly
def bleu_rows(batch: TokenBatch, max_order: int) -> list[jax.Array]:
  """int32 ``[B]`` columns: the clipped matches of each order, the n-grams of each order,
  the hypothesis length and the closest reference length of each row."""
  matches, totals = [], []
  for n, rank, in_hyp, ref_count in ngram_counts(batch.hyps, batch.refs, max_order):
    clip = jnp.max(ref_count, axis=1)  # an absent reference has no n-gram
    matches.append(jnp.sum(in_hyp & (rank < clip), axis=-1, dtype=jnp.int32))
    totals.append(ngram_totals(batch.hyps, n))
  return matches + totals + [batch.hyps.lengths, closest_reference_lengths(batch)]


@registry.jit(static_argnames="n")  # one dispatch when updated eagerly
def rouge_n_scores(batch: TokenBatch, n: int) -> jax.Array:
  """float32 ``[B]``: each row's best ROUGE-N F-measure over its references."""
  *_, (_, rank, in_hyp, ref_count) = ngram_counts(batch.hyps, batch.refs, n)
  shared = jnp.sum(in_hyp[:, None, :] & (rank[:, None, :] < ref_count), -1, dtype=jnp.int32)
  scores = f_measure(shared, ngram_totals(batch.hyps, n)[:, None], ngram_totals(batch.refs, n))
  return jnp.max(jnp.where(batch.present, scores, 0.0), axis=-1)


class BLEU(TokenMetric):
  """Corpus BLEU on token ids, from exact clipped n-gram counts (psum-able).

  The statistics of sacrebleu's corpus BLEU, summed over real rows: per order ``n``, the
  hypothesis n-grams matched in a reference (each clipped to its largest count in any one
  reference of the row) and the hypothesis n-grams; the hypothesis lengths and each row's
  closest reference length (the shorter on a tie). ``compute()`` is
  ``BP * exp(mean_n log p_n)`` with ``p_n = matches_n / totals_n`` and the brevity penalty
  ``BP = exp(1 - ref / hyp)`` when ``hyp < ref``: sacrebleu's ``corpus_bleu(...,
  tokenize="none").score / 100`` on the ids written as words.

  Args:
    max_order: the largest n-gram order (default 4).
    smooth: add one to the matches and totals of every order above 1 (sacrebleu's
      ``smooth_method="add-k", smooth_value=1``; torchmetrics' ``BLEUScore(smooth=True)``
      when every order has a match). Without it a corpus with no match of some order
      scores 0 (sacrebleu's ``smooth_method="none"``).
    pad_id: the padding id, removed from every sentence.
    vocab_size: optional; ids ``>= vocab_size`` are counted as invalid (negative ids always).

  Update keywords: ``preds`` ``[B, T]`` int ids; ``target`` ``[B, S]`` or ``[B, R, S]``
  (``R`` references; an all-padding reference is absent); ``mask`` bool ``[B]``. Invalid
  kinds: ``"token id out of range"`` (ids, still compared as ids) and ``"row without a
  reference"`` (every reference all padding: the row counts with reference length 0).
  ``compute()`` is NaN when no real row was seen.

  Example:
    >>> import jax.numpy as jnp
    >>> preds = jnp.array([[5, 6, 7, 8, 0], [5, 6, 0, 0, 0]])
    >>> target = jnp.array([[5, 6, 7, 8, 9], [5, 6, 0, 0, 0]])
    >>> round(float(BLEU(max_order=2).update(preds=preds, target=target).compute()), 4)
    0.8465
  """

  max_order: int = 4
  smooth: bool = False
  pad_id: int = 0
  vocab_size: int | None = config_field(default=None)
  matches: ExactCount = state(lambda m: ExactCount.zeros((m.max_order,)))
  totals: ExactCount = state(lambda m: ExactCount.zeros((m.max_order,)))
  lengths: ExactCount = state(lambda m: ExactCount.zeros((2,)))  # hypothesis, reference
  invalid: ExactCount = state(invalid_state)
  example_rows: ExactCount = state(empty_count)

  invalid_kinds: ClassVar[tuple[str, ...]] = (BAD_ID, NO_REFERENCE)
  higher_is_better: ClassVar[bool | None] = True

  def _check_config(self):
    super()._check_config()
    validation.check_positive_int("max_order", self.max_order)
    validation.check_flag("smooth", self.smooth)

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    batch = self.token_batch(preds, target, mask, weights)
    flags = [batch.bad_ids, batch.no_reference().astype(jnp.int32), jnp.ones_like(batch.bad_ids)]
    sums = row_sums(bleu_rows(batch, self.max_order) + flags, batch.real)
    k = self.max_order
    return {
      "matches": ExactCount.of(sums[:k]),
      "totals": ExactCount.of(sums[k : 2 * k]),
      "lengths": ExactCount.of(sums[2 * k : 2 * k + 2]),
      "invalid": ExactCount.of(sums[2 * k + 2 : 2 * k + 4]),
      "example_rows": ExactCount.of(sums[-1]),
    }

  def precisions(self) -> jax.Array:
    """float32 ``[max_order]``: the n-gram precisions ``p_n`` (smoothed if ``smooth``)."""
    matches, totals = self.matches.total(), self.totals.total()
    if self.smooth:
      add = (jnp.arange(self.max_order) > 0).astype(jnp.float32)
      matches, totals = matches + add, totals + add
    return matches / totals

  def compute(self) -> jax.Array:
    """Corpus BLEU in ``[0, 1]`` (float32); NaN if no real row was seen."""
    precisions = self.precisions()
    log_p = jnp.where(precisions > 0, jnp.log(jnp.where(precisions > 0, precisions, 1.0)), -jnp.inf)
    hyp, ref = self.lengths.total()[0], self.lengths.total()[1]
    brevity = jnp.where(hyp < ref, jnp.exp(1.0 - ref / hyp), 1.0)  # hyp 0 < ref: exp(-inf) = 0
    score = brevity * jnp.exp(jnp.mean(log_p))
    return jnp.where(self.example_rows.total() > 0, score, jnp.nan)


class RougeN(MeanRowScore):
  """ROUGE-N: the mean over real rows of the n-gram F-measure (rouge-score's ``rougeN``).

  Per row ``F = 2 overlap / (hyp n-grams + ref n-grams)``, ``overlap`` the n-grams shared
  (each counted ``min(hyp count, ref count)`` times), 0 without overlap; with several
  references the best F of the row counts (rouge-score's ``score_multi``, torchmetrics'
  ``accumulate="best"``).

  Args:
    n: the n-gram order (1 for ROUGE-1, 2 for ROUGE-2).
    pad_id: the padding id, removed from every sentence.
    vocab_size: optional; ids ``>= vocab_size`` are counted as invalid (negative ids always).

  Update keywords: ``preds`` ``[B, T]`` int ids; ``target`` ``[B, S]`` or ``[B, R, S]``;
  ``mask`` bool ``[B]``. ``compute()`` is NaN when no real row was seen.

  Example:
    >>> import jax.numpy as jnp
    >>> m = RougeN(1).update(preds=jnp.array([[1, 2, 3, 0]]), target=jnp.array([[1, 2, 4, 5]]))
    >>> round(float(m.compute()), 4)  # 2 shared of 3 and 4 unigrams: 2 * 2 / 7
    0.5714
  """

  n: int
  pad_id: int = 0
  vocab_size: int | None = config_field(default=None)

  def _check_config(self):
    super()._check_config()
    validation.check_positive_int("n", self.n)

  def _row_scores(self, batch: TokenBatch) -> jax.Array:
    return rouge_n_scores(batch, self.n)
