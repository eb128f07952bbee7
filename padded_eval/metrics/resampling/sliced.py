"""Sliced: one state of any metric per slice (language, class, device type), in the same pass.

``Sliced(metric, num_slices)`` keeps ``num_slices`` states of ``metric`` on a leading axis,
``[num_slices, ...]``: slice ``s`` sees the real rows whose slice id (the ``slice`` keyword,
int ``[B]``) is ``s``. Every slice is an ordinary sufficient statistic, merged and
``psum``-reduced exactly like the metric itself (``merge``/``reduce``/``aggregate`` vmap the
metric's own over the slice axis), so per-slice values do not depend on batching, padding,
devices or hosts. A real row whose id is outside ``[0, num_slices)`` joins no slice and is
counted as invalid (``"slice id out of range"``); padding rows may hold any id.

How a batch reaches the slices (``method``):

* ``"segments"``: the metric's statistics of each row (``jax.vmap`` over rows, each a batch
  of one), summed into their slice with ``jax.ops.segment_sum`` through the accumulators'
  exact :meth:`~padded_eval.exact.accumulate.Accumulator.segment_sum`. Work and memory
  ``rows x state + num_slices x state`` per step: 10,000 slices cost what 1 does plus the
  state. For metrics whose state is sums of rows: every accumulator an ``ExactCount`` or
  ``ExactSum``, merged by addition (accuracy, means, the confusion family, calibration,
  perplexity, collections of them, and a ``Bootstrap`` of them).
* ``"vmap"``: the metric's batch update once per slice (``jax.vmap`` over slice ids, the
  mask restricted to the slice): ``num_slices x rows`` work. Any metric: moments (whose
  Chan merge is not a sum) and the curves (AUROC, AUPRC, ROC and PR curves, binned or exact:
  their state carries a score buffer, empty when binned, which is not a sum of rows) go this
  way; ``"segments"`` refuses them, naming the reason.
* ``"auto"`` (default): ``"segments"`` where the state is sums of rows, else ``"vmap"``.

State memory is ``num_slices`` times the metric's (:meth:`Sliced.state_nbytes`); the cost
of both methods at 1, 100 and 10,000 slices is measured by ``benchmarks/bench_bootstrap.py --only sliced``.

Example:
  >>> import jax.numpy as jnp
  >>> import padded_eval as pe
  >>> m = pe.metrics.Sliced(pe.metrics.Mean(), num_slices=3)
  >>> m = m.update(values=jnp.array([1.0, 2.0, 5.0, jnp.nan]), slice=jnp.array([0, 0, 2, 1]),
  ...              mask=jnp.array([True, True, True, False]))
  >>> [float(v) for v in m.compute()]  # slice 1 saw no real row
  [1.5, nan, 5.0]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval import validation
from padded_eval.exact.accumulate import Accumulator, ExactCount, ExactSum
from padded_eval.metrics.base import Metric, invalid_state, state
from padded_eval.metrics.resampling.bootstrap import (
  Bootstrap,
  check_mergeable,
  check_one_per_row,
  nbytes,
  set_wrapper_config,
  stacked,
  with_row_mask,
)
from padded_eval.metrics.totals import real_row_flags

if TYPE_CHECKING:
  from typing_extensions import Self

METHODS = ("auto", "segments", "vmap")
#: Rows combined by one exact segment sum (ExactCount sums at most 2**16 parts exactly).
SEGMENT_ROWS = 1 << 15


def _empty_slices(sliced: Sliced) -> Metric:
  return stacked(sliced.slices.empty(), sliced.num_slices)


def _empty_rows(sliced: Sliced) -> ExactCount:
  return ExactCount.zeros((sliced.num_slices,))


def sums_rows(metric: Metric) -> bool:
  """Whether ``metric``'s state is sums over rows: every accumulator an ``ExactCount`` or
  ``ExactSum`` and every metric in it merged by addition (the base ``merge``, or a
  ``Bootstrap``/``Sliced`` mapping it). Such a state is the segment sum of its rows' states."""
  return not_sums(metric) is None


