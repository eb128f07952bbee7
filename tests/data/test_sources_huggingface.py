"""Hugging Face `datasets` sources of pad_batches: Dataset and IterableDataset, formats respected."""

import importlib.util

import datasets
import numpy as np
import pytest
from _padding_reference import assert_batches_equal, expected_batches
from _source_cases import GARBAGE, check_exact, check_padded, make_data, numeric

import padded_eval as pe
from padded_eval.data.sources.base import library_class
from padded_eval.data.sources.huggingface import HuggingFaceSource

N = 37


def hf_dataset(data):
  return datasets.Dataset.from_dict(dict(data))


def test_dataset_every_row_once_in_order_with_len_and_string_padding():
  data = make_data(N)
  source = hf_dataset(data)
  assert source.format["type"] is None  # read with the numpy format of the same columns
  batches = check_padded(source, data, known_len=True)
  last = list(batches)[-1]
  assert last["name"].tolist() == [f"row{i}" for i in range(32, 37)] + [""] * 11
  assert last["x"].dtype == np.float32 and last["label"].dtype == np.int64  # HF's numpy format


def test_iterable_dataset_every_row_once_in_order():
  data = make_data(N)
  source = hf_dataset(data).to_iterable_dataset(num_shards=3)
  assert library_class(source, *HuggingFaceSource.library) == "IterableDataset"
  check_padded(source, data, known_len=False)


@pytest.mark.parametrize("batch_size", [1, 16, 2048])
def test_chunks_are_aligned_or_re_chunked(batch_size):
  data = make_data(N)
  check_padded(hf_dataset(data), data, known_len=True, batch_size=batch_size, num_devices=1)


def test_format_columns_are_respected():
  data = make_data(N)
  chosen = {k: data[k] for k in ("x", "label")}
  for source in (
    hf_dataset(data).with_format("numpy", columns=["x", "label"]),
    hf_dataset(data).select_columns(["x", "label"]),
  ):
    batches = pe.pad_batches(source, 16, num_devices=2, pad_value={"x": np.nan, "label": -7})
    assert_batches_equal(batches, expected_batches(chosen, 16, pad={"x": np.nan, "label": -7}))


TENSOR_FORMATS = ["jax"] + (
  ["torch"] if importlib.util.find_spec("torch") else []
)  # no torch in CI


@pytest.mark.parametrize("form", TENSOR_FORMATS)
def test_tensor_formats_are_respected(form):
  data = numeric(make_data(N))
  source = hf_dataset(data).with_format(form)
  assert type(source[0:2]["x"]).__module__.split(".")[0] in ("jax", "jaxlib", "torch")
  check_padded(source, data, known_len=True)


def test_transforms_are_respected():
  data = numeric(make_data(N))

  def doubled(columns):  # a custom transform: what it returns is what is padded
    return {"y2": 2 * np.asarray(columns["y"], np.float32)}

  want = {"y2": 2 * data["y"]}
  batches = pe.pad_batches(
    hf_dataset(data).with_transform(doubled), 16, num_devices=2, pad_value={"y2": np.nan}
  )
  assert_batches_equal(batches, expected_batches(want, 16, pad={"y2": np.nan}))


def test_iterable_dataset_map_and_format():
  data = numeric(make_data(N))
  source = (
    hf_dataset(data)
    .to_iterable_dataset(num_shards=2)
    .map(lambda row: {"y": row["y"] + 1.0})
    .with_format("numpy")
  )
  want = dict(data, y=(data["y"] + np.float32(1.0)))
  batches = pe.pad_batches(source, 16, num_devices=2, pad_value=GARBAGE)
  got = np.concatenate([b["y"][b["mask"]] for b in batches])
  np.testing.assert_allclose(got, want["y"], rtol=1e-6)  # the map's float arithmetic, row by row


@pytest.mark.parametrize("kind", ["Dataset", "IterableDataset"])
def test_masked_eval_is_exact(kind):
  data = numeric(make_data(N))
  source = hf_dataset(data)
  if kind == "IterableDataset":
    source = source.to_iterable_dataset(num_shards=2)
  check_exact(source, data)


def test_dataset_dict_and_mask_column_are_refused():
  data = make_data(5)
  splits = datasets.DatasetDict({"test": hf_dataset(data), "train": hf_dataset(data)})
  with pytest.raises(
    ValueError, match=r"DatasetDict of splits \['test', 'train'\]; pass one split"
  ):
    pe.pad_batches(splits, 4, num_devices=1)
  with pytest.raises(ValueError, match="has a column 'mask' equal to mask_key"):
    pe.pad_batches(hf_dataset({"mask": np.zeros(3)}), 4, num_devices=1)


