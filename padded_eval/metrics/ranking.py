"""Ranking metrics: one row is one query, scored over its real candidates.

``preds`` ``[B, L]`` holds the candidates' scores (higher ranks first) and ``target``
``[B, L]`` their relevance (0 not relevant; graded values for :class:`NDCGAtK`; any
value > 0 is relevant for the others). A ``[B, L]`` mask drops candidates (lists of
different lengths in one batch), a ``[B]`` mask drops whole queries; a row with no real
candidate left (all masked, or all invalid and dropped, below) is not a query. ``weights``
``[B]`` weigh queries.

Every metric is the (weighted) mean over queries of a per-query score in ``[0, 1]``,
so its state is two exact totals (:class:`~padded_eval.exact.accumulate.ExactSum`: the sum of
scores and the number of queries), reduced with ``psum`` like a mean. A query with no
relevant candidate scores 0 (torchmetrics ``empty_target_action="neg"``, scikit-learn's
``ndcg_score``).

Ranking: candidates are sorted by descending score in a stable sort, so tied scores keep
their order in the list (the earlier candidate ranks first). :class:`NDCGAtK` instead
averages the gains of tied candidates over the places they share (scikit-learn's
``ndcg_score(ignore_ties=False)``), so its value does not depend on the order of ties.
A NaN score ranks after every other real candidate.

Peers: on the same queries (``indexes`` = the row) the values equal torchmetrics'
``RetrievalRecall``, ``RetrievalPrecision``, ``RetrievalMRR``, ``RetrievalMAP`` and
``RetrievalNormalizedDCG`` (``benchmarks/peers_torchmetrics.py``) when scores are > 0 and
untied: torchmetrics 1.9 counts a candidate scored <= 0 as not relevant in the first
four, and orders ties by its sort.

Invalid real candidates, counted by kind in ``invalid`` (``masked_eval`` reports them)
and dropped from their query as if masked: ``"negative relevance"`` (e.g. the -1 that
TF-Ranking uses for padding), ``"nan relevance"``, and for :class:`NDCGAtK`
``"infinite relevance"``. ``"nan score"`` is counted and the
candidate kept (ranked last). A query of weight 0 is not seen: none of its candidates is
counted, and its score is not used.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from padded_eval import validation
from padded_eval.exact.accumulate import ExactCount, ExactSum, upcast
from padded_eval.masking import broadcast_mask, broadcast_prefix
from padded_eval.metrics.base import Metric, empty_count, empty_sum, invalid_state, state
from padded_eval.metrics.totals import Totals


@dataclasses.dataclass(frozen=True)
class RankedLists:
  """A batch of queries, each list sorted by descending score (stable).

  Attributes:
    relevance: float32 ``[B, L]``, the sorted candidates' relevance (0 where dropped).
    kept: bool ``[B, L]``, the sorted candidate is real and valid (dropped ones last).
    group_start, group_end: int32 ``[B, L]``, the first and last place (0-based) of the
      candidate's group of tied scores among the kept ones.
  """

  relevance: jax.Array
  kept: jax.Array
  group_start: jax.Array
  group_end: jax.Array

  @property
  def relevant(self) -> jax.Array:
    """bool ``[B, L]``: the sorted candidate is kept and relevant (relevance > 0)."""
    return self.kept & (self.relevance > 0)


def rank_lists(preds, target, real) -> RankedLists:
  """Sorts every query's kept candidates by descending score (see :class:`RankedLists`).

  Args:
    preds: float32 ``[B, L]`` scores.
    target: float32 ``[B, L]`` relevance.
    real: bool ``[B, L]``, the candidates to keep (real and valid).
  """
  scores = jnp.where(real, preds, 0.0)
  nan = jnp.isnan(scores)
  # -score as the sort key, with -0.0 and 0.0 one key (equal scores tie)
  key = jnp.where(nan | (scores == 0), 0.0, -scores)
  dropped = (~real).astype(jnp.int32)
  relevance = jnp.where(real, target, 0.0)
  sorted_dropped, sorted_nan, sorted_key, sorted_relevance = jax.lax.sort(
    (dropped, nan.astype(jnp.int32), key, relevance), dimension=1, num_keys=3, is_stable=True
  )
  kept = sorted_dropped == 0
  places = jnp.arange(scores.shape[1], dtype=jnp.int32)
  differs = (sorted_key[:, 1:] != sorted_key[:, :-1]) | (sorted_nan[:, 1:] != sorted_nan[:, :-1])
  differs |= sorted_dropped[:, 1:] != sorted_dropped[:, :-1]
  edge = jnp.ones((scores.shape[0], 1), bool)  # not differs[:, :1]: empty for one candidate
  first = jnp.concatenate([edge, differs], axis=1)  # starts a group
  last = jnp.concatenate([differs, edge], axis=1)  # ends a group
  group_start = jax.lax.cummax(jnp.where(first, places, 0), axis=1)
  group_end = jax.lax.cummin(jnp.where(last, places, places[-1]), axis=1, reverse=True)
  return RankedLists(sorted_relevance, kept, group_start, group_end)


class RankingMetric(Metric):
  """Base of the ranking metrics: the weighted mean over queries of ``_query_scores``.

  Subclasses define ``_query_scores(lists: RankedLists) -> float32 [B]``.

  Update keywords: ``preds`` float ``[B, L]`` scores; ``target`` ``[B, L]`` relevance
  (int, float or bool; >= 0); ``mask`` bool ``[B]`` or ``[B, L]``; ``weights`` float
  ``[B]`` query weights. ``compute()`` is NaN when no query was seen.
  """

  higher_is_better: ClassVar[bool | None] = True

  total: ExactSum = state(empty_sum)  # sum of w * score over queries
  queries: ExactSum = state(empty_sum)  # sum of w over queries
  invalid: ExactCount = state(invalid_state)
  example_rows: ExactCount = state(empty_count)

  invalid_kinds: ClassVar[tuple[str, ...]] = ("negative relevance", "nan relevance", "nan score")

  def _unusable_relevance(self, target: jax.Array) -> dict[str, jax.Array]:
    """``{kind: bool [B, L]}``: relevances this metric cannot use beyond negative and NaN ones
    (counted under ``kind`` and dropped as if masked); none here."""
    del target
    return {}

  @abc.abstractmethod
  def _query_scores(self, lists: RankedLists) -> jax.Array:
    """float32 ``[B]``: each query's score, from its sorted candidates."""

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    preds, target = jnp.asarray(preds), jnp.asarray(target)
    if preds.ndim != 2 or target.shape != preds.shape:
      raise ValueError(
        f"{type(self).__name__} takes preds [B, L] scores and target [B, L] relevance "
        f"(one row per query, L candidates); got preds {preds.shape}, target {target.shape}"
      )
    if not jnp.issubdtype(preds.dtype, jnp.floating):
      raise ValueError(f"preds must be float scores; got dtype {preds.dtype}")
    preds, target = upcast(preds), upcast(target)
    real = broadcast_mask(mask, preds.shape, "preds")
    negative, nan_relevance = real & (target < 0), real & jnp.isnan(target)
    nan_score = real & jnp.isnan(preds)
    unusable = {kind: real & bad for kind, bad in self._unusable_relevance(target).items()}
    kept = real & ~negative & ~nan_relevance
    for bad in unusable.values():
      kept = kept & ~bad
    lists = rank_lists(preds, target, kept)
    row = jnp.any(real, axis=1)  # a row of real candidates: its invalid ones are counted
    w = jnp.where(row, 1.0, 0.0)
    if weights is not None:
      w = jnp.where(
        row, broadcast_prefix(upcast(jnp.asarray(weights)), w.shape, "weights", "queries"), 0.0
      )
    seen = (row & (w != 0))[:, None]  # a query of weight 0 is not seen: nothing of it counted
    # a query is a row with a candidate left: one whose candidates were all dropped is not one
    weighed = jnp.any(kept, axis=1) & (w != 0)
    w = jnp.where(weighed, w, 0.0)
    scores = jnp.where(weighed, self._query_scores(lists), 0.0)
    invalid = self.count_invalid(
      **{
        "negative relevance": negative & seen,
        "nan relevance": nan_relevance & seen,
        "nan score": nan_score & seen,
        **{kind: bad & seen for kind, bad in unusable.items()},
      }
    )
    sums = [jnp.where(weighed, w * scores, 0.0), w]  # one reduction with the real rows
    return Totals(sums, [], lambda s, _: {"total": s[0], "queries": s[1], "invalid": invalid})

  def compute(self) -> jax.Array:
    """The mean per-query score (float32 scalar); NaN when no query was seen."""
    return self.total.ratio(self.queries)


