"""pad_batches over numpy Mappings and iterables of batches, against an independent numpy expectation."""

import math

import jax
import numpy as np
import pytest
from _padding_reference import assert_batches_equal, expected_batches
from hypothesis import given, settings
from hypothesis import strategies as st

import padded_eval as pe


def dataset(n, seed=0):
  rng = np.random.default_rng(seed)
  return {
    "x": rng.normal(size=(n, 3)).astype(np.float32),
    "label": rng.integers(0, 10, size=n).astype(np.int32),
    "flag": rng.random(n) < 0.5,
  }


def split(data, sizes):
  """A list of batches with the given leading sizes (they must sum to the dataset's size)."""
  bounds = np.cumsum([0] + list(sizes))
  return [{k: v[a:b] for k, v in data.items()} for a, b in zip(bounds[:-1], bounds[1:])]


# ---- whole-dataset Mappings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "n, batch_size", [(0, 4), (1, 4), (3, 4), (4, 4), (8, 4), (10, 4), (17, 8), (5, 16)]
)
def test_mapping_matches_reference(n, batch_size):
  data = dataset(n)
  got = pe.pad_batches(data, batch_size, num_devices=2)
  assert_batches_equal(got, expected_batches(data, batch_size))
  assert len(got) == math.ceil(n / batch_size)


@pytest.mark.parametrize("pad", [np.nan, -999.0, 1e30])
def test_float_pad_values_fill_padded_rows(pad):
  data = {"x": np.arange(10, dtype=np.float32)}
  got = list(pe.pad_batches(data, 4, num_devices=1, pad_value=pad))
  assert_batches_equal(got, expected_batches(data, 4, pad=np.float32(pad)))
  np.testing.assert_array_equal(got[-1]["x"][2:], np.float32(pad))


def test_per_key_and_nested_pad_values():
  data = {"a": {"x": np.ones((5, 2)), "y": np.ones(5, np.int64)}, "label": np.arange(5)}
  pad_value = {"a": {"x": np.nan}, "label": -1}  # "a/y" is missing: pads with 0
  (_, last) = pe.pad_batches(data, 4, num_devices=1, pad_value=pad_value)
  assert np.isnan(last["a"]["x"][1:]).all() and last["a"]["x"][0].tolist() == [1.0, 1.0]
  assert last["a"]["y"].tolist() == [1, 0, 0, 0]
  assert last["label"].tolist() == [4, -1, -1, -1]
  assert last["mask"].tolist() == [True, False, False, False]
  (_, last) = pe.pad_batches(data, 4, num_devices=1, pad_value={"a": 7})  # a group gets one value
  assert last["a"]["x"][1:].tolist() == [[7.0, 7.0]] * 3 and last["a"]["y"].tolist() == [1, 7, 7, 7]


def test_nested_dicts_keep_structure():
  data = {
    "features": {"image": np.arange(12.0).reshape(6, 2), "meta": {"id": np.arange(6)}},
    "y": np.arange(6),
  }
  batches = list(pe.pad_batches(data, 4, num_devices=2))
  assert [sorted(b) for b in batches] == [["features", "mask", "y"]] * 2
  assert batches[1]["features"]["meta"]["id"].tolist() == [4, 5, 0, 0]
  assert batches[1]["features"]["image"].tolist() == [
    [8.0, 9.0],
    [10.0, 11.0],
    [0.0, 0.0],
    [0.0, 0.0],
  ]


def test_strings_and_bytes_pad_with_empty():
  data = {
    "text": np.array(["a", "bb", "ccc"]),
    "raw": np.array([b"x", b"yy", b"z"]),
    "n": np.arange(3),
  }
  got = list(pe.pad_batches(data, 2, num_devices=1, pad_value=-1))
  assert got[1]["text"].tolist() == ["ccc", ""]
  assert got[1]["raw"].tolist() == [b"z", b""]
  assert got[1]["n"].tolist() == [2, -1]
  objects = {"s": np.array([b"p", b"q", b"r"], dtype=object)}
  assert list(pe.pad_batches(objects, 2, num_devices=1))[1]["s"].tolist() == [b"r", b""]