def test_a_ragged_column_is_named_ragged_not_strings():  # issue 26: it was "holds strings (object)"
  ds = datasets.Dataset.from_dict({"tokens": [[1, 2, 3], [4], [5, 6]], "label": [0, 1, 0]})
  hint = r"key 'tokens' holds ragged rows \(row 0 has shape \(3,\), row 1 has shape \(1,\)\).*pad_shapes=\{'tokens': \(3,\)\}"
  for source in (ds, ds.to_iterable_dataset()):
    with pytest.raises(ValueError, match="chunk 0 of the dataset: " + hint):
      list(pe.pad_batches(source, 4, num_devices=1))
  column = next(ds.with_format("numpy").iter(batch_size=4))  # read without pad_batches
  batch = {**column, "mask": np.ones(3, bool)}
  step = lambda params, b: pe.metrics.Mean().batch_updates(values=b["label"], mask=b["mask"])
  with pytest.raises(ValueError, match="batch 0: " + hint):
    pe.masked_eval(step, None, [batch], backend="jit")
  padded = pe.pad_batches(ds, 4, num_devices=1, pad_shapes={"tokens": (3,)}, pad_value=-1)
  assert [b["tokens"].tolist() for b in padded] == [[[1, 2, 3], [4, -1, -1], [5, 6, -1], [-1] * 3]]


@pytest.mark.parametrize("iterable", [False, True])
def test_a_struct_column_becomes_a_nested_dict(iterable):
  # the numpy format gives a struct column as an object array of dicts: it came out as such,
  # padded with b'' (or raised an IndexError when it was the only column)
  rng = np.random.default_rng(0)
  ids, scores = rng.integers(0, 100, 5), rng.normal(size=5)
  rows = [{"id": int(i), "score": float(s)} for i, s in zip(ids, scores)]
  for columns in ({"meta": rows}, {"meta": rows, "x": list(range(5))}):
    source = datasets.Dataset.from_dict(columns)
    source = source.to_iterable_dataset() if iterable else source
    batches = list(pe.pad_batches(source, 4, num_devices=1))
    assert all(isinstance(b["meta"], dict) for b in batches)
    meta = {
      key: np.concatenate([b["meta"][key][b["mask"]] for b in batches]) for key in ("id", "score")
    }
    np.testing.assert_array_equal(meta["id"], ids)
    np.testing.assert_array_equal(meta["score"], scores)
    assert (
      batches[1]["meta"]["id"].shape == (4,) and batches[1]["meta"]["id"][1:].tolist() == [0] * 3
    )


def test_iterable_dataset_that_repeats_is_refused_and_repeat_once_is_read_once():  # issue 26
  data = make_data(N)
  iterable = hf_dataset(data).to_iterable_dataset()
  with pytest.raises(
    ValueError, match=r"repeats its rows forever \(.repeat\(None\)\), so the evaluation"
  ):
    pe.pad_batches(iterable.repeat(None), 8, num_devices=1)
  with pytest.raises(ValueError, match=r"repeats its rows 2 times \(.repeat\(2\)\)"):
    pe.pad_batches(iterable.repeat(2).map(lambda row: row), 8, num_devices=1)
  check_padded(iterable.repeat(1), data, known_len=False)
  for inputs, match in (  # in any input of a concatenation: before, counted twice or never ended
    ([iterable, iterable.repeat(2)], r"repeats its rows 2 times"),
    ([iterable.repeat(2), iterable], r"repeats its rows 2 times"),
    ([iterable, iterable.repeat(None)], r"repeats its rows forever"),
  ):
    with pytest.raises(ValueError, match=match):
      pe.pad_batches(datasets.concatenate_datasets(inputs), 8, num_devices=1)


@pytest.mark.parametrize("n,count", [(11, 3), (37, 2), (2, 3)])
def test_contiguous_shards_are_the_process_slices(n, count):
  """The documented multi-host choices take pe.process_slice's rows."""
  source = hf_dataset({"id": np.arange(n)})
  for p in range(count):
    rows = np.arange(n)[pe.process_slice(n, process_index=p, process_count=count)]
    parts = [source.select(rows)]
    if n >= count:  # datasets refuses an empty shard
      parts.append(source.shard(num_shards=count, index=p, contiguous=True))
    for part in parts:
      got = [b["id"][b["mask"]] for b in pe.pad_batches(part, 4, num_devices=1)]
      np.testing.assert_array_equal(np.concatenate(got) if got else [], rows)


def test_rows_read_without_a_python_loop_over_rows(monkeypatch):
  """Reading goes through the dataset's batched reader; the per-row accessor is never called."""
  data = numeric(make_data(N))
  source = hf_dataset(data)

  def no_rows(*args, **kwargs):
    raise AssertionError("a row was read on its own")

  monkeypatch.setattr(datasets.Dataset, "__iter__", no_rows)
  check_padded(source, data, known_len=True)
  assert HuggingFaceSource.accepts(source) and not HuggingFaceSource.accepts(data)
