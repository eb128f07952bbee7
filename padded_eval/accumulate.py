"""Exact accumulators for JAX's default 32-bit mode.

Two state types carry every metric statistic:

* :class:`ExactCount` -- a non-negative integer total held in two int32 limbs,
  ``total = hi * 2**30 + lo`` with ``0 <= lo < 2**30``. Exact up to ``2**61``;
  nothing wraps at ``2**31`` or saturates at ``2**24``.
* :class:`ExactSum` -- a float total held as an unevaluated float32 pair
  ``value + error`` (a "double-float"), updated with error-free TwoSum. Sums over
  any number of steps keep about 48 significant bits; integer-valued totals (sums
  of weights that are counts) are exact up to ``2**48``.

Both reduce across a mapped axis with ``psum`` (no gather): count limbs are split
into 15-bit pieces so the integer ``psum`` cannot wrap, and float totals are split
at a common quantum so the ``psum`` of the high parts is exact. ``bf16``/``f16``
inputs are upcast to float32 before any reduction.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

LIMB_BITS = 30
_LIMB_MASK = (1 << LIMB_BITS) - 1
_HALF_BITS = 15
_HALF_MASK = (1 << _HALF_BITS) - 1


def _register(cls):
  """Registers an accumulator class (fields in ``cls._fields``) as a pytree."""

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
  def _make(cls, *values) -> Accumulator:
    """An accumulator holding ``values``, one per name in ``_fields``, in order."""
    acc = object.__new__(cls)
    for name, value in zip(cls._fields, values, strict=True):
      object.__setattr__(acc, name, value)
    return acc

  @property
  def shape(self) -> tuple[int, ...]:
    return jnp.shape(getattr(self, self._fields[0]))

  @abc.abstractmethod
  def merge(self, other):
    """Both totals combined."""

  @abc.abstractmethod
  def _combine(self, total: Callable, maximum: Callable, n: int):
    """Totals ``n`` parts given a summing and a maximum function over them."""

  def reduce(self, axis_name) -> Accumulator:
    """Totals across the mapped axis ``axis_name``; every device gets the total."""
    n = _axis_size(axis_name)
    return self._combine(
      lambda x: jax.lax.psum(x, axis_name), lambda x: jax.lax.pmax(x, axis_name), n
    )

  def aggregate(self) -> Accumulator:
    """Totals over a leading stacked axis (after ``all_gather`` or out of ``pmap``).

    Eagerly, parts spread over several devices (``pmap``'s outputs) are fetched to the
    host first: each eager op on them would be one program with a cross-device
    collective, and XLA's CPU client deadlocks (aborting after 40 s) when more than
    about 32 such programs are in flight (see HOWTO.md, "Driving metrics yourself").
    """
    acc = self
    if any(_on_several_devices(getattr(self, f)) for f in self._fields):
      acc = jax.device_get(self)
    n = acc.shape[0]
    return acc._combine(lambda x: jnp.sum(x, axis=0), lambda x: jnp.max(x, axis=0), n)

  def __repr__(self):
    fields = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
    return f"{type(self).__name__}({fields})"


def _on_several_devices(x) -> bool:
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


@_register
class ExactCount(Accumulator):
  """A non-negative integer total in two int32 limbs: ``hi * 2**30 + lo``.

  Attributes:
    lo: int32 array, ``0 <= lo < 2**30``.
    hi: int32 array of the same shape, in units of ``2**30``.
  """

  _fields = ("lo", "hi")

  @classmethod
  def zeros(cls, shape=()) -> ExactCount:
    zero = jnp.zeros(shape, jnp.int32)
    return cls._make(zero, zero)

  @classmethod
  def of(cls, counts: jax.typing.ArrayLike) -> ExactCount:
    """Wraps a batch's counts (int32, ``0 <= counts < 2**31``)."""
    counts = jnp.asarray(counts)
    if not jnp.issubdtype(counts.dtype, jnp.integer) and counts.dtype != jnp.bool_:
      raise ValueError(f"counts must be integers; got dtype {counts.dtype}")
    counts = counts.astype(jnp.int32)
    return cls._make(counts & _LIMB_MASK, counts >> LIMB_BITS)

  def merge(self, other: ExactCount) -> ExactCount:
    lo = self.lo + other.lo  # < 2**31: cannot wrap
    return self._make(lo & _LIMB_MASK, self.hi + other.hi + (lo >> LIMB_BITS))

  def _combine(self, total, maximum, n):
    del maximum
    if n >= 1 << (31 - _HALF_BITS):
      raise ValueError(f"ExactCount reduces over at most {1 << 16} devices; got {n}")
    low = total(self.lo & _HALF_MASK)  # < n * 2**15
    high = total(self.lo >> _HALF_BITS) + (low >> _HALF_BITS)
    lo = (low & _HALF_MASK) | ((high & _HALF_MASK) << _HALF_BITS)
    return self._make(lo, total(self.hi) + (high >> _HALF_BITS))

  def value(self) -> jax.Array:
    """The total as float32 (rounded beyond 2**24; use :meth:`to_numpy` for exact)."""
    return self.hi.astype(jnp.float32) * float(1 << LIMB_BITS) + self.lo.astype(jnp.float32)

  def to_numpy(self) -> np.ndarray:
    """The exact total as an int64 numpy array (host side)."""
    lo = np.asarray(jax.device_get(self.lo)).astype(np.int64)
    hi = np.asarray(jax.device_get(self.hi)).astype(np.int64)
    return (hi << LIMB_BITS) + lo


def two_sum(a, b):
  """Error-free sum: returns ``(s, e)`` with ``s = fl(a + b)`` and ``a + b = s + e``."""
  s = a + b
  b_virtual = s - a
  a_virtual = s - b_virtual
  return s, (a - a_virtual) + (b - b_virtual)


def _renormalize(value, error):
  value, rest = two_sum(value, error)
  return value, rest


@_register
class ExactSum(Accumulator):
  """A float total held as the unevaluated pair ``value + error`` (float32 each).

  Attributes:
    value: float32 array, the rounded total.
    error: float32 array, the rounding error still owed to ``value``.
  """

  _fields = ("value", "error")

  @classmethod
  def zeros(cls, shape=()) -> ExactSum:
    zero = jnp.zeros(shape, jnp.float32)
    return cls._make(zero, zero)

  @classmethod
  def of(cls, sums: jax.typing.ArrayLike) -> ExactSum:
    """Wraps a batch's sums (upcast to float32)."""
    sums = upcast(jnp.asarray(sums))
    return cls._make(sums, jnp.zeros_like(sums))

  def merge(self, other: ExactSum) -> ExactSum:
    value, error = two_sum(self.value, other.value)
    return self._make(*_renormalize(value, error + (self.error + other.error)))

  def _combine(self, total, maximum, n):
    # Split every value at a quantum common to all parts, so that the high parts are
    # multiples of it with at most 24 - ceil(log2 n) bits: their total is exact in any order.
    headroom = max(1, math.ceil(math.log2(max(n, 2))))
    if headroom > 20:
      raise ValueError(f"ExactSum reduces over at most 2**20 parts; got {n}")
    largest = maximum(jnp.abs(self.value))
    finite = jnp.isfinite(largest) & (largest > 0)
    _, exponent = jnp.frexp(jnp.where(finite, largest, 1.0))
    # Work in units of 2**exponent (exact power-of-two scaling, common to all parts): the
    # quantum is then a constant and never underflows, whatever the magnitude of the totals.
    scale = jnp.where(finite, -exponent, 0)
    value, error = jnp.ldexp(self.value, scale), jnp.ldexp(self.error, scale)
    quantum = 2.0 ** -(24 - headroom)
    high = jnp.where(finite, jnp.round(value / quantum) * quantum, value)
    low = value - high  # exact
    high_total = total(high)
    low_total = total(low) + total(error)
    high_total, low_total = _renormalize(high_total, low_total)
    return self._make(jnp.ldexp(high_total, -scale), jnp.ldexp(low_total, -scale))

  def value_f32(self) -> jax.Array:
    """The total rounded to float32."""
    return self.value + self.error

  def to_numpy(self) -> np.ndarray:
    """The total as a float64 numpy array (host side), error term included."""
    value = np.asarray(jax.device_get(self.value)).astype(np.float64)
    return value + np.asarray(jax.device_get(self.error)).astype(np.float64)


def upcast(x: jax.Array) -> jax.Array:
  """float16/bfloat16 (and ints, bools) -> float32; float32 stays as it is."""
  if x.dtype == jnp.float32:
    return x
  return x.astype(jnp.float32)


def is_accumulator(x) -> bool:
  return isinstance(x, Accumulator)
