"""DataFrameSource (padded_eval/data/sources/dataframe.py): a pandas DataFrame as its columns."""

import jax
import numpy as np
import pytest
from _padding_reference import assert_batches_equal, expected_batches

import padded_eval as pe

# ---- pandas DataFrame -------------------------------------------------------------------------------------------


def test_a_dataframe_is_padded_as_its_columns():
  """A DataFrame is a Mapping of its columns (rows in order, the index ignored): 21 rows, dividing neither
  the batch of 16 nor the 8 devices, give the numpy reference's batches, padded rows masked."""
  pd = pytest.importorskip("pandas")
  rng = np.random.default_rng(5)
  data = {
    "x": rng.normal(size=21).astype(np.float32),
    "label": rng.integers(0, 3, 21),
    "ok": rng.random(21) < 0.5,
    "f": np.where(np.arange(21) % 4 == 0, np.nan, np.arange(21.0)),  # NaN kept, as numpy holds it
  }
  frame = pd.DataFrame(data, index=np.arange(21)[::-1] * 10)
  pad = {"x": np.nan, "label": -1, "ok": False, "f": -2.0}
  got = pe.pad_batches(frame, 16, num_devices=8, pad_value=pad)
  assert len(got) == 2
  assert_batches_equal(got, expected_batches(data, 16, pad=pad))
  assert_batches_equal(got.skip(1), expected_batches(data, 16, pad=pad)[1:])  # seeks, as a Mapping
  nullable = pd.DataFrame({"n": pd.array([1, 2, 3], dtype="Int64")})  # no NA: its numpy dtype
  assert_batches_equal(
    pe.pad_batches(nullable, 4, num_devices=1), expected_batches({"n": np.arange(1, 4)}, 4)
  )


@pytest.mark.parametrize(
  ("columns", "match"),
  [
    (
      {"x": [1.0, 2.0], "name": ["a", "b"]},
      r"^the DataFrame's column 'name' has dtype (str|object)",
    ),
    (
      {"x": [1.0, 2.0], "when": ["2020", "2021"]},
      r"^the DataFrame's column 'when' has dtype datetime64",
    ),
    (
      {"n": [1, None]},
      r"^the DataFrame's column 'n' holds missing values \(NA\), which numpy int64",
    ),
    ({"mask": [1, 2]}, r"has a key 'mask' equal to mask_key"),
  ],
)
def test_dataframe_columns_numpy_cannot_pad_are_refused_naming_them(columns, match):
  pd = pytest.importorskip("pandas")
  frame = pd.DataFrame(columns)
  if "when" in columns:
    frame["when"] = pd.to_datetime(frame["when"])
  if "n" in columns:
    frame["n"] = frame["n"].astype("Int64")
  with pytest.raises(ValueError, match=match):
    pe.pad_batches(frame, 4, num_devices=1)


def test_a_dataframe_with_repeated_column_names_is_refused():
  pd = pytest.importorskip("pandas")
  frame = pd.DataFrame([[1, 2]], columns=["a", "a"])
  with pytest.raises(ValueError, match=r"^the DataFrame has repeated column names \['a'\]"):
    pe.pad_batches(frame, 4, num_devices=1)


@pytest.mark.parametrize(
  ("columns", "match"),
  [
    (None, r"^the DataFrame's column names \[0, 1\] are not strings"),  # pd.DataFrame(array)
    ([("a", "x"), ("a", "y")], r"^the DataFrame's column names \[\('a', 'x'\), \('a', 'y'\)\]"),
    (["a", 2.5], r"^the DataFrame's column names \[2\.5\] are not strings"),
  ],
)
def test_a_dataframe_whose_column_names_are_not_strings_is_refused(columns, match):
  """A batch holds the mask under a string key, and jax sorts a dict's keys: a column named 0 beside it made
  every batch a pytree jax cannot flatten ("Comparator raised exception while sorting pytree dictionary
  keys" in masked_eval), after pad_batches had taken the frame."""
  pd = pytest.importorskip("pandas")
  values = np.arange(6.0).reshape(3, 2)
  frame = pd.DataFrame(values) if columns is None else pd.DataFrame(values, columns=columns)
  with pytest.raises(
    ValueError, match=match + r".*frame\.columns = \[str\(c\) for c in frame\.columns\]"
  ):
    pe.pad_batches(frame, 4, num_devices=1)
  renamed = frame.set_axis([str(c) for c in frame.columns], axis=1)
  (batch,) = pe.pad_batches(renamed, 4, num_devices=1)
  assert len(jax.tree.leaves(batch)) == 3  # a pytree: its keys sort
  np.testing.assert_array_equal(batch[str(frame.columns[1])][:3], values[:, 1])
