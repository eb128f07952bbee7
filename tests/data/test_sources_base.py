"""The numpy re-chunking and padding every source shares (padded_eval/data/sources/base.py)."""

import numpy as np
import pytest
from _padding_reference import assert_batches_equal, expected_batches

from padded_eval.data._tree import flatten, unflatten
from padded_eval.data.sources.base import pad, rechunk

# ---- the shared numpy re-chunking and padding -------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [[5], [1, 2, 3, 4], [4, 4], [0, 9, 0]])
def test_rechunk_and_pad_against_index_arithmetic(sizes):
  data = {"x": np.arange(sum(sizes), dtype=np.float32), "label": np.arange(sum(sizes)) % 3}
  chunks = [(flatten(b), len(b["x"])) for b in split_flat(data, sizes)]
  fills = {("x",): np.float32(np.nan), ("label",): -1}
  got = [unflatten(pad(flat, rows, 4, "mask", fills)) for flat, rows in rechunk(iter(chunks), 4)]
  assert_batches_equal(got, expected_batches(data, 4, pad={"x": np.nan, "label": -1}))


def split_flat(data, sizes):
  bounds = np.cumsum([0, *sizes])
  return [{k: v[a:b] for k, v in data.items()} for a, b in zip(bounds[:-1], bounds[1:])]