def test_custom_mask_key():
  (batch,) = pe.pad_batches({"mask": np.arange(3)}, 4, num_devices=1, mask_key="valid")
  assert batch["valid"].tolist() == [True, True, True, False] and batch["mask"].tolist() == [
    0,
    1,
    2,
    0,
  ]


def test_leaves_become_numpy():
  data = {"x": jax.numpy.arange(5), "y": [1, 2, 3, 4, 5]}
  for batch in pe.pad_batches(data, 4, num_devices=1):
    assert all(isinstance(leaf, np.ndarray) for leaf in batch.values())


# ---- num_batches, len, empty sources ---------------------------------------------------------------------------


def test_num_batches_appends_all_padding_batches():
  data = dataset(5)
  pad = {"x": -3.0, "label": -3}  # "flag" pads with False
  got = pe.pad_batches(data, 4, num_devices=1, num_batches=4, pad_value=pad)
  assert_batches_equal(got, expected_batches(data, 4, pad=dict(pad, flag=False), num_batches=4))
  assert len(got) == 4
  assert [b["mask"].any() for b in got] == [True, True, False, False]


def test_num_batches_too_small_raises():
  with pytest.raises(ValueError, match=r"num_batches=2 but the source holds 3 batches"):
    pe.pad_batches(dataset(9), 4, num_devices=1, num_batches=2)
  batches = (b for b in split(dataset(9), [4, 5]))
  padded = pe.pad_batches(batches, 4, num_devices=1, num_batches=2)
  with pytest.raises(ValueError, match=r"more than num_batches=2"):
    list(padded)


def test_empty_sources():
  data = dataset(0)
  assert list(pe.pad_batches(data, 4, num_devices=1)) == []
  with pytest.raises(ValueError, match="already consumed \\(or empty\\)"):  # issue 33: said at once
    pe.pad_batches(iter([]), 4, num_devices=1)
  assert list(pe.pad_batches([data], 4, num_devices=1)) == []
  got = list(pe.pad_batches(data, 4, num_devices=1, num_batches=2))
  assert_batches_equal(got, expected_batches(data, 4, num_batches=2))
  assert got[0]["x"].shape == (4, 3) and got[0]["x"].dtype == np.float32
  with pytest.raises(ValueError, match="source was empty and its fields are unknown"):
    list(pe.pad_batches([], 4, num_devices=1, num_batches=1))


def test_len():
  assert len(pe.pad_batches(dataset(9), 4, num_devices=1)) == 3
  assert len(pe.pad_batches(dataset(9), 4, num_devices=1, num_batches=5)) == 5
  assert len(pe.pad_batches(split(dataset(9), [2, 3, 4]), 4, num_devices=1)) == 3
  with pytest.raises(TypeError, match="unknown"):
    len(pe.pad_batches(iter(split(dataset(9), [9])), 4, num_devices=1))

  class Sized:  # __len__ counts batches of unknown sizes: the number of padded batches is unknown
    def __iter__(self):
      return iter(split(dataset(9), [9]))

    def __len__(self):
      return 1

  with pytest.raises(TypeError, match="unknown"):
    len(pe.pad_batches(Sized(), 4, num_devices=1))
  assert (
    len(
      pe.pad_batches(iter([{"x": np.zeros((0, 3), np.float32)}]), 4, num_devices=1, num_batches=2)
    )
    == 2
  )


def test_reiteration_rereads_the_source():
  data = dataset(10)
  for source in (data, split(data, [3, 7])):
    padded = pe.pad_batches(source, 4, num_devices=2)
    assert_batches_equal(list(padded), expected_batches(data, 4))
    assert_batches_equal(list(padded), expected_batches(data, 4))
  once = pe.pad_batches(iter(split(data, [10])), 4, num_devices=2)
  assert_batches_equal(list(once), expected_batches(data, 4))


