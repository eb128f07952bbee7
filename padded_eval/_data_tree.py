"""Flat views of nested dict batches: ``{("features", "image"): leaf}`` and back (private to data)."""

from __future__ import annotations

import collections.abc as cabc
from typing import Any

import numpy as np

Path = tuple[Any, ...]
FlatBatch = dict[Path, Any]


def flatten(tree: cabc.Mapping, convert: bool = True, prefix: Path = ()) -> FlatBatch:
  """Flattens nested Mappings into ``{path: leaf}`` in key order; leaves become numpy arrays if `convert`."""
  flat: FlatBatch = {}
  for key, value in tree.items():
    path = prefix + (key,)
    if type(value) is np.ndarray:  # the common case, without the slower Mapping check
      flat[path] = value
    elif isinstance(value, cabc.Mapping):
      flat.update(flatten(value, convert, path))
    else:
      flat[path] = np.asarray(value) if convert else value
  return flat


def unflatten(flat: FlatBatch) -> dict:
  """Inverse of `flatten`: nested plain dicts."""
  tree: dict = {}
  for path, leaf in flat.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = leaf
  return tree


def path_name(path: Path) -> str:
  """A key path as users write it in messages: ``'image'`` or ``'features/image'``."""
  return repr("/".join(map(str, path)))
