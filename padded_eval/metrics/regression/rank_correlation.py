"""Rank correlations: SpearmanCorrelation and KendallTau (scipy / torchmetrics), exact.

Ranks are not psum-able (one element's rank depends on the whole dataset), so both keep
every counted ``(preds, target)`` pair in a :class:`~padded_eval.metrics.regression.pair_buffer.PairBuffer`
of a fixed ``capacity`` per output, merged and gathered exactly, and rank once at the end.
The value is then the exact one over the whole dataset, whatever the batching, devices and
hosts. Memory: ``8 * L * capacity`` bytes per device (``L`` = ``num_outputs``), plus the
final gather of ``devices`` buffers; pairs beyond ``capacity`` are counted and reported
(``masked_eval`` warns; the value is NaN), never dropped silently. A binned version would
be psum-able but only approximate; it is not offered.

Update keywords: ``preds``, ``target`` float of equal shape ``[B, ...]`` (``[B, ..., D]``
with ``num_outputs=D``); ``mask`` a prefix of their shape. No sample weights (neither
scipy nor torchmetrics weighs ranks): ``weights=`` raises. A real element with NaN in
``preds`` or ``target`` is counted in ``invalid`` (``"nan value"``) and makes the value NaN
(scipy's ``nan_policy="propagate"``). int32/uint32 values that float32 rounds (beyond
``2**24``, where it would make ties the data does not have) are counted in ``invalid``
(`ROUNDED`) and make the value NaN: subtract an offset first (e.g. the minimum).
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval import validation
from padded_eval.exact._floats import rounded_difference
from padded_eval.exact.accumulate import ExactCount, upcast
from padded_eval.masking import broadcast_mask
from padded_eval.metrics.base import Metric, empty_count, invalid_state, state
from padded_eval.metrics.regression import pair_buffer
from padded_eval.metrics.regression.moments import Moments, PearsonCorrelation
from padded_eval.metrics.regression.pair_buffer import PairBuffer, average_ranks, kendall_terms

ROUNDED = "integer that float32 rounds (beyond 2**24; subtract an offset, e.g. the minimum)"
"""The invalid kind of an int32/uint32 element whose float32 value is not the integer."""


def _rounded(x) -> jax.Array:
  """bool: the int32/uint32 elements of ``x`` that float32 does not hold (False for floats)."""
  x = jnp.asarray(x)
  if x.dtype not in (jnp.int32, jnp.uint32):
    return jnp.zeros(x.shape, bool)
  return rounded_difference(x, upcast(x)) != 0


def _empty_buffer(metric) -> PairBuffer:
  return PairBuffer.zeros(metric.num_outputs, metric.capacity)


class _RankCorrelation(Metric):
  """Kept pairs, their checks and reports; a subclass defines ``_correlation(buffer)``."""

  higher_is_better: ClassVar[bool | None] = True

  capacity: int | None = None
  num_outputs: int = 1
  buffer: PairBuffer = state(_empty_buffer)
  example_rows: ExactCount = state(empty_count)
  invalid: ExactCount = state(invalid_state)
  invalid_kinds: ClassVar[tuple[str, ...]] = ("nan value", ROUNDED)

  def number_inputs(self) -> tuple[str, ...]:
    return self.required_inputs()

  def _check_config(self):
    validation.check_positive_int("num_outputs", self.num_outputs)
    limit = pair_buffer.MAX_CAPACITY
    if not validation.is_int(self.capacity) or not 1 <= self.capacity <= limit:
      raise ValueError(
        f"{type(self).__name__} keeps every counted pair: capacity must be an int in [1, "
        f"{limit}], the most elements one output sees over the whole evaluation (memory "
        f"8 * num_outputs * capacity bytes per device), e.g. capacity=len(batches) * "
        f"batch_size; got {self.capacity!r}"
      )

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    if weights is not None:
      raise ValueError(
        f"{type(self).__name__} ranks elements and takes no sample weights (neither scipy nor "
        "torchmetrics weighs ranks); got weights. Drop the keyword, or mask elements out instead"
      )
    rounded = _rounded(preds) | _rounded(target) if jnp.shape(preds) == jnp.shape(target) else None
    preds, target = upcast(jnp.asarray(preds)), upcast(jnp.asarray(target))
    if preds.shape != target.shape:
      raise ValueError(
        f"preds has shape {preds.shape} but target has shape {target.shape}; expected equal shapes"
      )
    assert rounded is not None  # equal shapes
    assert self.capacity is not None  # _check_config: an int
    d = self.num_outputs
    if d > 1 and (preds.ndim < 2 or preds.shape[-1] != d):
      raise ValueError(
        f"num_outputs={d} expects preds and target of shape [batch, ..., {d}]; got {preds.shape}"
      )
    real = broadcast_mask(mask, preds.shape, "preds")
    nan = real & (jnp.isnan(preds) | jnp.isnan(target))
    flat = lambda x: jnp.reshape(x, (-1, d))
    buffer = PairBuffer.of(flat(preds), flat(target), flat(real & ~nan), self.capacity)
    invalid = self.count_invalid(**{"nan value": nan, ROUNDED: real & rounded})
    return {"buffer": buffer, "invalid": invalid}

  def _correlation(self, buffer: PairBuffer) -> jax.Array:
    raise ValueError(f"{type(self).__name__} defines no correlation")  # pragma: no cover

  def compute(self) -> jax.Array:
    """The correlation in ``[-1, 1]``: float32 scalar, or ``[D]`` with ``num_outputs=D``;
    NaN when undefined (fewer than 2 pairs, a constant variable), with a NaN input or an
    integer float32 rounds, or with pairs beyond ``capacity``."""
    value = self._correlation(self.buffer)
    clean = jnp.all(self.invalid.total() == 0)  # no NaN, no integer float32 rounds
    value = jnp.where((self.buffer.dropped == 0) & clean, value, jnp.nan)
    return value if self.num_outputs > 1 else value[0]

  def invalid_report(self) -> list[tuple[str, str, int]]:
    """As for every metric, and the pairs beyond ``capacity`` (value NaN)."""
    report = super().invalid_report()
    dropped = int(np.sum(np.asarray(jax.device_get(self.buffer.dropped), np.int64)))
    if dropped:
      kind = f"pair beyond capacity={self.capacity} (value NaN; pass a larger capacity)"
      report.append((self.name, kind, dropped))
    return report


class SpearmanCorrelation(_RankCorrelation):
  """Spearman's rank correlation: Pearson's correlation of the (average) ranks.

  Exact: ``scipy.stats.spearmanr`` / torchmetrics ``SpearmanCorrCoef`` (tied values share
  the mean of their ranks), over every counted pair kept (see [the module docstring][padded_eval.metrics.regression.rank_correlation]:
  memory ``8 * num_outputs * capacity`` bytes per device, the ranks sorted once at the
  end, ``O(capacity log capacity)``).

  Args:
    capacity: the most pairs one output sees over the whole evaluation (required; e.g.
      ``len(batches) * batch_size`` rows, times the extra elements per row). Under
      ``Bootstrap`` a replica holds each row as many times as it is drawn: ``rows + 5 *
      sqrt(rows)`` fits every replica in practice.
    num_outputs: 1 (every element one pair) or ``D`` for ``[batch, ..., D]`` inputs,
      one correlation per output (torchmetrics ``num_outputs``).

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> preds, target = np.array([1.0, 2.0, 2.0, 5.0]), np.array([1.0, 3.0, 2.0, 0.0])
    >>> m = pe.metrics.SpearmanCorrelation(capacity=8).update(preds=preds, target=target)
    >>> round(float(m.compute()), 4)  # scipy.stats.spearmanr: -0.3162
    -0.3162
  """

  def _correlation(self, buffer: PairBuffer) -> jax.Array:
    used = buffer.used()
    ranks = jnp.stack([average_ranks(buffer.pairs[..., k], used) for k in (0, 1)], -1)
    moments = Moments.of(ranks, used, used.astype(jnp.float32), (1,))
    if self.num_outputs == 1:  # PearsonCorrelation's one-output state is a scalar
      scalar = jax.tree.map(lambda x: x[0], moments)
      return PearsonCorrelation().replace_state(moments=scalar).compute()[None]
    pearson = PearsonCorrelation(num_outputs=self.num_outputs)
    return pearson.replace_state(moments=moments).compute()


class KendallTau(_RankCorrelation):
  """Kendall's tau-b ``(concordant - discordant) / sqrt((P - T_x) (P - T_y))``.

  ``P`` the pairs of elements, ``T_x`` / ``T_y`` those tied in ``preds`` / ``target``:
  exactly ``scipy.stats.kendalltau`` (``variant="b"``) / torchmetrics
  ``KendallRankCorrCoef`` (``variant="b"``), over every counted pair kept (see [the module
  docstring][padded_eval.metrics.regression.rank_correlation]). The pair counts are exact integers per element, summed error-free, from
  sorts and a bottom-up merge count of the discordant pairs (``O(capacity log^2
  capacity)`` at the end, memory ``O(num_outputs * capacity)``).

  Args:
    capacity: the most pairs one output sees over the whole evaluation (required).
    num_outputs: 1 or ``D`` for ``[batch, ..., D]`` inputs, one tau per output.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> preds = np.array([[1.0, 4.0], [2.0, 3.0], [2.0, 2.0], [5.0, 1.0]])  # 2 outputs
    >>> target = np.array([[1.0, 1.0], [3.0, 2.0], [2.0, 2.0], [0.0, 3.0]])
    >>> tau = pe.metrics.KendallTau(capacity=8, num_outputs=2).update(preds=preds, target=target)
    >>> [round(float(t), 4) for t in tau.compute()]  # scipy.stats.kendalltau per column
    [-0.1826, -0.9129]
  """

  def _correlation(self, buffer: PairBuffer) -> jax.Array:
    score, untied_x, untied_y = kendall_terms(buffer)
    defined = (untied_x > 0) & (untied_y > 0)
    root = jnp.sqrt(jnp.where(defined, untied_x, 1.0)) * jnp.sqrt(jnp.where(defined, untied_y, 1.0))
    return jnp.where(defined, jnp.clip(score / root, -1.0, 1.0), jnp.nan)