def test_reiterating_a_one_shot_source_raises():  # issue 12: it used to yield nothing, silently
  data = dataset(10)

  def generator():
    yield from split(data, [3, 7])

  for one_shot, num_batches in ((generator(), 3), (iter(split(data, [3, 7])), 3)):
    padded = pe.pad_batches(one_shot, 4, num_devices=2, num_batches=num_batches)
    assert len(list(padded)) == num_batches
    with pytest.raises(
      ValueError,
      match=r"^source is a one-shot iterator \((generator|list_iterator)\).*a list of batches",
    ):
      list(padded)
  partly = pe.pad_batches(
    generator(), 4, num_devices=2
  )  # a second read after a partial one also raises
  next(iter(partly))
  with pytest.raises(ValueError, match="one-shot iterator"):
    iter(partly).__next__()
  source = split(data, [3, 7])  # re-iterable sources are read again
  padded = pe.pad_batches(source, 4, num_devices=2)
  assert_batches_equal(list(padded), expected_batches(data, 4))
  assert_batches_equal(list(padded), expected_batches(data, 4))


# ---- re-chunking and no-copy passthrough -----------------------------------------------------------------------


@pytest.mark.parametrize(
  "sizes", [[4, 4, 4], [3, 5, 4], [1, 1, 1, 1, 8], [12], [0, 6, 0, 6], [11, 1], [2, 9]]
)
def test_iterable_rechunks_in_order(sizes):
  data = dataset(sum(sizes), seed=len(sizes))
  assert_batches_equal(
    pe.pad_batches(split(data, sizes), 4, num_devices=4), expected_batches(data, 4)
  )


def test_aligned_full_batches_pass_through_without_copy():
  data = dataset(12)
  source = split(data, [4, 4, 4])
  for given_batch, batch in zip(source, pe.pad_batches(source, 4, num_devices=1)):
    for key in data:
      assert batch[key] is given_batch[key]
    assert batch["mask"].all()
  for batch in pe.pad_batches(data, 4, num_devices=1):  # whole-dataset full batches are views
    assert all(np.shares_memory(batch[k], data[k]) for k in data)
  source = split(
    data, [2, 6, 4]
  )  # realigned after the first two batches: the last is passed through again
  batches = list(pe.pad_batches(source, 4, num_devices=1))
  assert not np.shares_memory(batches[0]["x"], data["x"])
  assert np.shares_memory(batches[2]["x"], source[2]["x"])


def test_remainders_are_copied_before_the_source_reuses_its_buffer():
  def reused_buffer():
    buffer = np.zeros(3, np.int64)
    for start in (0, 3, 6):
      buffer[:] = np.arange(start, start + 3)
      yield {"x": buffer}

  got = [b["x"].tolist() for b in pe.pad_batches(reused_buffer(), 2, num_devices=1)]
  assert got == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 0]]


@settings(max_examples=40, deadline=None)
@given(
  sizes=st.lists(st.integers(0, 9), min_size=1, max_size=8),
  batch_size=st.sampled_from([1, 2, 4, 8]),
  extra=st.integers(0, 2),
)
def test_property_real_rows_concatenate_to_the_source(sizes, batch_size, extra):
  data = {
    "x": np.arange(sum(sizes), dtype=np.int64),
    "y": {"z": np.arange(sum(sizes) * 2).reshape(-1, 2)},
  }
  num_batches = math.ceil(sum(sizes) / batch_size) + extra
  batches = list(
    pe.pad_batches(
      split_nested(data, sizes), batch_size, num_devices=1, pad_value=-1, num_batches=num_batches
    )
  )
  assert len(batches) == num_batches
  assert all(b["x"].shape == (batch_size,) and b["mask"].shape == (batch_size,) for b in batches)
  masks = [b["mask"] for b in batches]
  assert all(m.tolist() == sorted(m.tolist(), reverse=True) for m in masks)  # real rows first
  real_x = np.concatenate([b["x"][b["mask"]] for b in batches] + [np.zeros(0, np.int64)])
  real_z = np.concatenate([b["y"]["z"][b["mask"]] for b in batches] + [np.zeros((0, 2), np.int64)])
  np.testing.assert_array_equal(real_x, data["x"])
  np.testing.assert_array_equal(real_z, data["y"]["z"])
  assert all((b["x"][~b["mask"]] == -1).all() for b in batches)


