"""Source kind: a pandas DataFrame, one key per column, rows in order (the index is not read).

Each column becomes a numpy array with ``Series.to_numpy()`` when the DataFrame is wrapped (a view of a numeric
column where pandas allows it), and the DataFrame is then padded as a whole-dataset Mapping of them
(`MappingSource`: full batches are views, ``len()`` is known, a resumed evaluation seeks). Columns numpy has no
number for are refused, naming the column: strings and other objects, dates and times, and a nullable integer or
bool column holding missing values (``pd.NA``, which numpy's int64 or bool cannot hold; a nullable float column
gives NaN, as numpy holds it), and column names that are not strings (``pd.DataFrame(array)``'s ints, a
MultiIndex's tuples: a batch holds them beside the mask's string key, and jax cannot sort mixed keys). pandas is
never imported here: a DataFrame is recognised by its class's module and
name, and read through its own methods.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from padded_eval.data.sources.base import SourceOptions
from padded_eval.data.sources.mapping import MappingSource

__all__ = ["DataFrameSource"]

_NUMBERS = "biufc"  # numpy kinds a device holds: bool, ints, floats, complex


class DataFrameSource(MappingSource):
  """A pandas DataFrame as the Mapping ``{column: column.to_numpy()}``."""

  description = "a pandas DataFrame"

  library = ("pandas", ("DataFrame",))  # a subclass included; pandas never imported here

  @classmethod
  def accepts(
    cls, obj: Any
  ) -> bool:  # the default's, not MappingSource's (a DataFrame is no Mapping)
    return cls._library_kind(obj) is not None

  def __init__(self, obj: Any, options: SourceOptions):
    """Reads the columns as numpy arrays.

    Raises:
      ValueError: repeated column names, a column name that is not a string, a column numpy holds no numbers for (strings, objects, dates), a
        nullable column whose missing values numpy cannot hold, or see `MappingSource` (a column named
        `mask_key`, no columns).
    """
    super().__init__(_columns(obj), options)


def _columns(frame: Any) -> dict:
  """``{column: numpy array}`` of a DataFrame's columns, checked."""
  if not frame.columns.is_unique:
    repeated = sorted({str(c) for c in frame.columns[frame.columns.duplicated()]})
    raise ValueError(
      f"the DataFrame has repeated column names {repeated}; expected one column per name (rename them, "
      "e.g. frame.columns = [...])"
    )
  unnamed = [c for c in frame.columns if not isinstance(c, str)]
  if unnamed:
    raise ValueError(
      f"the DataFrame's column names {unnamed[:5]} are not strings (as pd.DataFrame(array)'s or a MultiIndex's "
      "are); each batch holds them beside the string key of the mask, and jax cannot sort a dict's keys of mixed "
      "types (masked_eval would fail to flatten every batch): name the columns with strings, e.g. "
      "frame.columns = [str(c) for c in frame.columns]"
    )
  columns = {}
  for name in frame.columns:
    series = frame[name]
    values = series.to_numpy()
    numpy_dtype = getattr(series.dtype, "numpy_dtype", None)  # a nullable (masked) pandas dtype's
    if numpy_dtype is not None and values.dtype != numpy_dtype and series.isna().any():
      raise ValueError(
        f"the DataFrame's column {name!r} holds missing values (NA), which numpy {numpy_dtype} cannot "
        f"hold (pandas dtype {series.dtype}); fill them (frame[{name!r}].fillna(value)) or drop those rows "
        "(frame.dropna(subset=[...])) before pad_batches"
      )
    if values.dtype.kind not in _NUMBERS:
      what = {
        "O": "strings or Python objects",
        "U": "strings",
        "S": "bytes",
        "M": "dates",
        "m": "times",
      }
      raise ValueError(
        f"the DataFrame's column {name!r} has dtype {series.dtype} "
        f"({what.get(values.dtype.kind, 'not numbers')}, which no device holds); expected numbers or bools: "
        f"encode it as numbers (e.g. frame[{name!r}].astype('int64'), or .cat.codes of a category), or drop "
        f"it (frame.drop(columns=[{name!r}]))"
      )
    columns[name] = np.asarray(values)
  return columns