class CutOffMetric(RankingMetric):
  """A ranking metric scored over each query's top ``k`` candidates (``k=None``: all of them)."""

  k: int | None = None

  def _check_config(self):
    super()._check_config()
    validation.check_positive_int("k", self.k, allow_none=True)


def _top(x: jax.Array, k: int | None) -> jax.Array:
  return x if k is None else x[:, :k]


def _ratio(numerator, denominator) -> jax.Array:
  """``numerator / denominator``, 0 where the denominator is 0 (no relevant item)."""
  defined = denominator > 0
  return jnp.where(defined, numerator / jnp.where(defined, denominator, 1.0), 0.0)


class RecallAtK(CutOffMetric):
  """Recall at ``k``: the share of a query's relevant candidates ranked in its top ``k``.

  Equals torchmetrics ``RetrievalRecall(top_k=k)`` (with ``indexes``); a query with no
  relevant candidate scores 0.

  Args:
    k: the cut-off, a positive int (``None``: every candidate, so 1 for any query with a
      relevant one).

  Example:
    >>> import jax.numpy as jnp
    >>> m = RecallAtK(2).update(preds=jnp.array([[0.9, 0.1, 0.5, 0.3]]),
    ...                         target=jnp.array([[1, 1, 0, 0]]))
    >>> float(m.compute())
    0.5
  """

  def _query_scores(self, lists):
    relevant = lists.relevant
    return _ratio(jnp.sum(_top(relevant, self.k), 1), jnp.sum(relevant, 1).astype(jnp.float32))