def split_nested(data, sizes):
  bounds = np.cumsum([0] + list(sizes))
  return [
    {"x": data["x"][a:b], "y": {"z": data["y"]["z"][a:b]}} for a, b in zip(bounds[:-1], bounds[1:])
  ]


# ---- bad input -------------------------------------------------------------------------------------------------


def test_batch_size_must_divide_over_devices():
  with pytest.raises(
    ValueError, match=r"^batch_size 12 is not divisible by 8 devices; use a multiple, e.g. 8 or 16$"
  ):
    pe.pad_batches(dataset(4), 12, num_devices=8)
  with pytest.raises(
    ValueError, match=r"^batch_size 4 is not divisible by 8 devices; use a multiple, e.g. 8 or 16$"
  ):
    pe.pad_batches(dataset(4), 4, num_devices=8)
  assert jax.local_device_count() == 8  # the default, read at call time
  with pytest.raises(
    ValueError, match=r"^batch_size 12 is not divisible by 8 devices; use a multiple, e.g. 8 or 16$"
  ):
    pe.pad_batches(dataset(4), 12)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(batch_size=0), "batch_size must be an int >= 1; got 0"),
    (dict(batch_size=2.0), "batch_size must be an int >= 1; got 2.0"),
    (dict(batch_size=4, num_devices=0), "num_devices must be an int >= 1; got 0"),
    (dict(batch_size=4, num_batches=-1), "num_batches must be an int >= 0; got -1"),
  ],
)
def test_bad_arguments(kwargs, match):
  kwargs.setdefault("num_devices", 1)
  with pytest.raises(ValueError, match=match):
    pe.pad_batches(dataset(4), **kwargs)


def test_leading_sizes_disagree():
  with pytest.raises(
    ValueError, match=r"the source: leading sizes disagree \('x' has 5, 'y' has 4\)"
  ):
    pe.pad_batches({"x": np.zeros(5), "y": np.zeros(4)}, 4, num_devices=1)
  batches = [
    {"a": {"x": np.zeros(4)}, "y": np.zeros(4)},
    {"a": {"x": np.zeros(3)}, "y": np.zeros(2)},
  ]
  with pytest.raises(
    ValueError, match=r"batch 1: leading sizes disagree \('a/x' has 3, 'y' has 2\)"
  ):
    list(pe.pad_batches(batches, 4, num_devices=1))


def test_source_key_equal_to_mask_key():
  with pytest.raises(ValueError, match=r"the source has a key 'mask' equal to mask_key"):
    pe.pad_batches({"mask": np.zeros(4), "x": np.zeros(4)}, 4, num_devices=1)
  with pytest.raises(ValueError, match=r"batch 0 has a key 'valid' equal to mask_key"):
    list(pe.pad_batches([{"valid": np.zeros(4)}], 4, num_devices=1, mask_key="valid"))


@pytest.mark.parametrize(
  "second, match",
  [
    (
      {"x": np.zeros((2, 3)), "z": np.zeros(2)},
      r"batch 1: keys changed: missing \['y'\], unexpected \['z'\]",
    ),
    ({"x": np.zeros((2, 3))}, r"batch 1: keys changed: missing \['y'\], unexpected \[\]"),
    (
      {"x": np.zeros((2, 4)), "y": np.zeros(2)},
      r"batch 1: key 'x' has shape \(2, 4\); expected \[rows, 3\]",
    ),
    (
      {"x": np.zeros((2, 3)), "y": np.zeros(2, np.int32)},
      r"batch 1: key 'y' has dtype int32; expected float64",
    ),
  ],
)
def test_structure_changing_between_batches(second, match):
  first = {"x": np.zeros((2, 3)), "y": np.zeros(2)}
  with pytest.raises(ValueError, match=match):
    list(pe.pad_batches([first, second], 4, num_devices=1))


