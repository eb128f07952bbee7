"""Tuple elements named: ``pad_batches(..., keys=("image", "label"))`` for a torch ``TensorDataset``'s
``[x, y]`` batches, tf.data and grain tuples and iterables of tuple batches (the kinds that set
`padded_eval.data.sources.base.Source.names_fields`)."""

from __future__ import annotations

import collections.abc as cabc
from typing import Any

__all__ = ["kind_of", "name_fields", "named"]


def name_fields(element: Any, keys: tuple[str, ...], where: str) -> dict:
  """A tuple element (a torch ``TensorDataset`` batch, a tf.data or grain tuple) as a dict of its fields.

  Args:
    element: a tuple or list of ``len(keys)`` values (one value if `keys` names one field).
    keys: the fields' names, in order (``pad_batches(..., keys=...)``).
    where: how messages name the element, e.g. ``"batch 3 of the DataLoader"``.

  Returns:
    ``dict(zip(keys, element))``.

  Raises:
    ValueError: `element` is a Mapping (its fields have names already), or holds another number of values.
  """
  if isinstance(element, cabc.Mapping):
    raise ValueError(
      f"{where} is a dict with keys {sorted(map(str, element))}, but keys={keys!r} names the fields of tuple "
      "elements; drop keys= (a dict's fields are named already)"
    )
  if not isinstance(element, (tuple, list)):
    if len(keys) == 1:
      return {keys[0]: element}
    raise ValueError(
      f"{where} is a {type(element).__name__}, not a tuple, but keys={keys!r} names {len(keys)} fields; "
      "expected tuple elements of one value per key"
    )
  if len(element) != len(keys):
    raise ValueError(
      f"{where} is a {type(element).__name__} of {len(element)} values but keys={keys!r} names {len(keys)}; "
      f"expected one key per value (keys= of length {len(element)})"
    )
  return dict(zip(keys, element))


def kind_of(element: Any) -> str:
  """How messages name what an element is: ``"a dict"``, ``"a tuple of 2 values"``."""
  what = f"a {type(element).__name__}"
  if isinstance(element, (tuple, list)):
    what += f" of {len(element)} values"
  return what


def named(
  element: Any, keys: tuple[str, ...] | None, where: str, *, expected: str, passed: str, how: str
) -> cabc.Mapping:
  """`element` as a Mapping of its fields: a tuple named by `keys` (`name_fields`), a Mapping as it is.

  Args:
    element: an element (a row or a batch) of a source.
    keys: ``pad_batches(..., keys=...)``, or None.
    where: how messages name the element, e.g. ``"batch 3 of the DataLoader"``.
    expected: what an element should be, e.g. ``"a dict of tensors"``.
    passed: how the fix names the source, e.g. ``"loader"`` (``pe.pad_batches(loader, ...)``).
    how: the other fix, making elements dicts in the source's own terms.

  Raises:
    ValueError: without `keys`, an element that is not a Mapping (the message says how to name its fields);
      with them, see `name_fields`.
  """
  if keys is not None:
    return name_fields(element, keys, where)
  if isinstance(element, cabc.Mapping):
    return element
  raise ValueError(
    f"{where} is {kind_of(element)}; expected {expected}, so that each field has a name: pass "
    f"pe.pad_batches({passed}, ..., keys=('image', 'label')) with one name per value, or {how}"
  )
