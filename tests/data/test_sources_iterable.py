"""IterableSource (padded_eval/data/sources/iterable.py): an iterable of batch Mappings."""

import numpy as np
import pytest
from _source_rows import assert_same_rows, concatenated, dataset, split

from padded_eval.data.sources.base import SourceOptions
from padded_eval.data.sources.iterable import IterableSource

# ---- iterable of batches ----------------------------------------------------------------------------------------


def test_iterable_source_keeps_order_and_rereads_lists():
  data = dataset(11)
  batches = split(data, [3, 0, 8])
  source = IterableSource(batches, SourceOptions("mask"))
  assert IterableSource.accepts(batches) and not IterableSource.accepts(data)
  assert not IterableSource.accepts("abc")
  assert source.spec is None and source.num_rows() == 11
  assert [rows for _, rows in source.chunks()] == [3, 0, 8]
  assert_same_rows(concatenated(source.chunks()), data)
  assert IterableSource(iter(batches), SourceOptions("mask")).num_rows() is None


def test_iterable_source_one_shot_is_read_once():
  data = dataset(5)
  source = IterableSource((b for b in split(data, [2, 3])), SourceOptions("mask"))
  assert_same_rows(concatenated(source.chunks()), data)
  with pytest.raises(
    ValueError, match=r"^source is a one-shot iterator \(generator\) and was already read"
  ):
    source.chunks()


def test_iterable_source_checks_each_batch_against_the_first():
  batches = [{"x": np.zeros((2, 3))}, {"x": np.zeros((2, 3))}, {"x": np.zeros((1, 4))}]
  chunks = IterableSource(batches, SourceOptions("mask")).chunks()
  next(chunks), next(chunks)
  with pytest.raises(
    ValueError,
    match=r"^batch 2: key 'x' has shape \(1, 4\); expected \[rows, 3\] like batch 0\. .*"
    r"pad_shapes=\{'x': \(4,\)\}",
  ):
    next(chunks)