def test_other_bad_sources():
  with pytest.raises(ValueError, match=r"batch 1: expected a Mapping of arrays, got tuple"):
    list(pe.pad_batches([{"x": np.zeros(2)}, (np.zeros(2),)], 4, num_devices=1))
  with pytest.raises(
    ValueError, match=r"key 'x' is a scalar; expected an array with a leading row dimension"
  ):
    pe.pad_batches({"x": 3.0}, 4, num_devices=1)
  with pytest.raises(ValueError, match="at least one array"):
    pe.pad_batches({}, 4, num_devices=1)
  with pytest.raises(TypeError, match="got int"):
    pe.pad_batches(3, 4, num_devices=1)


@pytest.mark.parametrize(
  "make",
  [lambda d: d, lambda d: [{k: v[:3] for k, v in d.items()}, {k: v[3:] for k, v in d.items()}]],
)
def test_a_masked_array_with_masked_entries_is_refused(make):
  """numpy reads a masked array's data and drops its mask: its masked entries would be real rows'
  values, silently. With entries masked, a ValueError names the key and the count; with none
  masked, the array is read as its data."""
  x = np.ma.masked_array(np.arange(5.0), mask=[0, 1, 1, 0, 0])
  with pytest.raises(
    ValueError, match=r"key 'x' is a numpy masked array with 2 masked entries.*x.filled\("
  ):
    list(pe.pad_batches(make({"x": x, "y": np.arange(5)}), 4, num_devices=1))
  unmasked = np.ma.masked_array(np.arange(5.0), mask=False)
  got = list(pe.pad_batches(make({"x": unmasked, "y": np.arange(5)}), 4, num_devices=1))
  want = expected_batches({"x": np.arange(5.0), "y": np.arange(5)}, 4)
  assert_batches_equal([{k: np.asarray(v) for k, v in b.items()} for b in got], want)


@pytest.mark.parametrize(
  "leaf, what",
  [(None, "None"), (object(), "an object"), ({1, 2}, "a set"), (pytest, "a module")],
)
def test_a_leaf_that_is_not_an_array_says_what_it_is(leaf, what):
  with pytest.raises(ValueError, match=rf"key 'y' holds {what}, not an array"):
    pe.pad_batches({"x": np.arange(5), "y": leaf}, 4, num_devices=1)


def test_ragged_lists_name_the_key_and_suggest_pad_shapes():  # issue 26: numpy's error named no key
  ragged = {"tokens": [[1, 2, 3], [4], [5, 6]], "label": [0, 1, 0]}
  hint = r"key 'tokens' holds ragged rows \(row 0 has shape \(3,\), row 1 has shape \(1,\)\).*pad_shapes=\{'tokens': \(3,\)\}"
  with pytest.raises(
    ValueError, match="the source: " + hint + r".*pe.pad_batches\(\[data\], \.\.\."
  ):
    pe.pad_batches(ragged, 4, num_devices=1)
  batches = [{"tokens": np.ones((3, 3)), "label": np.zeros(3)}, ragged]
  with pytest.raises(ValueError, match="batch 1: " + hint):
    list(pe.pad_batches(batches, 4, num_devices=1))
  with pytest.raises(ValueError, match="batch 1: " + hint):
    len(
      pe.pad_batches(batches, 4, num_devices=1)
    )  # the rows of a list of batches are counted first
  nested = {"f": {"tokens": [np.ones(2), np.ones(5)]}, "label": [0, 1]}
  with pytest.raises(
    ValueError, match=r"key 'f/tokens' .*pad_shapes=\{'f': \{'tokens': \(5,\)\}\}"
  ):
    pe.pad_batches(nested, 4, num_devices=1)
  with pytest.raises(ValueError, match=r"key 'tokens' holds rows of different shapes or ranks"):
    pe.pad_batches({"tokens": [[1, 2], 3]}, 4, num_devices=1)
  fixed = pe.pad_batches([ragged], 4, num_devices=1, pad_shapes={"tokens": (3,)}, pad_value=-1)
  assert [b["tokens"].tolist() for b in fixed] == [[[1, 2, 3], [4, -1, -1], [5, 6, -1], [-1] * 3]]


