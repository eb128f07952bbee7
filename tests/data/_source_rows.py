"""Rows and flat chunks shared by the tests of the source kinds (tests/data/sources/)."""

import numpy as np

from padded_eval.data._tree import flatten


def dataset(n, seed=0):
  rng = np.random.default_rng(seed)
  return {
    "x": rng.normal(size=(n, 2)).astype(np.float32),
    "y": {"id": np.arange(n, dtype=np.int64)},
  }


def split(data, sizes):
  bounds = np.cumsum([0, *sizes])
  return [
    {"x": data["x"][a:b], "y": {"id": data["y"]["id"][a:b]}}
    for a, b in zip(bounds[:-1], bounds[1:])
  ]


def concatenated(chunks):
  """The rows of flat chunks, concatenated per path, checking each chunk's row count."""
  chunks = list(chunks)
  for flat, rows in chunks:
    assert all(len(leaf) == rows for leaf in flat.values())
  return {path: np.concatenate([flat[path] for flat, _ in chunks]) for path in chunks[0][0]}


def assert_same_rows(got, data):
  want = flatten(data)
  assert got.keys() == want.keys()
  for path in want:
    np.testing.assert_array_equal(got[path], want[path])
