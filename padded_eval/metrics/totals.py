"""The totals of one batch: a metric's sums and counts and its real rows, in few reductions.

`Metric.batch_updates` counts the update's real rows (`real_row_flags`, into the state field
`ROWS_FIELD`); a metric may declare its statistics as `Totals`, summed with those rows in one
stacked reduction (`batch_totals`: under a sharded jit one all-reduce per step), and a
collection sums its members' totals of one shape together (`finished_together`).
docs/architecture.md, "The loop".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.caches import registry
from padded_eval.exact._floats import compensated_sum
from padded_eval.exact.accumulate import ExactCount, ExactSum

#: The state field holding a metric's count of real rows (:meth:`Metric.example_count`).
ROWS_FIELD = "example_rows"


def _row_flags(values, rows: int) -> jax.Array:
  """bool ``[rows]``: the rows of ``values`` (a prefix of the inputs' shape) with any True."""
  values = jnp.asarray(values)
  if values.ndim == 0:
    return jnp.broadcast_to(values, (rows,))
  # math.prod, not -1: a 0-row batch has no size to infer the other axis from
  return jnp.any(values.reshape(values.shape[0], math.prod(values.shape[1:])), axis=-1)


def real_row_flags(mask, weights, inputs) -> jax.Array | None:
  """bool ``[B]``: the rows an update counts as real (see :meth:`Metric.example_count`).

  Args:
    mask: None or bool, a prefix of the inputs' shape (``[B]``, ``[B, T]``, ...).
    weights: None or float, a prefix of the inputs' shape; a row whose weights are
      all 0 is not counted.
    inputs: the update's row inputs (:meth:`Metric.row_inputs`); the first array with a
      leading axis gives ``B``. Without one (scalars, pytrees) no row is counted: such
      an update cannot say.

  Returns:
    bool ``[B]``, True for a real row; None without row inputs.
  """
  shapes = [x.shape for x in inputs if len(getattr(x, "shape", ())) > 0]
  if not shapes:
    return None
  rows = shapes[0][0]
  real = jnp.ones((rows,), bool)
  if mask is not None:
    real &= _row_flags(jnp.asarray(mask).astype(bool), rows)
  if weights is not None:
    real &= _row_flags(jnp.asarray(weights) != 0, rows)
  return real


class RowsToCount:
  """The real rows of one update (`Metric.batch_updates`), and their count once a `Totals`
  reduction has taken them (one all-reduce, not two, under a sharded jit).

  Attributes:
    flags: bool ``[B]`` (`real_row_flags`), or None: no rows, or a mask that does not fit
      (``_batch_state`` then raises its own ValueError, naming the input).
    counted: the int32 count once a `Totals` reduction has summed the flags, else None.
  """

  def __init__(self, kwargs: dict, row_inputs):
    reference = [kwargs.get(key) for key in row_inputs]
    self._args = (kwargs.get("mask"), kwargs.get("weights"), reference)
    try:
      self.flags = real_row_flags(*self._args)
    except (TypeError, ValueError):  # a bad mask: reported by the metric's own checks
      self.flags = None
    self.counted = None

  def count(self) -> jax.Array:
    """int32: the number of real rows (0 without rows)."""
    if self.counted is not None:
      return self.counted
    flags = self.flags
    if flags is None:  # no rows, or a bad mask: it raises here if the metric did not
      flags = real_row_flags(*self._args)
    return jnp.zeros((), jnp.int32) if flags is None else jnp.sum(flags, dtype=jnp.int32)


class Totals:
  """The totals a metric declares for one batch, and how its state is built from them.

  ``_batch_state`` may return one instead of the state dict: `Metric.batch_updates` then sums
  ``sums`` and ``counts`` together with the update's real rows in as few reductions as they
  allow (`batch_totals`: one stacked reduction when the shapes agree, so under a sharded jit a
  step of Accuracy or Mean is one all-reduce of one array) and calls ``build``. This is the one
  place where statistics share a reduction with the row count: nothing ambient.

  Args:
    sums: float arrays (values already masked: 0 where not real); each is summed whole.
    counts: bool arrays (already masked) or None (counts 0).
    build: ``(ExactSum scalar per sum (compensated), int32 scalar per count) -> state dict``
      (or what `then` maps to one).

  Example:
    >>> import jax.numpy as jnp
    >>> totals = Totals([jnp.array([1.0, 2.0])], [jnp.array([True, False])], lambda s, c: (s, c))
    >>> [float(x.total()) for x in totals.reduced(None)[0][0]]
    [3.0]
  """

  def __init__(self, sums: list, counts: list, build: Callable[[list, list], Any]):
    self.sums, self.counts, self.build = list(sums), list(counts), build

  def then(self, fn: Callable[[Any], Any]) -> Totals:
    """The same totals, with ``fn`` applied to what ``build`` returns."""
    return Totals(self.sums, self.counts, lambda s, c: fn(self.build(s, c)))

  def reduced(self, row_flags: jax.Array | None) -> tuple[Any, jax.Array | None]:
    """``(build(sums, counts), real rows)``; the rows (int32) are counted in the same reduction
    when ``row_flags`` (bool ``[B]``) has the shape of every summed array, else None."""
    sums, counts = self.summed(row_flags)
    return self.built(*batch_totals(sums, counts), row_flags)

  def summed(self, row_flags: jax.Array | None) -> tuple[list, list]:
    """``(sums, counts)`` to pass to `batch_totals`: ``counts`` ends with ``row_flags`` when it
    has the shape of every summed array (the rows are then counted in the same reduction)."""
    return list(self.sums), self.counts + ([row_flags] if self._claims(row_flags) else [])

  def built(self, sums: list, counts: list, row_flags: jax.Array | None) -> tuple[Any, Any]:
    """``(build(sums, counts), real rows or None)`` from the totals of `summed`'s arrays."""
    counts = list(counts)
    rows = counts.pop() if self._claims(row_flags) else None
    return self.build(sums, counts), rows

  def shape(self, row_flags: jax.Array | None) -> tuple | None:
    """The one shape of every summed array (`summed`), or None if they differ or there are none:
    totals of one shape share a reduction with other metrics' (`finished_together`)."""
    sums, counts = self.summed(row_flags)
    shapes = {np.shape(a) for a in sums + [c for c in counts if c is not None]}
    return shapes.pop() if len(shapes) == 1 else None

  def _claims(self, row_flags: jax.Array | None) -> bool:
    arrays = [jnp.asarray(a) for a in self.sums + [c for c in self.counts if c is not None]]
    return (
      row_flags is not None and bool(arrays) and all(a.shape == row_flags.shape for a in arrays)
    )


class Pending:
  """One metric's statistics of a batch before its `Totals` (if it declared some) are summed.

  Attributes:
    metric: the metric whose update this is.
    state: what its ``_batch_state`` returned: a state dict or `Totals`.
    rows: its `RowsToCount`, or None (the metric does not count rows).
  """

  def __init__(self, metric: Any, state: Mapping[str, Any] | Totals, rows: Any):
    self.metric, self.state, self.rows = metric, state, rows

  @property
  def row_flags(self) -> jax.Array | None:
    return None if self.rows is None else self.rows.flags

  def finished(self, totals: tuple[list, list] | None = None) -> Any:
    """The metric holding the batch's state; ``totals``: `batch_totals` of this update's
    `Totals.summed` arrays (None: summed here, or no `Totals`)."""
    batch_state = self.state
    if isinstance(batch_state, Totals):  # declared totals: one reduction, with the real rows
      if totals is None:
        totals = batch_totals(*batch_state.summed(self.row_flags))
      batch_state, counted = batch_state.built(*totals, self.row_flags)
      if counted is not None:
        self.rows.counted = counted
    batch_state = dict(batch_state)
    if self.rows is not None and ROWS_FIELD not in batch_state:
      batch_state[ROWS_FIELD] = ExactCount.of(self.rows.count())
    return self.metric.replace_state(**batch_state)


def finished_together(pending: list[Pending]) -> list[Any]:
  """The metrics of ``pending`` updates, the `Totals` of one shape summed together.

  A collection's members each declare a few totals of one batch (Accuracy its hits and weights,
  Mean its weighted values and weights, each with its real rows): summed together they are one
  reduction (under a sharded jit one all-reduce per step, not one per member), normalized as
  one vector (`batch_totals`). Each total is summed as alone (the same compensated sum of the
  same elements).
  """
  groups: dict[tuple, list[int]] = {}
  for i, update in enumerate(pending):
    if isinstance(update.state, Totals):
      shape = update.state.shape(update.row_flags)
      groups.setdefault(("alone", i) if shape is None else ("shape", shape), []).append(i)
  totals: dict[int, tuple[list, list]] = {}
  for members in groups.values():
    if len(members) == 1:
      continue  # summed by `Pending.finished`
    # grouped above: states that are Totals only
    parts = [cast(Totals, pending[i].state).summed(pending[i].row_flags) for i in members]
    sums, counts = batch_totals(
      [a for part in parts for a in part[0]], [c for part in parts for c in part[1]]
    )
    sums, counts = iter(sums), iter(counts)
    for i, (part_sums, part_counts) in zip(members, parts):
      totals[i] = (
        [next(sums) for _ in part_sums],
        [next(counts) for _ in part_counts],
      )
  return [update.finished(totals.get(i)) for i, update in enumerate(pending)]


FLOAT_COUNT_LIMIT = 1 << 24
"""Counts of arrays with fewer elements than this are summed exactly in float32 (every partial
sum is an integer below 2**24), so they can share one reduction with float totals."""


def batch_totals(totals: list, counts: list) -> tuple[list, list]:
  """A batch's float totals (compensated) and True counts, in as few reductions as they allow.

  Under a sharded jit every reduction over the rows is a collective in every step, and XLA on
  CPU pays a rendezvous of all devices per reduced array: a metric's statistics are cheapest
  summed as one stacked array. When every array has the same shape (and the counts fewer than
  `FLOAT_COUNT_LIMIT` elements) they are one reduction; otherwise the totals and the counts are
  summed apart. A metric declares its totals with `Totals` (which adds the update's real rows).

  Args:
    totals: float arrays (values already masked: 0 where not real); each is summed whole.
    counts: bool arrays (already masked), or None (counts 0).

  Returns:
    ``(ExactSum scalar per total, int32 scalar per count)``, in the order given. The totals
    are compensated sums (:func:`padded_eval.exact._floats.compensated_sum`: error-free
    additions in any order), so cancelling values lose nothing to the batching.
  """
  totals = [jnp.asarray(t) for t in totals]
  flags = [f for f in (None if c is None else jnp.asarray(c) for c in counts) if f is not None]
  arrays = totals + flags
  shape = arrays[0].shape if arrays else ()  # read only when there are arrays
  if (
    arrays
    and all(a.shape == shape for a in arrays)
    and (not flags or math.prod(shape) < FLOAT_COUNT_LIMIT)
  ):
    float_sums, int_sums = _one_reduction(totals, flags)
  else:
    pairs = [compensated_sum(t.astype(jnp.float32)) for t in totals]
    float_sums = tuple(jnp.stack(part) for part in zip(*pairs)) if pairs else None
    int_sums = list(stacked_counts(flags))
  found = iter(range(len(int_sums)))
  zero = jnp.zeros((), jnp.int32)
  # one ExactSum of every total, normalized as a vector (the same bits as one by one, in a
  # fraction of the step's operations), then split
  stacked = None if float_sums is None else ExactSum.of_pair(*float_sums)
  float_sums = [] if stacked is None else [stacked[i] for i in range(len(totals))]
  return float_sums, [zero if c is None else int_sums[next(found)] for c in counts]


@registry.jit
def _one_reduction(totals: list, flags: list) -> tuple[tuple | None, list]:
  """Compensated float32 sums of ``totals`` and int32 counts of ``flags`` (all of one shape),
  from one reduction of their stack: ``((hi [n], lo [n]) or None without totals, counts)``.
  Jitted: one dispatch when called eagerly, inlined under jit."""
  stacked = jnp.stack(
    [t.astype(jnp.float32) for t in totals] + [f.astype(jnp.float32) for f in flags]
  )
  sums, errors = compensated_sum(stacked, axis=tuple(range(1, stacked.ndim)))
  counts = sums[len(totals) :].astype(jnp.int32)  # exact: integers below 2**24
  pairs = (sums[: len(totals)], errors[: len(totals)]) if totals else None
  return pairs, [counts[i] for i in range(len(flags))]


def stacked_counts(flags: list) -> jax.Array:
  """int32 ``[len(flags)]``: the True count of each bool array (None counts 0).

  Arrays of one shape are counted in one reduction of their stack: under a sharded jit that
  is one all-reduce for all of them (XLA on CPU pays one rendezvous per reduced array).
  """
  counts = [jnp.zeros((), jnp.int32)] * len(flags)
  groups: dict = {}
  for i, flag in enumerate(flags):
    if flag is not None:
      flag = jnp.asarray(flag)
      groups.setdefault(flag.shape, []).append((i, flag))
  for shape, members in groups.items():
    stacked = jnp.stack([flag for _, flag in members])
    totals = jnp.sum(stacked, axis=tuple(range(1, len(shape) + 1)), dtype=jnp.int32)
    for j, (i, _) in enumerate(members):
      counts[i] = totals[j]
  return jnp.stack(counts) if counts else jnp.zeros((0,), jnp.int32)