@pytest.mark.parametrize(
  "pad_value, match",
  [
    (np.nan, r"pad_value nan for key 'label' does not fit dtype int32"),
    (-1, r"pad_value -1 for key 'flag' is not exactly representable in dtype bool"),
    (1.5, r"pad_value 1.5 for key 'label' is not exactly representable in dtype int32"),
    ({"label": 2**40}, r"pad_value 1099511627776 for key 'label' does not fit dtype int32"),
    ({"label": "?"}, r"pad_value '\?' for key 'label' is a string"),
    ({"lable": -1}, r"pad_value has key 'lable', which the source does not have"),
    ({"label": {"a": 1}}, r"pad_value has key 'label/a', which the source does not have"),
    (  # issue 26: these padded with inf
      {"half": 1e10},
      r"pad_value 10000000000.0 for key 'half' overflows dtype float16 \(largest finite 65504\) and would "
      r"pad with inf; pass a value within the dtype's range",
    ),
    ({"x": 1e39}, r"pad_value 1e\+39 for key 'x' overflows dtype float32"),
    # not scalars: these raised numpy's "truth value ... ambiguous", or padded with the list's value
    ([1, 2], r"pad_value \[1, 2\] for key 'x' is not a scalar \(shape \(2,\)\); expected a scalar"),
    ({"label": [7]}, r"pad_value \[7\] for key 'label' is not a scalar"),
    ({"x": np.array([1.0, 2.0])}, r"pad_value array\(\[1\., 2\.\]\) for key 'x' is not a scalar"),
  ],
)
def test_bad_pad_values(pad_value, match):
  with pytest.raises(ValueError, match=match):
    data = {
      "x": np.zeros(3, np.float32),
      "label": np.zeros(3, np.int32),
      "flag": np.zeros(3, bool),
      "half": np.zeros(3, np.float16),
    }
    list(pe.pad_batches(data, 4, num_devices=1, pad_value=pad_value))


@pytest.mark.parametrize("pad", [np.inf, -np.inf, np.nan, 65504.0, -1e4])
def test_float16_pads_with_any_value_it_holds(pad):
  got = list(
    pe.pad_batches({"half": np.arange(3, dtype=np.float16)}, 4, num_devices=1, pad_value=pad)
  )
  np.testing.assert_array_equal(got[0]["half"], np.array([0, 1, 2, pad], np.float16))


@pytest.mark.parametrize(
  "source, match",
  [  # issue 26: accepted at the call, and failing only when iterated
    (
      np.arange(5),
      r"source is an array \(ndarray of shape \(5,\)\), not named fields; expected a dict",
    ),
    (jax.numpy.zeros((4, 2)), r"source is an array \(\w+ of shape \(4, 2\)\)"),
    ([np.zeros(3), np.ones(3)], r"source is a list whose element 0 is a ndarray; expected a dict"),
    (
      [(np.zeros(3), np.ones(3))],
      r"element 0 is a tuple of 2 values; .*\[\{'image': x, 'label': y\}, \.\.\.\]",
    ),
  ],
)
def test_sources_that_are_not_named_fields_are_refused_at_the_call(source, match):
  with pytest.raises(ValueError, match=match):
    pe.pad_batches(source, 4, num_devices=1)


@pytest.mark.parametrize("mask_key", [None, "", 3])
def test_mask_key_must_be_a_non_empty_string(mask_key):  # issue 26: None became the mask's key
  with pytest.raises(
    ValueError, match=rf"^mask_key must be a non-empty string.*; got {mask_key!r}$"
  ):
    pe.pad_batches(dataset(3), 4, num_devices=1, mask_key=mask_key)


