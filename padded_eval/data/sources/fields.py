"""Tuple elements named: ``pad_batches(..., keys=("image", "label"))`` for a torch ``TensorDataset``'s
``[x, y]`` batches, tf.data and grain tuples and iterables of tuple batches (the kinds that set
`padded_eval.data.sources.base.Source.names_fields`)."""

from __future__ import annotations

import collections.abc as cabc
from typing import Any

__all__ = ["name_fields"]


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
