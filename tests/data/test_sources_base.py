"""The numpy re-chunking and padding every source shares (padded_eval/data/sources/base.py)."""

import numpy as np
import pytest
from _padding_reference import assert_batches_equal, expected_batches

from padded_eval.data._tree import flatten, unflatten
from padded_eval.data.sources import base
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


# ---- the copies of a batch (issue 64: none beyond what the transfer needs): full batches are
# views of the source's arrays; the short last batch's real rows are copied once when kept across
# a read of the source, and once more into the padded batch, never a third time.


def chunks(data, sizes):
  start = 0
  for size in sizes:
    yield {("x",): data[start : start + size]}, size
    start += size


def test_full_batches_are_views_and_the_tail_is_copied_once():
  data = np.arange(23.0)
  out = list(base.rechunk(chunks(data, [23]), 8))
  assert [rows for _, rows in out] == [8, 8, 7]
  assert all(np.shares_memory(flat[("x",)], data) for flat, _ in out[:2])
  tail = out[2][0][("x",)]
  assert not np.shares_memory(tail, data) and tail.base is None  # its own buffer, not a view
  np.testing.assert_array_equal(tail, data[16:])


def test_pad_writes_the_real_rows_and_the_fill_into_one_new_array():
  leaf = np.arange(6.0).reshape(3, 2)
  out = base.pad({("x",): leaf}, 3, 5, "mask", {("x",): np.nan})
  got = out[("x",)]
  assert got.shape == (5, 2) and not np.shares_memory(got, leaf)
  np.testing.assert_array_equal(got[:3], leaf)
  assert np.isnan(got[3:]).all()
  np.testing.assert_array_equal(out[("mask",)], [True, True, True, False, False])
  strings = base.pad({("t",): np.array(["a", "b"], object)}, 2, 4, "mask", {("t",): b""})
  assert list(strings[("t",)]) == ["a", "b", "", ""]


def test_a_tail_from_several_chunks_is_joined():
  data = np.arange(20.0)
  out = list(base.rechunk(chunks(data, [5, 5, 5, 5]), 8))
  assert [rows for _, rows in out] == [8, 8, 4]
  np.testing.assert_array_equal(np.concatenate([f[("x",)] for f, _ in out]), data)
