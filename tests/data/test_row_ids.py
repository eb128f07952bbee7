"""pad_batches(..., index_key=, index_offset=): int32 row ids for every source kind.

The reference is index arithmetic, independent of the code: the real rows' ids, read through the mask in batch
order, are ``arange(N) + offset``; every padding row's id is -1; and each id names the row it sits on (the data
carries its own position in a column the ids are checked against).
"""

import numpy as np
import pytest

import padded_eval as pe
from padded_eval.data import sources
from padded_eval.data._batch_spec import BatchSpec
from padded_eval.data.sources.base import Source


def dataset(n):
  rng = np.random.default_rng(n)
  return {
    "x": rng.normal(size=(n, 3)).astype(np.float32),
    "meta": {"position": np.arange(n, dtype=np.int64)},  # each row's own position in the source
  }


def ragged(data, seed=0):
  rng = np.random.default_rng(seed)
  n, start, parts = len(data["x"]), 0, []
  while start < n:
    stop = min(n, start + int(rng.integers(0, 9)))
    parts.append(
      {"x": data["x"][start:stop], "meta": {"position": data["meta"]["position"][start:stop]}}
    )
    start = stop
  return parts


class ColumnsSource(Source):
  """A kind that relies on the default `Source.padded` (as new kinds do): columns in chunks of 5 rows."""

  description = "a ColumnsOf"

  @classmethod
  def accepts(cls, obj):
    return type(obj).__name__ == "ColumnsOf"

  def __init__(self, obj, options):
    self._data = obj.data

  @property
  def spec(self):
    return None

  def num_rows(self):
    return len(self._data["x"])

  def chunks(self):
    n = len(self._data["x"])
    for start in range(0, n, 5):
      rows = min(5, n - start)
      yield (
        {
          ("x",): self._data["x"][start : start + rows],
          ("meta", "position"): self._data["meta"]["position"][start : start + rows],
        },
        rows,
      )


class ColumnsOf:
  def __init__(self, data):
    self.data = data


def make_source(kind, data):
  if kind == "mapping":
    return data
  if kind == "list":
    return ragged(data)
  if kind == "generator":
    return iter(ragged(data, seed=1))
  if kind == "registered":
    return ColumnsOf(data)
  import tensorflow as tf

  unbatched = tf.data.Dataset.from_tensor_slices(data)
  if kind == "tf":
    return unbatched
  if kind == "tf_batched":
    return unbatched.batch(7)
  if kind == "tf_filtered":  # unknown cardinality, batched
    return unbatched.filter(lambda row: True).batch(5)
  raise AssertionError(kind)


KINDS = ["mapping", "list", "generator", "registered", "tf", "tf_batched", "tf_filtered"]


@pytest.fixture
def columns_registered():
  sources.register(ColumnsSource)
  yield
  sources.unregister(ColumnsSource)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
  "n,batch_size,offset,extra", [(1, 4, 0, 0), (23, 8, 0, 2), (64, 8, 1000, 1)]
)
def test_ids_are_positions_plus_offset_for_every_source_kind(
  columns_registered, kind, n, batch_size, offset, extra
):
  data = dataset(n)
  num_batches = -(-n // batch_size) + extra
  batches = list(
    pe.pad_batches(
      make_source(kind, data),
      batch_size,
      num_devices=1,
      index_key="index",
      index_offset=offset,
      num_batches=num_batches,
      pad_value={"x": np.nan, "meta": {"position": -99}},
    )
  )
  assert len(batches) == num_batches
  for batch in batches:
    assert batch["index"].dtype == np.int32 and batch["index"].shape == (batch_size,)
    assert np.all(batch["index"][~batch["mask"]] == -1)  # padding rows, all-padding batches too
  ids = np.concatenate([b["index"][b["mask"]] for b in batches])
  np.testing.assert_array_equal(ids, np.arange(n) + offset)
  positions = np.concatenate([b["meta"]["position"][b["mask"]] for b in batches])
  np.testing.assert_array_equal(ids - offset, positions)  # each id names the row it sits on


@pytest.mark.parametrize("kind", ["mapping", "tf"])
def test_empty_source_with_num_batches_gives_only_padding_ids(kind):
  data = dataset(0)
  batches = list(
    pe.pad_batches(make_source(kind, data), 4, num_devices=1, index_key="i", num_batches=2)
  )
  assert [b["i"].tolist() for b in batches] == [[-1] * 4] * 2


def test_without_index_key_batches_have_no_ids():
  batch = next(iter(pe.pad_batches(dataset(3), 4, num_devices=1)))
  assert set(batch) == {"x", "meta", "mask"}


@pytest.mark.parametrize("kind", ["mapping", "list", "tf"])
def test_index_key_taken_by_a_source_key_is_refused(kind):
  data = dataset(5)
  with pytest.raises(
    ValueError, match=r"the source has a key 'meta/position' in the place of index_key='meta'"
  ):
    list(pe.pad_batches(make_source(kind, data), 4, num_devices=1, index_key="meta"))


@pytest.mark.parametrize(
  "kwargs,message",
  [
    ({"index_key": "mask"}, r"index_key 'mask' equals mask_key"),
    ({"index_key": 3}, r"index_key must be a non-empty string or None; got 3"),
    ({"index_key": "i", "index_offset": -1}, r"index_offset must be an int >= 0; got -1"),
    ({"index_key": "i", "index_offset": 1.5}, r"index_offset must be an int >= 0; got 1.5"),
    ({"index_key": ""}, r"index_key must be a non-empty string or None; got ''"),
    # an offset without ids is a no-op: the caller meant to get global ids
    ({"index_offset": 100}, r"index_offset=100 without index_key"),
  ],
)
def test_bad_index_arguments_are_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    pe.pad_batches(dataset(5), 4, num_devices=1, **kwargs)


@pytest.mark.parametrize("kind", ["mapping", "tf"])
def test_ids_beyond_int32_are_refused(kind):
  offset = np.iinfo(np.int32).max - 2  # rows 0..2 fit, row 3 would not
  with pytest.raises(ValueError, match=r"row id 2147483648 does not fit in int32"):
    list(
      pe.pad_batches(
        make_source(kind, dataset(5)), 4, num_devices=1, index_key="i", index_offset=offset
      )
    )


@pytest.mark.parametrize("kind", KINDS)
def test_ids_up_to_the_int32_limit_are_accepted_in_a_short_last_batch(kind, columns_registered):
  # tf.data checked the id of the last padding row (-1 in the batch), and refused these
  offset = np.iinfo(np.int32).max - 5  # rows 0..5 fit: the last real id is the int32 maximum
  data = dataset(6)
  got = pe.pad_batches(
    make_source(kind, data), 4, num_devices=1, index_key="i", index_offset=offset
  )
  ids = np.concatenate([b["i"][b["mask"]] for b in got])
  np.testing.assert_array_equal(ids, offset + data["meta"]["position"])


def test_ids_do_not_change_the_other_leaves():
  data = dataset(13)
  plain = list(pe.pad_batches(data, 4, num_devices=1))
  with_ids = list(pe.pad_batches(data, 4, num_devices=1, index_key="index"))
  for a, b in zip(plain, with_ids, strict=True):
    b = dict(b)
    del b["index"]
    assert BatchSpec.from_batch(a) == BatchSpec.from_batch(b)
    np.testing.assert_array_equal(a["x"], b["x"])
    np.testing.assert_array_equal(a["mask"], b["mask"])
