"""Registering a new source kind (padded_eval/data/sources/registry.py): one class, one line."""

import numpy as np
import pytest
from _padding_reference import assert_batches_equal, expected_batches

import padded_eval as pe
from padded_eval.data import sources
from padded_eval.data._batch_spec import BatchSpec
from padded_eval.data._tree import flatten

# ---- registering a new kind -------------------------------------------------------------------------------------


class Columns:
  """A toy container: named columns, none of the built-in kinds (not a Mapping, not iterable)."""

  def __init__(self, **columns):
    self.columns = columns


class ColumnsSource(sources.Source):  # the whole of a new kind: five short members
  description = "a Columns"

  @classmethod
  def accepts(cls, obj):
    return isinstance(obj, Columns)

  def __init__(self, obj, options):
    self._flat = flatten(obj.columns)

  @property
  def spec(self):
    return BatchSpec.of_rows(self._flat, unknown_rows=True)

  def num_rows(self):
    return len(next(iter(self._flat.values())))

  def chunks(self):
    return iter([(self._flat, self.num_rows())])


@pytest.fixture
def columns_registered():
  sources.register(ColumnsSource)  # the one registration line
  yield
  sources.unregister(ColumnsSource)


def test_a_new_kind_is_one_class_and_one_registration(columns_registered):
  data = {"x": np.arange(6.0), "label": np.arange(6) % 2}
  got = pe.pad_batches(Columns(**data), 4, num_devices=2, pad_value={"x": np.nan}, num_batches=3)
  assert len(got) == 3
  assert_batches_equal(got, expected_batches(data, 4, pad={"x": np.nan, "label": 0}, num_batches=3))
  assert ColumnsSource in sources.kinds()


def test_unregistered_kind_is_refused_with_the_list_of_kinds():
  with pytest.raises(
    TypeError,
    match=r"^source must be a Mapping of arrays, an iterable of Mappings, a tf.data.Dataset, a grain "
    r"dataset or DataLoader, a Hugging Face dataset, a torch DataLoader or a pandas DataFrame; got Columns$",
  ):
    pe.pad_batches(Columns(x=np.arange(3)), 4, num_devices=1)
  with pytest.raises(TypeError, match="subclass of padded_eval.data.sources.Source"):
    sources.register(Columns)