def not_sums(metric: Metric) -> str | None:
  """Why ``metric``'s state is not sums over rows (for messages), or None if it is."""
  if type(metric).merge not in (Metric.merge, Bootstrap.merge, Sliced.merge):
    return f"{type(metric).__name__} merges its own way (e.g. Chan's moments)"
  children = jax.tree.leaves(
    metric, is_leaf=lambda x: x is not metric and isinstance(x, (Metric, Accumulator))
  )
  for child in children:
    if isinstance(child, Metric):
      reason = not_sums(child)
      if reason is not None:
        return reason
    elif type(child) not in (ExactCount, ExactSum):
      return f"{type(metric).__name__} keeps a {type(child).__name__}, which is not a sum of rows"
  return None


class Sliced(Metric):
  """``metric`` once per slice: ``compute()`` is ``[num_slices, ...]``, NaN for empty slices.

  Args:
    metric: the metric to slice (any :class:`Metric`: a collection, a ``Bootstrap``).
    num_slices: the number of slices ``S``; slice ids are ``0 .. S - 1``.
    key: the update keyword holding the slice ids, int ``[B]``.
    method: ``"auto"``, ``"segments"`` or ``"vmap"`` (see [the module docstring][padded_eval.metrics.resampling.sliced]).
    slice_names: optional ``S`` distinct str, the slices' names in :meth:`compute_logs`
      (default ``"0"``, ``"1"``, ...).
    name: the key in logs (default: the wrapped metric's name).

  Update keywords: the wrapped metric's, plus ``key`` (default ``slice``) int ``[B]``.

  Raises:
    ValueError: a bad argument, or ``method="segments"`` for a metric whose state is not
      sums of rows.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> m = pe.metrics.Sliced(pe.metrics.Accuracy(), num_slices=3)
    >>> m = m.update(
    ...   preds=np.array([0, 1, 1, 0]), target=np.array([0, 1, 0, 0]), slice=np.array([0, 0, 1, 1])
    ... )
    >>> m.compute()  # slice 2 saw no row
    Array([1. , 0.5, nan], dtype=float32)
  """

  num_slices: int = 1
  key: str = "slice"
  method: str = "auto"
  slice_names: tuple | None = None
  invalid_kinds: ClassVar[tuple[str, ...]] = ("slice id out of range",)
  slices: Metric = state(_empty_slices)
  slice_rows: ExactCount = state(_empty_rows)
  invalid: ExactCount = state(invalid_state)

  @property
  # pyrefly: ignore[bad-override]  # the wrapped metric's direction: a property over the class constant
  def higher_is_better(self) -> bool | None:
    """The wrapped metric's direction (every slice's value is one of its values)."""
    return self.slices.higher_is_better

  def __init__(
    self,
    metric: Metric,
    num_slices: int,
    key: str = "slice",
    *,
    method: str = "auto",
    slice_names=None,
    name: str | None = None,
  ):
    if not isinstance(metric, Metric):
      raise ValueError(f"Sliced wraps a Metric (e.g. pe.metrics.Accuracy()); got {metric!r}")
    validation.check_positive_int("num_slices", num_slices)
    validation.check_choice("method", method, METHODS)
    if method == "auto":
      method = "segments" if sums_rows(metric) else "vmap"
    reason = not_sums(metric) if method == "segments" else None
    if reason is not None:
      raise ValueError(
        f"method='segments' needs a metric whose state is sums of rows; {reason}: use "
        "method='vmap' (or 'auto', which picks it)"
      )
    if slice_names is not None:
      slice_names = tuple(slice_names)
      if (
        len(slice_names) != num_slices
        or len(set(slice_names)) != num_slices
        or not all(isinstance(n, str) and n for n in slice_names)
      ):
        raise ValueError(
          f"slice_names must be {num_slices} distinct non-empty str (one per slice); "
          f"got {slice_names!r}"
        )
    if not isinstance(key, str) or not key:
      raise ValueError(f"key must be the non-empty name of the slice-id keyword; got {key!r}")
    set_wrapper_config(
      self, metric, name, num_slices=num_slices, key=key, method=method, slice_names=slice_names
    )
    object.__setattr__(self, "slices", stacked(metric.empty(), num_slices))
    object.__setattr__(self, "slice_rows", _empty_rows(self))
    object.__setattr__(self, "invalid", invalid_state(self))

  def state_nbytes(self) -> int:
    """Bytes of the state: ``num_slices`` copies of the wrapped metric's, and the row counts."""
    return nbytes(self._state())

  # --- inputs ---------------------------------------------------------------------------

  def required_inputs(self) -> tuple[str, ...]:
    return (self.key,)

  def optional_inputs(self) -> tuple[str, ...]:
    return ()

  def _batch_state(self, **kwargs):
    ids = jnp.asarray(kwargs.pop(self.key))
    if ids.ndim != 1 or not jnp.issubdtype(ids.dtype, jnp.integer):
      raise ValueError(
        f"{self.key} must be int slice ids of shape [B] in [0, {self.num_slices}); got dtype "
        f"{ids.dtype} shape {ids.shape}"
      )
    check_one_per_row(self.key, ids, kwargs, "slice id")
    real = real_row_flags(kwargs.get("mask"), kwargs.get("weights"), [ids])
    assert real is not None  # ids has a row axis
    valid = (ids >= 0) & (ids < self.num_slices)
    segment = jnp.where(valid, ids, -1).astype(jnp.int32)  # -1: dropped by segment sums
    template = self.slices.empty()
    inner = with_row_mask(kwargs, valid)
    if self.method == "segments":
      slices = _segment_updates(template, inner, segment, self.num_slices)
    else:
      slices = _slice_updates(template, inner, segment, self.num_slices)
    rows = jax.ops.segment_sum((real & valid).astype(jnp.int32), segment, self.num_slices)
    return {
      "slices": slices,
      "slice_rows": ExactCount.of(rows),
      "invalid": self.count_invalid(**{"slice id out of range": real & ~valid}),
    }

  # --- merging (the slice axis mapped with vmap) ------------------------------------------

  def merge(self, other: Metric) -> Self:
    """Both states combined, slice by slice."""
    check_mergeable(self, other)
    assert isinstance(other, Sliced)  # check_mergeable: the same kind
    return self.replace_state(
      slices=jax.vmap(lambda a, b: a.merge(b))(self.slices, other.slices),
      slice_rows=self.slice_rows.merge(other.slice_rows),
      invalid=self.invalid.merge(other.invalid),
    )

  def reduce(self, axis_name) -> Sliced:
    """Combined across the mapped axis ``axis_name`` (inside pmap / shard_map)."""
    return self.replace_state(
      slices=jax.vmap(lambda a: a.reduce(axis_name))(self.slices),
      slice_rows=self.slice_rows.reduce(axis_name),
      invalid=self.invalid.reduce(axis_name),
    )

  def aggregate(self) -> Sliced:
    """Combined over a leading stacked axis ``[P, ...]`` (slices then sit at axis 1)."""
    return self.replace_state(
      slices=jax.vmap(lambda a: a.aggregate(), in_axes=1)(self.slices),
      slice_rows=self.slice_rows.aggregate(),
      invalid=self.invalid.aggregate(),
    )

  # --- results ---------------------------------------------------------------------------

  def names(self) -> tuple[str, ...]:
    """The slices' names: ``slice_names``, or ``"0"``, ``"1"``, ..."""
    return self.slice_names or tuple(str(s) for s in range(self.num_slices))

  def slice_counts(self) -> np.ndarray:
    """int64 ``[num_slices]``: the real rows each slice saw (exact; on the host)."""
    return self.slice_rows.to_numpy()

  def overall(self) -> Metric:
    """The wrapped metric over every row of every slice (the slices aggregated)."""
    return self.slices.aggregate()

  def _with_empty_nan(self, values):
    empty = self.slice_rows.total() == 0  # [S]

    def blank(value):
      value = jnp.asarray(value)
      if not jnp.issubdtype(value.dtype, jnp.inexact):
        return value  # counts stay counts (0 for an empty slice)
      where = empty.reshape(empty.shape + (1,) * (value.ndim - 1))
      return jnp.where(where, jnp.nan, value)

    return jax.tree.map(blank, values)

  def compute(self):
    """``[num_slices, ...]``: the wrapped metric's value per slice (a dict of them for a
    collection); NaN for a slice that saw no real row (float values)."""
    return self._with_empty_nan(jax.vmap(lambda m: m.compute())(self.slices))

  def compute_interval(self, confidence: float | None = None):
    """``(low, high)``, each ``[num_slices, ...]``: a wrapped ``Bootstrap``'s interval per slice.

    Raises:
      ValueError: the wrapped metric is not a ``Bootstrap``, or a bad ``confidence``.
    """
    if not isinstance(self.slices, Bootstrap):
      raise ValueError(
        f"compute_interval needs Sliced(Bootstrap(...)); this Sliced wraps "
        f"{type(self.slices).__name__}: wrap it as Sliced(pe.metrics.Bootstrap(metric), ...)"
      )
    low, high = jax.vmap(lambda m: m.compute_interval(confidence))(self.slices)
    return self._with_empty_nan(low), self._with_empty_nan(high)

  def compute_logs(self) -> dict[str, Any]:
    """``{f"{key}/{slice name}": value}``: every key of the wrapped metric's logs, per slice.

    Computed once over the slice axis, then split on the host: it does not trace (under
    ``jit`` it raises, so ``masked_eval`` computes it eagerly rather than compiling a
    program with one output per slice).
    """
    logs = self._with_empty_nan(jax.vmap(lambda m: m.compute_logs())(self.slices))
    logs = jax.tree.map(np.asarray, logs)  # on the host (refuses to trace: one entry per slice)
    names = self.names()
    return {f"{key}/{names[s]}": value[s] for key, value in logs.items() for s in range(len(names))}

  # --- invalid values and example counts --------------------------------------------------

  def invalid_report(self) -> list[tuple[str, str, int]]:
    """Out-of-range slice ids, then the wrapped metric's reports summed over the slices.

    Each slice's state is judged on its own (a slice's buffer of ``capacity`` elements
    overflows or not by its own rows), then the counts of each (name, kind) are added up:
    not the report of all slices pooled (`overall`), which would count elements beyond one
    buffer's capacity that no slice dropped. A count never shrinks when states merge, so when
    the pooled report is empty no slice has one, and the slices are not read one by one
    (10,000 slices of a collection: 0.64 s one by one)."""
    report = [(self.name, kind, n) for kind, n in self.invalid_counts().items() if n]
    if not self.overall().invalid_report():
      return report
    host = jax.device_get(self.slices)
    summed: dict[tuple[str, str], int] = {}
    for s in range(self.num_slices):
      one = jax.tree.map(lambda leaf, s=s: leaf[s], host)
      for name, kind, n in one.invalid_report():
        key = (self.name if name == one.name else f"{self.name}/{name}", kind)
        summed[key] = summed.get(key, 0) + n
    return report + [(name, kind, n) for (name, kind), n in summed.items()]

  def example_count(self) -> int:
    """The real rows counted in some slice (out-of-range ids excluded)."""
    return int(self.slice_counts().sum())

  def example_report(self) -> list[tuple[str, int]]:
    return [(self.name, self.example_count())]


