"""Exact accumulators for JAX's default 32-bit mode.

Two state types carry every metric statistic:

* :class:`ExactCount` -- a non-negative integer total held in two int32 limbs,
  ``total = hi * 2**30 + lo`` with ``0 <= lo < 2**30``. Exact up to ``2**61``;
  nothing wraps at ``2**31`` or saturates at ``2**24``.
* :class:`ExactSum` -- a float total held as an unevaluated float32 pair scaled by a
  power of two, ``(hi + lo) * 2**exponent`` with ``0.5 <= |hi| < 1``, updated with
  error-free TwoSum. Sums over any number of steps keep about 48 significant bits;
  integer-valued totals (sums of weights that are counts) are exact up to ``2**48``;
  the exponent keeps totals (and sums of squares, see :meth:`ExactSum.of_sum`) from
  overflowing or underflowing float32 whenever the final result fits.

Both expose their totals the same way: ``total()`` (float32, on device) and
``to_numpy()`` (exact, on the host). Both reduce across a mapped axis with ``psum`` (no
gather): count limbs are split into 15-bit pieces so the integer ``psum`` cannot wrap,
and float totals are split at a common quantum so the ``psum`` of the high parts is
exact. ``bf16``/``f16`` inputs are upcast to float32 before any reduction.

Float arithmetic (error-free transformations, exact power-of-two scaling) lives in
:mod:`padded_eval.exact._floats`; the limb arithmetic of both accumulators stays here.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

if TYPE_CHECKING:
  from typing_extensions import Self

from padded_eval.exact._floats import (
  ZERO_EXPONENT,
  clamp,
  compensated_suffix_sums,
  compensated_sum,
  exponent,
  frexp,
  lax_operands,
  ldexp,
  power_of_two_factors,
  scale_down,
  scale_exponent,
  select,
  times_powers,
  two_prod,
  two_sum,
)

LIMB_BITS = 30
_A = TypeVar("_A", bound="Accumulator")
_LIMB_MASK = (1 << LIMB_BITS) - 1
_HALF_BITS = 15
_HALF_MASK = (1 << _HALF_BITS) - 1
_PIECE_BITS = 10


def register_accumulator(cls: type[_A]) -> type[_A]:
  """Registers an :class:`Accumulator` subclass (fields in ``cls._fields``) as a pytree.

  Use it as a class decorator on accumulators defined outside this module.
  """

  def flatten_with_keys(acc):
    children = [(jax.tree_util.GetAttrKey(f), getattr(acc, f)) for f in cls._fields]
    return children, None

  def unflatten(_, children):
    acc = object.__new__(cls)
    for name, child in zip(cls._fields, children):
      object.__setattr__(acc, name, child)
    return acc

  jax.tree_util.register_pytree_with_keys(
    cls,
    flatten_with_keys,
    unflatten,
    flatten_func=lambda acc: ([getattr(acc, f) for f in cls._fields], None),
  )
  return cls


class Accumulator(abc.ABC):
  """Base of the exact accumulators: immutable, a pytree of arrays."""

  _fields: tuple[str, ...] = ()

  def __setattr__(self, name, value):
    raise AttributeError(f"{type(self).__name__} is immutable")

  @classmethod
  def _make(cls, *values: jax.typing.ArrayLike | Accumulator) -> Self:
    """An accumulator holding ``values``, one per name in ``_fields``, in order."""
    acc = object.__new__(cls)
    for name, value in zip(cls._fields, values, strict=True):
      object.__setattr__(acc, name, value)
    return acc

  @property
  def shape(self) -> tuple[int, ...]:
    return jnp.shape(getattr(self, self._fields[0]))

  def full_shapes(self) -> tuple[tuple[int, ...], ...]:
    """Each field's shape in a total (what a metric's ``empty()`` holds): the fields' own shapes,
    except for accumulators whose one batch holds less (a score buffer's slots)."""
    return tuple(np.shape(getattr(self, f)) for f in self._fields)

  def trimmed(self) -> Self:
    """The same total in the fewest slots its concrete values need, for computing it (a score
    buffer's used slots); most accumulators return themselves."""
    return self

  @abc.abstractmethod
  def merge(self, other: Self) -> Self:
    """Both totals combined."""

  @abc.abstractmethod
  def _combine(
    self, total: Callable, maximum: Callable, n: int, spread: Callable | None = None
  ) -> Self:
    """Totals ``n`` parts given a summing and a maximum function over them; ``spread`` maps a
    combined value back onto the parts (default: broadcast)."""

  def reduce(self, axis_name: str | tuple[str, ...]) -> Self:
    """Totals across the mapped axis ``axis_name``; every device gets the total."""
    n = _axis_size(axis_name)
    return self._combine(
      lambda x: jax.lax.psum(x, axis_name), lambda x: jax.lax.pmax(x, axis_name), n
    )

  def segment_sum(self, segment_ids: jax.Array, num_segments: int) -> Self:
    """Totals of the leading axis's parts grouped by ``segment_ids``: ``[num_segments, ...]``.

    The same exact combination as :meth:`aggregate` (count limbs split so the integer sums
    cannot wrap, float parts split at a quantum common to each segment), with
    ``jax.ops.segment_sum`` in place of the sum: a part with an id outside
    ``[0, num_segments)`` is dropped, a segment without parts is an empty total.

    Args:
      segment_ids: int ``[n]``, the segment of each of the ``n`` leading parts.
      num_segments: the number of segments (static).

    Raises:
      ValueError: more parts than :meth:`aggregate` combines exactly (``2**16``).
    """
    ids = jnp.asarray(segment_ids, jnp.int32)
    n = self.shape[0]

    def total(x):
      return jax.ops.segment_sum(x, ids, num_segments)

    def maximum(x):
      return jax.ops.segment_max(x, ids, num_segments)

    return self._combine(total, maximum, n, spread=lambda x: x[jnp.clip(ids, 0, num_segments - 1)])

  def aggregate(self) -> Self:
    """Totals over a leading stacked axis (after ``all_gather`` or out of ``pmap``).

    Eagerly, parts spread over several devices (``pmap``'s outputs) are fetched to the
    host first: each eager op on them would be one program with a cross-device
    collective, and XLA's CPU client deadlocks (aborting after 40 s) when more than
    about 32 such programs are in flight (see HOWTO.md, "Driving metrics yourself").
    """
    acc = self
    if any(on_several_devices(getattr(self, f)) for f in self._fields):
      acc = jax.device_get(self)
    n = acc.shape[0]
    return acc._combine(lambda x: jnp.sum(x, axis=0), lambda x: jnp.max(x, axis=0), n)

  def __repr__(self):
    fields = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
    return f"{type(self).__name__}({fields})"


class GatheredBuffer(Accumulator):
  """Base of the accumulators that keep elements (the score buffers of exact AUROC, the pair
  buffers of the rank correlations): parts combine by gathering every part and folding them
  with ``merge``, never by summing limbs."""

  def reduce(self, axis_name: str | tuple[str, ...]) -> Self:
    """Every device's buffer gathered and folded (every device gets the whole).

    The gather is a ``psum`` of each buffer written into its own row of a zero
    ``[devices, ...]`` stack (exact: every other row adds zero), so its result is known to be
    the same on every device (what ``shard_map``'s replication check asks of ``P()``).
    """
    devices = jax.lax.psum(1, axis_name)
    me = jax.lax.axis_index(axis_name)

    def gathered(x):
      stack = jnp.zeros((devices,) + x.shape, x.dtype).at[me].set(x)
      return jax.lax.psum(stack, axis_name)

    return jax.tree.map(gathered, self).aggregate()

  def aggregate(self) -> Self:
    """The buffers stacked on a leading axis, folded into one."""
    parts = self
    if any(on_several_devices(x) for x in jax.tree.leaves(self)):
      parts = jax.device_get(self)  # eager parts over several devices: fold on the host
    folded = jax.tree.map(lambda x: x[0], parts)
    for i in range(1, parts.shape[0]):
      folded = folded.merge(jax.tree.map(lambda x, i=i: x[i], parts))
    return folded

  def _combine(
    self, total: Callable, maximum: Callable, n: int, spread: Callable | None = None
  ) -> Self:
    del total, maximum, n, spread
    raise ValueError(
      f"a {type(self).__name__} is combined by gathering, not summing: use reduce(axis_name) "
      "or aggregate()"
    )


def on_several_devices(x) -> bool:
  """Whether ``x`` is a concrete array held by more than one local device (not a tracer)."""
  return (
    isinstance(x, jax.Array)
    and not isinstance(x, jax.core.Tracer)
    and x.is_fully_addressable
    and len(x.sharding.device_set) > 1
  )


def _axis_size(axis_name) -> int:
  size = jax.lax.psum(1, axis_name)
  try:
    return int(size)
  except TypeError as e:  # pragma: no cover - psum of a constant is static in jax>=0.4
    raise ValueError(f"could not read the size of mapped axis {axis_name!r}") from e


@register_accumulator
class ExactCount(Accumulator):
  """A non-negative integer total in two int32 limbs: ``hi * 2**30 + lo``.

  Attributes:
    lo: int32 array, ``0 <= lo < 2**30``.
    hi: int32 array of the same shape, in units of ``2**30``.
  """

  _fields = ("lo", "hi")
  lo: jax.Array
  hi: jax.Array

  @classmethod
  def zeros(cls, shape: int | Sequence[int] = ()) -> ExactCount:
    zero = jnp.zeros(shape, jnp.int32)
    return cls._make(zero, zero)

  @classmethod
  def of(cls, counts: jax.typing.ArrayLike) -> ExactCount:
    """Wraps a batch's counts (int32, ``0 <= counts < 2**31``).

    Raises:
      ValueError: if ``counts`` is not an integer or bool array.
    """
    counts = jnp.asarray(counts)
    if not jnp.issubdtype(counts.dtype, jnp.integer) and counts.dtype != jnp.bool_:
      raise ValueError(f"counts must be integers; got dtype {counts.dtype}")
    counts = counts.astype(jnp.int32)
    return cls._make(counts & _LIMB_MASK, counts >> LIMB_BITS)

  def merge(self, other: Self) -> Self:
    lo = self.lo + other.lo  # < 2**31: cannot wrap
    return self._make(lo & _LIMB_MASK, self.hi + other.hi + (lo >> LIMB_BITS))

  def _combine(
    self, total: Callable, maximum: Callable, n: int, spread: Callable | None = None
  ) -> Self:
    del maximum, spread
    if n >= 1 << (31 - _HALF_BITS):
      raise ValueError(f"ExactCount reduces over at most {1 << 16} devices; got {n}")
    low = total(self.lo & _HALF_MASK)  # < n * 2**15
    high = total(self.lo >> _HALF_BITS) + (low >> _HALF_BITS)
    lo = (low & _HALF_MASK) | ((high & _HALF_MASK) << _HALF_BITS)
    return self._make(lo, total(self.hi) + (high >> _HALF_BITS))

  def __getitem__(self, index) -> ExactCount:
    """The counts at ``index`` (any numpy-style index of the count array)."""
    return self._make(self.lo[index], self.hi[index])

  def total(self) -> jax.Array:
    """The total as float32 (rounded beyond 2**24; use :meth:`to_numpy` for exact)."""
    return self.hi.astype(jnp.float32) * float(1 << LIMB_BITS) + self.lo.astype(jnp.float32)

  def to_numpy(self) -> np.ndarray:
    """The exact total as an int64 numpy array (host side)."""
    lo = np.asarray(jax.device_get(self.lo)).astype(np.int64)
    hi = np.asarray(jax.device_get(self.hi)).astype(np.int64)
    return (hi << LIMB_BITS) + lo

  def suffix_totals(self, inclusive: bool = True) -> jax.Array:
    """float32 ``sum_{j >= k} count[..., j]`` (``j > k`` if not inclusive), along the last axis.

    The limbs are split into 10-bit pieces whose int32 cumulative sums cannot wrap, so
    the only rounding is the final conversion to float32.
    """
    mask = (1 << _PIECE_BITS) - 1
    pieces = [
      self.lo & mask,
      (self.lo >> _PIECE_BITS) & mask,
      self.lo >> 2 * _PIECE_BITS,
      self.hi,
    ]
    total = jnp.zeros(self.shape, jnp.float32)
    for piece, scale in zip(pieces, (1, 1 << 10, 1 << 20, 1 << 30)):
      sums = jnp.flip(jnp.cumsum(jnp.flip(piece, -1), axis=-1), -1)
      if not inclusive:
        sums = sums - piece
      total = total + sums.astype(jnp.float32) * float(scale)
    return total

  def digits12(self) -> jax.Array:
    """int32 ``[..., 6]``: the count's base-``2**12`` digits, lowest first (72 bits, enough
    for any count below ``2**61``), for exact integer products outside this module."""
    upper = self.hi >> 6  # the bits of hi above its lowest 6, from bit 36 of the count
    mask = (1 << 12) - 1
    return jnp.stack(
      [
        self.lo & mask,
        (self.lo >> 12) & mask,
        (self.lo >> 24) | ((self.hi & 63) << 6),
        upper & mask,
        (upper >> 12) & mask,
        upper >> 24,
      ],
      axis=-1,
    )


def _normalized(hi, lo, exp):
  """``(hi, lo, exp)`` with ``hi = fl(hi + lo)`` scaled into ``0.5 <= |hi| < 1``.

  A zero total gets ``ZERO_EXPONENT``; an inf or NaN total is kept unscaled (exponent 0).
  """
  hi, lo = lax_operands(hi, lo)
  naive = select(lax.is_finite(hi), lax.add(hi, lo), hi)  # inf stays inf (its error term is NaN)
  finite = lax.is_finite(naive)
  hi, lo = two_sum(hi, lo)
  return _scaled(select(finite, hi, naive), select(finite, lo, 0.0), exp)


def _scaled(hi, lo, exp):
  """``(hi, lo, exp)`` (``hi = fl(hi + lo)`` already) scaled into ``0.5 <= |hi| < 1``."""
  finite = lax.is_finite(hi)
  k = exponent(hi)
  zero = lax.eq(k, np.int32(ZERO_EXPONENT))
  shift = select(zero, 0, k)
  exp, shift = lax_operands(exp, shift)
  exp = select(zero, ZERO_EXPONENT, select(finite, lax.add(exp, shift), 0))
  first, second = power_of_two_factors(lax.neg(shift))
  return times_powers(hi, first, second), times_powers(lo, first, second), exp


@register_accumulator
class ExactSum(Accumulator):
  """A float total ``(hi + lo) * 2**exponent``: a float32 pair and an int32 power of two.

  ``hi = fl(hi + lo)`` and ``0.5 <= |hi| < 1``; a zero total has ``hi = lo = 0`` and
  ``exponent = ZERO_EXPONENT``, an inf or NaN total keeps it in ``hi`` with exponent 0.
  Read the total with :meth:`total`, :meth:`to_numpy`, :meth:`frexp`, :meth:`ratio` or
  :meth:`quotient`, never from the fields.

  Attributes:
    hi: float32 array, the total's leading part, scaled.
    lo: float32 array of the same shape, the rounding error still owed to ``hi``, scaled.
    exponent: int32 array of the same shape, the power of two both are scaled by.
  """

  _fields = ("hi", "lo", "exponent")
  hi: jax.Array
  lo: jax.Array
  exponent: jax.Array

  @classmethod
  def zeros(cls, shape: int | Sequence[int] = ()) -> ExactSum:
    zero = jnp.zeros(shape, jnp.float32)
    return cls._make(zero, zero, jnp.full(shape, ZERO_EXPONENT, jnp.int32))

  @classmethod
  def of(cls, sums: jax.typing.ArrayLike, exponent: jax.typing.ArrayLike = 0) -> ExactSum:
    """Wraps a batch's sums, ``sums * 2**exponent`` (``sums`` upcast to float32)."""
    sums = upcast(jnp.asarray(sums))
    exp = jnp.broadcast_to(jnp.asarray(exponent, jnp.int32), sums.shape)
    return cls._make(*_scaled(sums, jnp.zeros_like(sums), exp))

  @classmethod
  def of_pair(cls, hi: jax.Array, lo: jax.Array, exponent: jax.typing.ArrayLike = 0) -> ExactSum:
    """The total ``(hi + lo) * 2**exponent`` of an unevaluated float32 pair (any ``hi``, ``lo``),
    e.g. a :func:`~padded_eval.exact._floats.compensated_sum`."""
    hi, lo = upcast(jnp.asarray(hi)), upcast(jnp.asarray(lo))
    exp = jnp.broadcast_to(jnp.asarray(exponent, jnp.int32), hi.shape)
    return cls._make(*_normalized(hi, lo, exp))

  @classmethod
  def of_sum(
    cls,
    values: jax.typing.ArrayLike,
    *,
    axis: int | tuple[int, ...] | None = None,
    where: jax.typing.ArrayLike | None = None,
    weights: jax.typing.ArrayLike | None = None,
    power: int = 1,
  ) -> ExactSum:
    """The total of ``weights * values**power`` over ``axis``.

    ``power=2`` (sums of squares) is range-safe: the values are scaled by a power of two
    per output element (the largest magnitude into ``[0.5, 1)``) before they are squared
    and summed, so nothing overflows or underflows unless it is negligible next to the
    total (one extra reduction, for the largest magnitude). ``power=1`` is the plain
    compensated float32 sum (:func:`~padded_eval.exact._floats.compensated_sum`, one pass): it
    overflows only when the batch's ``sum |w * x|`` exceeds float32's max; the ExactSum it
    starts never overflows later. Sums are compensated (error about ``n * 2**-48 * sum |w x|``),
    so cancelling values lose nothing to the batching; each product ``w * x`` (and square)
    is rounded once, exactly so for 0/1 weights.

    Args:
      values: float array (bf16/f16 upcast).
      axis: the axes to sum (None: all).
      where: optional bool array broadcastable to ``values``; other elements are ignored
        (NaN there never leaks).
      weights: optional float array broadcastable to ``values``; an element of weight 0 is
        ignored like one outside ``where`` (its value neither scales nor poisons the sum).
      power: 1 or 2.

    Returns:
      ExactSum of ``values``' shape without ``axis``.

    Raises:
      ValueError: if ``power`` is not 1 or 2.
    """
    if power not in (1, 2):
      raise ValueError(f"power must be 1 or 2; got {power!r}")
    values = upcast(jnp.asarray(values))
    if weights is not None:  # an element of weight 0 is not seen (its value sets no scale)
      weights = upcast(jnp.asarray(weights))
      where = (weights != 0) if where is None else (where & (weights != 0))
    if where is not None:
      values = select(where, values, 0.0)
    exp = 0
    if power == 2:
      # initial=0: an empty batch (0 rows) has no largest magnitude; its total is 0
      scale = scale_exponent(jnp.max(jnp.abs(values), axis=axis, keepdims=True, initial=0.0))
      first, second = power_of_two_factors(-scale)
      values = values * first * second
      values = values * values
      exp = 2 * (jnp.squeeze(scale, axis) if axis is not None else jnp.reshape(scale, ()))
    if weights is not None:
      values = weights * values
    if where is not None:
      values = select(where, values, 0.0)
    return cls.of_pair(*compensated_sum(values, axis=axis), exp)

  @classmethod
  def of_product(cls, a: jax.Array, b: jax.Array) -> ExactSum:
    """The exact product ``a * b`` of two float32 arrays (broadcast), never over- or underflowing."""
    (a_mantissa, a_exponent), (b_mantissa, b_exponent) = frexp(upcast(a)), frexp(upcast(b))
    product, error = two_prod(a_mantissa, b_mantissa)
    return cls._make(*_normalized(product, error, a_exponent + b_exponent))

  def __getitem__(self, index) -> ExactSum:
    """The totals at ``index`` (any numpy-style index of the total array)."""
    return self._make(self.hi[index], self.lo[index], self.exponent[index])

  def merge(self, other: Self) -> Self:
    mine, theirs = lax_operands(self.exponent, other.exponent)
    exp = lax.max(mine, theirs)
    mine, theirs = lax.sub(mine, exp), lax.sub(theirs, exp)
    a_hi, a_lo = scale_down(self.hi, mine), scale_down(self.lo, mine)
    b_hi, b_lo = scale_down(other.hi, theirs), scale_down(other.lo, theirs)
    hi, lo = two_sum(a_hi, b_hi)
    return self._make(*_normalized(hi, lax.add(lo, lax.add(a_lo, b_lo)), exp))

  def _combine(
    self, total: Callable, maximum: Callable, n: int, spread: Callable | None = None
  ) -> Self:
    # Scale every part to the largest exponent, then split it at a quantum common to all
    # parts, so that the high parts are multiples of it with at most 24 - ceil(log2 n)
    # bits: their total is exact in any order.
    headroom = max(1, math.ceil(math.log2(max(n, 2))))
    if headroom > 20:
      raise ValueError(f"ExactSum reduces over at most 2**20 parts; got {n}")
    finite = jnp.isfinite(self.hi)
    exp = maximum(select(finite, self.exponent, ZERO_EXPONENT))
    # explicit broadcast: a reduced leading axis (aggregate) is not promoted implicitly
    parts_exp = jnp.broadcast_to(exp if spread is None else spread(exp), self.exponent.shape)
    hi, lo = ldexp(self.hi, self.exponent - parts_exp), ldexp(self.lo, self.exponent - parts_exp)
    quantum = 2.0 ** -(24 - headroom)
    high = select(finite, jnp.round(hi / quantum) * quantum, hi)
    low = select(finite, hi - high, 0.0)  # exact
    hi, lo = two_sum(total(high), total(low) + total(lo))
    return self._make(*_normalized(hi, lo, exp))

  def total(self) -> jax.Array:
    """The total rounded to float32 (inf if it does not fit; see :meth:`ratio`)."""
    return ldexp(self.hi + self.lo, self.exponent)

  def suffix_totals(self, inclusive: bool = True) -> jax.Array:
    """float32 ``sum_{j >= k} total[..., j]`` (``j > k`` if not inclusive), along the last axis.

    The totals (both parts, scaled back) are summed by a compensated scan
    (:func:`~padded_eval.exact._floats.compensated_suffix_sums`), so the only rounding that
    matters is the final conversion to float32; ``inclusive=False`` shifts the sums by one
    (nothing is subtracted).
    """
    hi, lo = compensated_suffix_sums(ldexp(self.hi, self.exponent), ldexp(self.lo, self.exponent))
    sums = hi + lo
    if inclusive:
      return sums
    return jnp.concatenate([sums[..., 1:], jnp.zeros_like(sums[..., :1])], -1)

  def frexp(self) -> tuple[jax.Array, jax.Array]:
    """``(mantissa, exponent)``: float32 and int32 with ``total ~ mantissa * 2**exponent``.

    ``0.5 <= |mantissa| <= 1``, or 0 (exponent ``ZERO_EXPONENT``), or inf/NaN (exponent 0):
    arithmetic on the mantissas cannot overflow whatever the totals' magnitudes.
    """
    return self.hi + self.lo, self.exponent

  def ratio(self, denominator: ExactSum | jax.typing.ArrayLike, sqrt: bool = False) -> jax.Array:
    """float32 ``total / denominator`` (its square root if ``sqrt``), formed on the mantissas.

    Finite whenever the result fits float32, even when the totals themselves do not
    (sums of squares of values near 1e20, or below 1e-23). ``x / 0`` is inf, ``0 / 0``
    NaN; the square root of a negative ratio is NaN.
    """
    if isinstance(denominator, ExactSum):
      d_mantissa, d_exponent = denominator.frexp()
    else:
      d_mantissa, d_exponent = frexp(upcast(jnp.asarray(denominator)))
    mantissa, exp = self.frexp()
    quotient = mantissa / d_mantissa
    exp = clamp(exp - d_exponent, -(1 << 24), 1 << 24)
    if sqrt:
      odd = exp & 1
      quotient = jnp.sqrt(quotient * (1.0 + odd.astype(jnp.float32)))
      exp = (exp - odd) >> 1
    return ldexp(quotient, exp)

  def quotient(self, denominator: ExactSum) -> tuple[jax.Array, jax.Array]:
    """``total / denominator`` as an unevaluated float32 pair ``(hi, lo)`` (~45 bits).

    Shapes broadcast. ``lo`` is formed from ``hi``'s bits (:func:`two_prod`), so it refers
    to the rounded ``hi`` even where XLA computes the division as a reciprocal multiply.
    """
    head = self.hi / denominator.hi
    product, product_error = two_prod(head, denominator.hi)
    rest = (
      ((self.hi - product) - product_error) + self.lo - head * denominator.lo
    ) / denominator.hi
    exp = clamp(self.exponent - denominator.exponent, -(1 << 24), 1 << 24)
    return ldexp(head, exp), ldexp(rest, exp)

  def to_numpy(self) -> np.ndarray:
    """The total as a float64 numpy array (host side), error term included."""
    hi = np.asarray(jax.device_get(self.hi)).astype(np.float64)
    lo = np.asarray(jax.device_get(self.lo)).astype(np.float64)
    exp = np.asarray(jax.device_get(self.exponent)).astype(np.int64)
    return np.ldexp(hi + lo, np.clip(exp, -2000, 2000))


def upcast(x: jax.Array) -> jax.Array:
  """float16/bfloat16 (and ints, bools) -> float32; float32 stays as it is."""
  if x.dtype == jnp.float32:
    return x
  return x.astype(jnp.float32)
