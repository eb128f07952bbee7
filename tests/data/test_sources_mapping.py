"""MappingSource (padded_eval/data/sources/mapping.py): a whole dataset held as a Mapping of arrays."""

import numpy as np
import pytest
from _source_rows import assert_same_rows, concatenated, dataset

from padded_eval.data._batch_spec import BatchSpec, LeafSpec
from padded_eval.data.sources.base import SourceOptions
from padded_eval.data.sources.mapping import MappingSource

# ---- whole-dataset Mapping --------------------------------------------------------------------------------------


def test_mapping_source():
  data = dataset(7)
  source = MappingSource(data, SourceOptions("mask"))
  assert MappingSource.accepts(data) and not MappingSource.accepts([data])
  assert source.num_rows() == 7
  assert source.spec == BatchSpec(
    {
      ("x",): LeafSpec((2,), np.dtype(np.float32)),
      ("y", "id"): LeafSpec((), np.dtype(np.int64)),
    }
  )
  assert_same_rows(concatenated(source.chunks()), data)
  assert_same_rows(concatenated(source.chunks()), data)  # re-read
  with pytest.raises(ValueError, match=r"^the source has a key 'mask' equal to mask_key"):
    MappingSource({"mask": np.zeros(3)}, SourceOptions("mask"))