class PrecisionAtK(CutOffMetric):
  """Precision at ``k``: relevant candidates in the top ``k``, divided by ``k``.

  Equals torchmetrics ``RetrievalPrecision(top_k=k)`` (``adaptive_k=False``: a query
  with fewer than ``k`` candidates still divides by ``k``); a query with no relevant
  candidate scores 0.

  Args:
    k: the cut-off, a positive int (``None``: divide by the query's number of real
      candidates).

  Example:
    >>> import jax.numpy as jnp
    >>> m = PrecisionAtK(3).update(preds=jnp.array([[0.9, 0.1, 0.5, 0.3], [0.2, 0.8, 0.4, 0.6]]),
    ...                            target=jnp.array([[1, 1, 0, 0], [0, 1, 0, 1]]))
    >>> round(float(m.compute()), 6)  # queries: 1 and 2 relevant in the top 3, (1/3 + 2/3) / 2
    0.5
  """

  def _query_scores(self, lists):
    hits = jnp.sum(_top(lists.relevant, self.k), 1).astype(jnp.float32)
    if self.k is None:
      return _ratio(hits, jnp.sum(lists.kept, 1).astype(jnp.float32))
    return hits / self.k


class MRR(RankingMetric):
  """Mean reciprocal rank: ``1 / rank`` of a query's best-ranked relevant candidate.

  Equals torchmetrics ``RetrievalMRR``; a query with no relevant candidate scores 0.

  Example:
    >>> import jax.numpy as jnp
    >>> m = MRR().update(preds=jnp.array([[0.9, 0.1, 0.5], [0.2, 0.8, 0.4]]),
    ...                  target=jnp.array([[0, 1, 1], [1, 0, 0]]))
    >>> round(float(m.compute()), 6)  # (1/2 + 1/3) / 2
    0.416667
  """

  def _query_scores(self, lists):
    relevant = lists.relevant
    first = jnp.argmax(relevant, axis=1).astype(jnp.float32)
    return jnp.where(jnp.any(relevant, 1), 1.0 / (first + 1.0), 0.0)