def _row_arguments(kwargs: dict, rows: int) -> tuple[dict, dict]:
  """``(per-row keywords, other keywords)``: arrays whose leading axis is the ``rows``."""
  per_row, other = {}, {}
  for key, value in kwargs.items():
    shape = getattr(value, "shape", None)
    if shape is not None and len(shape) >= 1 and shape[0] == rows:
      per_row[key] = jnp.asarray(value)
    else:
      other[key] = value
  return per_row, other


def _segment_updates(template: Metric, kwargs: dict, segment, num_slices: int) -> Metric:
  """The slices' states: each row's state (vmap over rows), segment-summed exactly."""
  rows = segment.shape[0]
  per_row, other = _row_arguments(kwargs, rows)

  def one_row(row):
    return template.batch_updates(**other, **{k: v[None] for k, v in row.items()})

  total = None
  for start in range(0, rows, SEGMENT_ROWS):
    part = {k: v[start : start + SEGMENT_ROWS] for k, v in per_row.items()}
    states = jax.vmap(one_row)(part)  # leaves [rows, ...]
    ids = segment[start : start + SEGMENT_ROWS]
    summed = jax.tree.map(
      lambda acc: acc.segment_sum(ids, num_slices),
      states,
      is_leaf=lambda x: isinstance(x, Accumulator),
    )
    total = summed if total is None else jax.vmap(lambda a, b: a.merge(b))(total, summed)
  if total is None:  # no rows: an empty update per slice
    total = stacked(template.batch_updates(**kwargs), num_slices)
  return total


def _slice_updates(template: Metric, kwargs: dict, segment, num_slices: int) -> Metric:
  """The slices' states: the batch update once per slice (vmap over slice ids)."""

  def one_slice(s):
    return template.batch_updates(**with_row_mask(kwargs, segment == s))

  return jax.vmap(one_slice)(jnp.arange(num_slices, dtype=jnp.int32))
