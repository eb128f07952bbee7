"""Data sources of `pad_batches`: one module per kind, each registered here with one line.

A kind is a `Source` subclass (see `base.py`); kinds registered later are tried first. To add one, write a module
with the subclass and add its `register(...)` line below (docs/architecture.md, "Adding a source").
"""

from padded_eval.data.sources import (
  dataframe,
  grain,
  huggingface,
  iterable,
  mapping,
  tf_data,
  torch,
)
from padded_eval.data.sources.base import Chunk as Chunk
from padded_eval.data.sources.base import Padding as Padding
from padded_eval.data.sources.base import RowIds as RowIds
from padded_eval.data.sources.base import Source as Source
from padded_eval.data.sources.base import SourceOptions as SourceOptions
from padded_eval.data.sources.base import check_index_key as check_index_key
from padded_eval.data.sources.base import row_ids as row_ids
from padded_eval.data.sources.registry import kinds as kinds
from padded_eval.data.sources.registry import open_source as open_source
from padded_eval.data.sources.registry import register as register
from padded_eval.data.sources.registry import unregister as unregister

register(mapping.MappingSource)
register(iterable.IterableSource)
register(tf_data.TfDataSource)
register(grain.GrainSource)
register(huggingface.HuggingFaceSource)
register(torch.TorchLoaderSource)
register(
  dataframe.DataFrameSource
)  # tried before the iterables (a DataFrame iterates its column names)