class MAPAtK(CutOffMetric):
  """Mean average precision at ``k``.

  A query's average precision is the mean, over the relevant candidates ranked in its
  top ``k``, of the precision at their rank; 0 when none is (torchmetrics
  ``RetrievalMAP(top_k=k)``). With ``k=None`` every candidate counts (MAP).

  Args:
    k: the cut-off, a positive int or ``None``.

  Example:
    >>> import jax.numpy as jnp
    >>> m = MAPAtK().update(preds=jnp.array([[0.9, 0.1, 0.5]]), target=jnp.array([[1, 1, 0]]))
    >>> round(float(m.compute()), 6)  # (1/1 + 2/3) / 2
    0.833333
  """

  def _query_scores(self, lists):
    relevant = _top(lists.relevant, self.k)
    hits = jnp.cumsum(relevant, axis=1).astype(jnp.float32)
    rank = jnp.arange(1, relevant.shape[1] + 1, dtype=jnp.float32)
    precision = jnp.sum(jnp.where(relevant, hits / rank[None], 0.0), 1)
    return _ratio(precision, jnp.sum(relevant, 1).astype(jnp.float32))


class NDCGAtK(CutOffMetric):
  """Normalized discounted cumulative gain at ``k``, with graded relevance.

  ``DCG@k = sum_{rank <= k} relevance / log2(rank + 1)`` (linear gains), divided by the
  DCG@k of the ideal ranking; tied scores share their places' discounts equally. Equals
  scikit-learn's ``ndcg_score(k=k)`` query by query (``ignore_ties=False``); a query
  with no relevant candidate scores 0. A real candidate of relevance +inf (whose query's
  DCG and ideal DCG would both be inf, a NaN score) is counted, kind
  ``"infinite relevance"``, and dropped as if masked.

  Args:
    k: the cut-off, a positive int or ``None`` (every candidate).

  Example:
    >>> import jax.numpy as jnp
    >>> m = NDCGAtK(3).update(preds=jnp.array([[0.1, 0.9, 0.5, 0.2]]),
    ...                       target=jnp.array([[3.0, 0.0, 1.0, 2.0]]))
    >>> round(float(m.compute()), 6)  # sklearn.metrics.ndcg_score(target, preds, k=3)
    0.342499
  """

  invalid_kinds: ClassVar[tuple[str, ...]] = (
    *RankingMetric.invalid_kinds,
    "infinite relevance",
  )

  def _unusable_relevance(self, target: jax.Array) -> dict[str, jax.Array]:
    return {"infinite relevance": jnp.isposinf(target)}

  def _query_scores(self, lists):
    length = lists.relevance.shape[1]
    places = jnp.arange(length, dtype=jnp.float32)
    discount = 1.0 / jnp.log2(places + 2.0)
    if self.k is not None:
      discount = jnp.where(places < self.k, discount, 0.0)
    # sum of the discounts of places [0, p): a group of ties [start, end] shares
    # cumulative[end + 1] - cumulative[start] equally
    cumulative = jnp.concatenate([jnp.zeros((1,)), jnp.cumsum(discount)])
    shared = cumulative[lists.group_end + 1] - cumulative[lists.group_start]
    size = (lists.group_end - lists.group_start + 1).astype(jnp.float32)
    gains = jnp.where(lists.kept, lists.relevance * shared / size, 0.0)
    # the ideal ranking's DCG needs only the best min(k, L) relevances (top_k: no full sort)
    best = jax.lax.top_k(lists.relevance, min(self.k or length, length))[0]
    return _ratio(jnp.sum(gains, 1), jnp.sum(best * discount[None, : best.shape[1]], 1))