def test_docstring_example():
  import doctest

  import padded_eval.data.padded

  result = doctest.testmod(padded_eval.data.padded)
  assert result.attempted > 0 and result.failed == 0


def test_a_list_pad_value_is_refused_not_spread_over_a_row():
  data = {"x": np.arange(6, dtype=np.float32).reshape(3, 2)}
  with pytest.raises(ValueError, match=r"pad_value \[1.0, 2.0\] for key 'x' is not a scalar"):
    list(pe.pad_batches(data, 4, num_devices=1, pad_value=[1.0, 2.0]))


def test_an_object_column_of_str_pads_with_str_and_one_of_bytes_with_bytes():
  """Before, an object array of Python str (a list of texts, a pandas column) padded with ``b''``:
  the column mixed str and bytes and ``" ".join`` raised TypeError."""
  for texts, empty in (
    (np.array(["alpha", "beta", "gamma"], dtype=object), ""),
    (np.array([b"alpha", b"beta", b"gamma"], dtype=object), b""),
  ):
    batch = next(iter(pe.pad_batches({"s": texts, "y": np.arange(3)}, 8, num_devices=8)))
    assert batch["s"].tolist() == [*texts.tolist(), *[empty] * 5]
    assert {type(value) for value in batch["s"]} == {type(empty)}


# ---- nothing is written onto the user's objects (DESIGN, "A leaner house") ------------------------------------


def _held(obj):
  """What ``obj`` holds, by identity: a Mapping's or list's items, else its attributes (``vars``)."""
  if isinstance(obj, dict):
    return {key: id(value) for key, value in obj.items()}
  if isinstance(obj, list):
    return [_held(item) for item in obj]
  return {key: id(value) for key, value in vars(obj).items()}


def _user_sources():
  """``{kind: (make the source, pad_batches keywords)}``: 21 rows of ``x`` in every kind."""
  import grain
  import pandas as pd
  import tensorflow as tf
  from datasets import Dataset

  data = dataset(21)
  columns = {"x": data["x"][:, 0], "label": data["label"]}
  return {
    "mapping": (lambda: dict(columns), {}),
    "list": (lambda: split(columns, [5, 9, 7]), {}),
    "tf.data tuples": (
      lambda: tf.data.Dataset.from_tensor_slices((columns["x"], columns["label"])),
      {"keys": ("x", "label")},
    ),
    "tf.data batched": (lambda: tf.data.Dataset.from_tensor_slices(columns).batch(5), {}),
    "grain": (lambda: grain.MapDataset.source([{"x": x} for x in columns["x"]]), {}),
    "hugging face": (lambda: Dataset.from_dict(columns), {}),
    "dataframe": (lambda: pd.DataFrame(columns), {}),
  }


@pytest.mark.parametrize("kind", sorted(_user_sources()))
def test_nothing_is_written_onto_the_sources_and_params_passed(kind):
  make, options = _user_sources()[kind]
  source, params = make(), {"w": np.float32(2.0)}
  list(source)  # what the library sets on its own object when read (grain's statistics) is set
  before, params_before = _held(source), _held(params)
  list(source)  # and what it replaces at every read (grain's `_stats`) is compared by name only
  replaced = (
    set() if isinstance(before, list) else {k for k, v in _held(source).items() if before[k] != v}
  )

  def step(params, batch):
    return pe.metrics.Mean().update(values=batch["x"] * params["w"], mask=batch["mask"])

  for backend in ("jit", "pmap"):
    got = pe.masked_eval(step, params, pe.pad_batches(source, 8, **options), backend=backend)
    assert got["num_examples"] == 21
  if kind == "tf.data batched":
    list(pe.pad_batches(source, None, num_devices=1))  # the first batch's rows, kept
  after = _held(source)
  if isinstance(after, dict):
    assert after.keys() == before.keys(), f"{kind}: {sorted(after.keys() ^ before.keys())}"
    after, before = ({k: v for k, v in d.items() if k not in replaced} for d in (after, before))
  assert after == before, kind
  assert _held(params) == params_before
