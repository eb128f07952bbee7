"""Argument checks shared by every module: configuration and update inputs.

A leaf module (it imports nothing from the package): metrics, losses, data and the
driver all call these, so a check is written once and every error reads alike. Each
raises ``ValueError`` naming the argument, what came, and what was expected.

Update inputs (:func:`as_input`) are checked eagerly, in Python, before any JAX
operation: outside ``jit`` the values are concrete, so ``None``, strings, ragged
lists, complex values and float64 values that float32 cannot hold are refused with the
keyword's name. Inside ``jit`` the values are tracers: only dtypes and shapes can be
checked there, and values that cannot raise (out-of-range labels, NaN in real rows)
are counted by the metrics instead (see ``Metric.invalid_counts``).

float64 policy: JAX's default 32-bit mode computes in float32, so float64 inputs are
converted to float32 (JAX does the same to any float64 numpy array it receives). When
the conversion would change what a statistic sees -- a finite nonzero value that
becomes 0 or a subnormal (below ``2**-126``) or overflows to inf -- the update raises
instead of silently computing on zeros or infinities: rescale the values, or enable
``jax_enable_x64``. Values that merely round (float64's extra mantissa bits) are
converted as JAX would.
"""

from __future__ import annotations

import numbers
from collections.abc import Collection
from typing import Any, TypeGuard

import numpy as np

FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # smallest normal float32, 2**-126
FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_choice(argname: str, value: Any, allowed: Collection) -> None:
  """Raises ValueError naming ``argname`` if ``value`` is not one of ``allowed``."""
  if value not in allowed:
    raise ValueError(f"{argname} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def check_flag(argname: str, value: Any) -> None:
  """Raises ValueError unless ``value`` is True or False (a numpy bool or 0 / 1 is refused)."""
  if not isinstance(value, bool):
    raise ValueError(f"{argname} must be True or False; got {value!r}")


def check_positive_int(argname: str, value: Any, *, allow_none: bool = False) -> None:
  """Raises ValueError unless ``value`` is an int >= 1 (``bool`` is refused).

  Args:
    argname: the argument's name, for the message.
    value: the value to check.
    allow_none: also accept ``None`` (an optional setting).
  """
  if value is None and allow_none:
    return
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
    expected = "a positive int" + (" or None" if allow_none else "")
    raise ValueError(f"{argname} must be {expected}; got {value!r}")


def check_nonnegative_int(argname: str, value: Any) -> None:
  """Raises ValueError unless ``value`` is an int >= 0 (``bool`` is refused)."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
    raise ValueError(f"{argname} must be a non-negative int; got {value!r}")


def is_int(value: Any) -> TypeGuard[int]:
  """Whether ``value`` is an integer (Python or numpy; ``bool`` is not one)."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[float]:
  """Whether ``value`` is a real number (Python or numpy, integer or float; ``bool`` is not one)."""
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(argname: str, value: Any, *, minimum: int | None = None) -> int:
  """``value`` as an int; ValueError unless it is an integer (numpy ones too; ``bool`` is refused)
  of at least ``minimum`` when given.

  >>> check_int("batch_size", 8, minimum=1)
  8
  """
  if not is_int(value) or (minimum is not None and value < minimum):
    expected = "an int" if minimum is None else f"an int >= {minimum}"
    raise ValueError(f"{argname} must be {expected}; got {value!r}")
  return int(value)


def check_divisible(
  what: str, size: int, parts: int, where: str | None = None, hint: str = ""
) -> None:
  """Raises ValueError unless ``size`` splits evenly into ``parts``, naming the nearest sizes that do.

  Args:
    what: what ``size`` is, for the message (``"batch_size"``, ``"leaf ['x'] leading size"``).
    size: the size to split.
    parts: how many equal parts (devices, or shards of a mesh axis).
    where: how the message names the parts; default ``"{parts} devices"``.
    hint: appended to the message (how to get such a size).

  >>> check_divisible("batch_size", 12, 8)
  Traceback (most recent call last):
  ValueError: batch_size 12 is not divisible by 8 devices; use a multiple, e.g. 8 or 16
  """
  if size % parts:
    lower = max(size // parts, 1) * parts
    where = f"{parts} devices" if where is None else where
    raise ValueError(
      f"{what} {size} is not divisible by {where}; use a multiple, e.g. {lower} or "
      f"{lower + parts}{hint}"
    )


def check_positive_number(argname: str, value: Any) -> None:
  """Raises ValueError unless ``value`` is a finite real number > 0 (``bool`` is refused)."""
  if not is_number(value) or not np.isfinite(value) or value <= 0:
    raise ValueError(f"{argname} must be a positive finite number; got {value!r}")


def check_probability(argname: str, value: Any) -> None:
  """Raises ValueError unless ``value`` is a real number in ``[0, 1]``."""
  if not is_number(value) or not 0 <= value <= 1:
    raise ValueError(f"{argname} must be a number in [0, 1]; got {value!r}")


def _is_traced(value: Any) -> bool:
  # A jax.core.Tracer (inside jit/vmap/grad); checked by name so this module needs no jax import.
  return any(cls.__name__ == "Tracer" for cls in type(value).__mro__)


def as_input(argname: str, value: Any, *, owner: str = "update") -> Any:
  """Checks one update keyword and returns it as an array (numpy, or a JAX array as given).

  Args:
    argname: the keyword's name (``preds``, ``target``, ``mask``, ...), for messages.
    value: what the caller passed.
    owner: who reads it (e.g. ``"Accuracy.update"``), for messages.

  Returns:
    ``value`` unchanged if it is a JAX array or tracer; otherwise ``np.asarray(value)``,
    with float64 converted to float32 (see the module docstring).

  Raises:
    ValueError: ``None``, strings or bytes, ragged nested lists, object arrays, complex
      values, or float64 values outside float32's normal range.
  """
  if value is None:
    raise ValueError(f"{owner}: {argname} is None; expected an array")
  if _is_traced(value) or type(value).__module__.startswith(("jax", "jaxlib")):
    dtype = np.dtype(value.dtype)
    _check_dtype(argname, dtype, owner)
    return value
  if isinstance(value, (str, bytes)):
    raise ValueError(
      f"{owner}: {argname} is a {type(value).__name__} ({value!r:.40}); expected an array of numbers"
    )
  try:
    array = np.asarray(value)
  except ValueError as e:  # ragged nested sequences
    raise ValueError(
      f"{owner}: {argname} could not be made an array ({e}); expected a rectangular array, not a "
      "ragged list (pad the rows to one length)"
    ) from None
  if array.dtype == object:
    raise ValueError(
      f"{owner}: {argname} is an object array (ragged rows, None or mixed types); expected a "
      "rectangular array of numbers"
    )
  _check_dtype(argname, array.dtype, owner)
  if array.dtype == np.float64:
    _check_float32_range(argname, array, owner)
    array = array.astype(np.float32)
  return array


def _check_dtype(argname: str, dtype: np.dtype, owner: str) -> None:
  if dtype.kind in "US":
    raise ValueError(f"{owner}: {argname} holds strings ({dtype}); expected an array of numbers")
  if dtype.kind == "c":
    raise ValueError(
      f"{owner}: {argname} is complex ({dtype}); metrics take real values (pass .real or "
      "abs() explicitly)"
    )


def _check_float32_range(argname: str, array: np.ndarray, owner: str) -> None:
  magnitude = np.abs(array[np.isfinite(array) & (array != 0)])
  if magnitude.size == 0:
    return
  smallest, largest = float(magnitude.min()), float(magnitude.max())
  if smallest < FLOAT32_TINY or largest > FLOAT32_MAX:
    raise ValueError(
      f"{owner}: {argname} is float64 with magnitudes in [{smallest:.3g}, {largest:.3g}], outside "
      f"float32's normal range [{FLOAT32_TINY:.3g}, {FLOAT32_MAX:.3g}]; JAX computes in float32 and "
      "would turn them into 0 or inf. Rescale the values, or enable jax_enable_x64."
    )
