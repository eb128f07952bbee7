"""BatchSpec: the one spec of a batch's structure, shapes and dtypes (data, driver and multi-host code)."""

import collections
import json

import jax
import numpy as np
import pytest

import padded_eval as pe
from padded_eval.data._batch_spec import BatchSpec, LeafSpec
from padded_eval.data._tree import Index, flatten, unflatten
from padded_eval.data.sources.base import flatten_rows


def padded(batch_size=8, features=3, label_dtype=np.int32, **extra):
  rng = np.random.default_rng(batch_size)
  batch = {
    "x": rng.normal(size=(batch_size, features)).astype(np.float32),
    "meta": {"label": np.arange(batch_size, dtype=label_dtype)},
    "mask": np.arange(batch_size) < batch_size - 1,
  }
  batch.update(extra)
  return batch


# ---- building from a padded batch -------------------------------------------------------------------------------


def test_from_batch_records_rows_shapes_and_dtypes_without_the_mask():
  spec = BatchSpec.from_batch(padded())
  assert spec.batch_size == 8 and spec.mask_key == "mask"
  assert spec.leaves == {
    ("x",): LeafSpec((3,), np.dtype(np.float32)),
    ("meta", "label"): LeafSpec((), np.dtype(np.int32)),
  }
  tupled = {"pair": (np.zeros((4, 2)), np.ones(4, bool)), "valid": np.ones(4, bool)}
  spec = BatchSpec.from_batch(tupled, mask_key="valid")  # any pytree below the dict
  assert sorted(spec.leaves) == [("pair", Index(0)), ("pair", Index(1))]  # a tuple's positions
  assert BatchSpec.from_batch(jax.tree.map(jax.numpy.asarray, padded())) == BatchSpec.from_batch(
    padded()
  )


@pytest.mark.parametrize(
  "batch, match",
  [
    ([np.zeros(8)], r"^batch 0 is a list; expected a dict of arrays with a 'mask' entry"),
    ({"x": np.zeros(8)}, r"^batch 0 has no mask key 'mask'; got keys \['x'\]"),
    (
      {"x": np.zeros(8), "mask": np.ones(8, np.int64)},
      r"^batch 0: 'mask' has shape \(8,\) and dtype int64; expected a bool array \[batch_size\]",
    ),
    (
      {"x": np.zeros(8), "mask": np.ones((8, 1), bool)},
      r"'mask' has shape \(8, 1\) and dtype bool; expected a bool array",
    ),
    (
      {"a": {"x": np.zeros(6)}, "mask": np.ones(8, bool)},
      r"^batch 0: key 'a/x' has shape \(6,\); expected leading size 8, the size of 'mask'",
    ),
    (
      {"s": np.array(["a"] * 8), "mask": np.ones(8, bool)},
      r"^batch 0: key 's' holds strings \(<U1\), which cannot be placed on a device",
    ),
  ],
)
def test_from_batch_refuses_what_cannot_be_evaluated(batch, match):
  with pytest.raises(ValueError, match=match):
    BatchSpec.from_batch(batch)


def test_strings_allowed_on_request():
  batch = {"s": np.array([b"a"] * 4, dtype=object), "mask": np.ones(4, bool)}
  assert BatchSpec.from_batch(batch, allow_strings=True).leaves[("s",)].dtype == np.dtype(object)


# ---- checking later batches against the first -------------------------------------------------------------------


def test_check_accepts_an_equal_batch_whatever_its_key_order():
  first = BatchSpec.from_batch(padded())
  reordered = dict(reversed(list(padded().items())))
  assert first.check(reordered, 5) == first


@pytest.mark.parametrize(
  "later, match",
  [
    (
      padded(
        batch_size=24
      ),  # the driver's existing test: batch 1 has ... (24, 3) ... the first batch's
      r"^batch 1 has batch size 24 \(keys 'meta/label': \(24,\), 'x': \(24, 3\)\); expected the first "
      r"batch's 8 rows \('meta/label': \(8,\), 'x': \(8, 3\)\)\. Every batch needs the same shapes",
    ),
    (
      {k: v for k, v in padded().items() if k != "meta"} | {"y": np.zeros(8)},
      r"^batch 1: keys changed: missing \['meta/label'\], unexpected \['y'\]; expected the keys of batch "
      r"0: \['meta/label', 'x'\]\. Every batch needs",
    ),
    (
      padded(features=4),
      r"^batch 1: key 'x' has shape \(8, 4\); expected \[8, 3\] like batch 0\. Its trailing sizes vary "
      r"between batches .*pe\.pad_batches\(\.\.\., pad_shapes=\{'x': \(4,\)\}\)",
    ),
    (
      padded(label_dtype=np.int64),
      r"^batch 1: key 'meta/label' has dtype int64; expected int32 like batch 0\. Every batch needs",
    ),
  ],
)
def test_check_names_what_changed(later, match):
  with pytest.raises(ValueError, match=match):
    BatchSpec.from_batch(padded()).check(later, 1)


def test_rows_specs_compare_without_row_counts():
  first = BatchSpec.of_rows(flatten({"x": np.zeros((2, 3)), "s": np.array(["ab", "c"])}))
  first.check_same(
    BatchSpec.of_rows(flatten({"x": np.zeros((5, 3)), "s": np.array(["abcd"] * 5)})), 1
  )
  with pytest.raises(
    ValueError,
    match=r"^batch 2: key 'x' has shape \(5, 2\); expected \[rows, 3\] like batch 0\. Its "
    r"trailing sizes vary between batches \(variable lengths\?\): pad them to fixed sizes, e\.g\. "
    r"pe\.pad_batches\(\.\.\., pad_shapes=\{'x': \(3,\)\}\)",
  ):
    first.check_same(
      BatchSpec.of_rows(flatten({"x": np.zeros((5, 2)), "s": np.array(["a"] * 5)})), 2
    )


@pytest.mark.parametrize(
  "batch_size, num_shards, where, message",
  [
    (
      12,
      8,
      None,
      "batch size 12 is not divisible by the 8 devices; use a multiple, e.g. 8 or 16 "
      "(pe.pad_batches(..., num_devices=8))",
    ),
    (
      6,
      4,
      "the 4 shards of the mesh's first axis 'data' (mesh {'data': 4, 'model': 2})",
      "batch size 6 is not divisible by the 4 shards of the mesh's first axis 'data' (mesh {'data': 4, "
      "'model': 2}); use a multiple, e.g. 4 or 8 (pe.pad_batches(..., num_devices=4))",
    ),
    (
      3,
      8,
      None,
      "batch size 3 is not divisible by the 8 devices; use a multiple, e.g. 8 or 16 "
      "(pe.pad_batches(..., num_devices=8))",
    ),
  ],
)
def test_check_divisible(batch_size, num_shards, where, message):
  spec = BatchSpec.from_batch(padded(batch_size))
  with pytest.raises(ValueError) as raised:
    spec.check_divisible(num_shards, where)
  assert str(raised.value) == message
  BatchSpec.from_batch(padded(16)).check_divisible(8)  # divisible: nothing happens


# ---- JSON and the first difference ------------------------------------------------------------------------------


def test_json_round_trip_is_plain_data_and_order_free():
  spec = BatchSpec.from_batch(padded())
  data = json.loads(json.dumps(spec.to_json()))
  assert data == {
    "batch_size": 8,
    "mask_key": "mask",
    "leaves": [[["meta", "label"], [], "<i4"], [["x"], [3], "<f4"]],
  }
  assert BatchSpec.from_json(data) == spec
  assert BatchSpec.from_json(data).difference(spec) is None
  reordered = BatchSpec.from_batch(dict(reversed(list(padded().items()))))
  assert reordered.to_json() == spec.to_json()


@pytest.mark.parametrize(
  "other, message",
  [
    (
      padded(batch_size=16),
      "batch size 16, expected 8",
    ),
    (
      padded(features=2),
      "leaf 'x' has shape (8, 2) dtype float32, expected shape (8, 3) dtype float32",
    ),
    (
      padded(label_dtype=np.int8),
      "leaf 'meta/label' has shape (8,) dtype int8, expected shape (8,) dtype int32",
    ),
    (padded(z=np.zeros(8)), "keys differ: missing [], unexpected ['z']"),
  ],
)
def test_difference_names_the_first_difference(other, message):
  reference = BatchSpec.from_json(json.loads(json.dumps(BatchSpec.from_batch(padded()).to_json())))
  got = BatchSpec.from_json(json.loads(json.dumps(BatchSpec.from_batch(other).to_json())))
  assert got.difference(reference) == message
  renamed = BatchSpec.from_batch({"x": np.zeros(8), "valid": np.ones(8, bool)}, mask_key="valid")
  assert renamed.difference(BatchSpec.from_batch({"x": np.zeros(8), "mask": np.ones(8, bool)})) == (
    "mask key 'valid', expected 'mask'"
  )


# ---- all-padding batches ----------------------------------------------------------------------------------------


def test_padding_batch_honours_pad_value():
  batch = padded()
  batch["text"] = np.array(["ab"] * 8)
  batch["raw"] = np.array([b"ab"] * 8, dtype=object)
  spec = BatchSpec.from_batch(batch, allow_strings=True)
  for source in (spec, BatchSpec.from_json(json.loads(json.dumps(spec.to_json())))):
    empty = source.padding_batch({"x": np.nan, "meta": -1})
    assert sorted(empty) == ["mask", "meta", "raw", "text", "x"]
    assert (
      empty["mask"].dtype == np.bool_ and empty["mask"].shape == (8,) and not empty["mask"].any()
    )
    assert (
      empty["x"].shape == (8, 3) and empty["x"].dtype == np.float32 and np.isnan(empty["x"]).all()
    )
    assert empty["meta"]["label"].dtype == np.int32 and (empty["meta"]["label"] == -1).all()
    assert empty["text"].tolist() == [""] * 8 and empty["raw"].tolist() == [b""] * 8
  zeros = spec.padding_batch()
  assert (zeros["x"] == 0).all() and (zeros["meta"]["label"] == 0).all()
  assert spec.padding_batch(7, batch_size=2)["x"].tolist() == [[7.0] * 3] * 2


def test_padding_batch_refuses_unknown_sizes_and_bad_pad_values():
  rows = BatchSpec({("x",): LeafSpec((None,), np.dtype(np.float32))})
  with pytest.raises(ValueError, match=r"an all-padding batch needs known sizes; got batch size 4"):
    rows.padding_batch(batch_size=4)
  with pytest.raises(ValueError, match=r"needs known sizes; got batch size None"):
    BatchSpec.from_batch(padded()).padded_to(None, "mask").padding_batch()
  with pytest.raises(
    ValueError, match=r"pad_value nan for key 'meta/label' does not fit dtype int32"
  ):
    BatchSpec.from_batch(padded()).padding_batch(np.nan)
  with pytest.raises(ValueError, match=r"pad_value has key 'y', which the source does not have"):
    BatchSpec.from_batch(padded()).padding_batch({"y": 1})


# ---- source batches (rows, no mask yet) -------------------------------------------------------------------------


def test_flatten_rows_and_of_rows():
  batch = {"a": {"x": [[1, 2], [3, 4]]}, "y": np.array([True, False])}
  flat, rows = flatten_rows(batch, "mask", "batch 0")
  assert rows == 2 and all(isinstance(leaf, np.ndarray) for leaf in flat.values())
  assert unflatten(flat)["a"]["x"].tolist() == [[1, 2], [3, 4]]
  spec = BatchSpec.of_rows(flat)
  assert spec.batch_size == 2 and spec.mask_key is None
  assert spec.leaves[("a", "x")] == LeafSpec((2,), np.asarray([[1]]).dtype)
  assert BatchSpec.of_rows(flat, unknown_rows=True).batch_size is None
  padded_spec = spec.padded_to(8, "valid")
  assert padded_spec.padding_batch()["valid"].shape == (8,) and padded_spec.padding_batch()["a"][
    "x"
  ].shape == (8, 2)


def test_messages_keep_the_drivers_tested_wording():
  """The patterns tests/eval/test_evaluate.py matches today, so masked_eval can switch to BatchSpec unchanged."""
  rows16 = {"x": np.ones((16, 2)), "mask": np.ones(16, bool)}
  rows24 = {"x": np.ones((24, 2)), "mask": np.ones(24, bool)}
  with pytest.raises(ValueError, match="batch 1 has .*\\(24, 2\\).*expected the first batch's"):
    BatchSpec.from_batch(rows16).check(rows24, 1)
  with pytest.raises(ValueError, match="no mask key 'mask'.*\\['x'\\]"):
    BatchSpec.from_batch({"x": np.ones((16, 2))})
  with pytest.raises(
    ValueError, match="'mask' has shape \\(16,\\) and dtype int64; expected a bool"
  ):
    BatchSpec.from_batch({"x": np.ones((16, 2)), "mask": np.ones(16, np.int64)})
  with pytest.raises(ValueError, match="batch size 12 is not divisible by the 8 devices"):
    BatchSpec.from_batch({"x": np.ones((12, 2)), "mask": np.ones(12, bool)}).check_divisible(8)


def test_check_refuses_other_containers_with_the_same_leaves():
  first = padded()
  spec = BatchSpec.from_batch(first)
  spec.check(dict(reversed(list(first.items()))), 1)  # key order is not structure
  with pytest.raises(
    ValueError, match="batch 1 has structure .*'meta'.*expected the first batch's"
  ):
    spec.check({**first, "meta": collections.OrderedDict(first["meta"])}, 1)
  assert BatchSpec.from_json(spec.to_json()).structure is None  # JSON specs compare leaves only
  assert BatchSpec.from_json(spec.to_json()) == spec


def test_check_rows_is_check_same_on_flat_batches():
  first = BatchSpec.of_rows(flatten({"x": np.zeros((2, 3)), "s": np.array(["ab", "c"])}))
  first.check_rows(
    flatten({"s": np.array(["abcd"] * 5), "x": np.ones((5, 3))}), 1
  )  # longer strings: fine
  changed = [
    (
      {"x": np.zeros((5, 3), np.float32), "s": np.array(["a"] * 5)},
      r"key 'x' has dtype float32; expected float64",
    ),
    ({"x": np.zeros((5, 3))}, r"keys changed: missing \['s'\], unexpected \[\]"),
    (
      {"x": np.zeros((5, 3)), "s": np.array(["a"] * 5), "t": np.zeros(5)},
      r"keys changed: missing \[\], unexpected \['t'\]",
    ),
    (
      {"x": np.zeros(5), "s": np.array(["a"] * 5)},
      r"key 'x' has shape \(5,\); expected \[rows, 3\]",
    ),
  ]
  for batch, match in changed:
    with pytest.raises(ValueError, match="^batch 4: " + match):
      first.check_rows(flatten(batch), 4)


def test_a_tuple_in_a_dict_batch_survives_json():
  """A checkpoint's spec (JSON) rebuilds a batch of the same tree: a tuple stays a tuple (its positions
  were written as the strings "[0]", "[1]" and came back as dict keys)."""
  batch = {
    "x": (np.arange(8, dtype=np.float32), np.zeros((8, 2), np.int32)),
    "mask": np.ones(8, bool),
  }
  spec = BatchSpec.from_batch(batch)
  data = json.loads(json.dumps(spec.to_json()))
  assert data["leaves"] == [[["x", 0], [], "<f4"], [["x", 1], [2], "<i4"]]
  restored = BatchSpec.from_json(data)
  assert restored == spec and restored.difference(spec) is None
  empty = restored.padding_batch()
  assert jax.tree.structure(empty) == jax.tree.structure(batch)
  assert [leaf.shape for leaf in jax.tree.leaves(empty)] == [(8,), (8,), (8, 2)]
  assert not empty["mask"].any()
  spec.check(batch, 1)  # a live batch still matches the spec


@pytest.mark.parametrize(
  "source, batch, match",
  [
    (
      {0: np.arange(5.0), "y": np.arange(5.0)},
      {0: np.zeros(8), "y": np.zeros(8), "mask": np.ones(8, bool)},
      r"keys \[0, '(y|mask)'.*\] at the top level",
    ),
    (
      {1: np.arange(5.0)},
      {1: np.zeros(8), "mask": np.ones(8, bool)},
      r"keys \[1.*\] at the top level",
    ),
    (
      {"x": {1: np.arange(5.0), "b": np.arange(5.0)}},
      {"x": {1: np.zeros(8), "b": np.zeros(8)}, "mask": np.ones(8, bool)},
      r"keys \[1, 'b'\] under 'x'",
    ),
  ],
)
def test_keys_jax_cannot_sort_are_refused_naming_them(source, batch, match):
  """jax sorts a dict's keys: a batch dict mixing ints and strings (the mask's key is a string)
  was taken by pad_batches and failed in masked_eval ("Comparator raised exception while sorting
  pytree dictionary keys"). Keys of one kind below the top level (ints) stay fine."""
  with pytest.raises(ValueError, match=match + r".*one kind"):
    list(pe.pad_batches(source, 4, num_devices=1))
  with pytest.raises(ValueError, match=match + r".*one kind"):
    pe.masked_eval(lambda p, b: pe.metrics.Mean().batch_updates(values=b["mask"]), None, [batch])
  (ints,) = pe.pad_batches({"x": {1: np.arange(3.0), 2: np.arange(3.0)}}, 4, num_devices=1)
  np.testing.assert_array_equal(ints["x"][2][:3], np.arange(3.0))


def test_keys_jax_cannot_sort_in_a_later_batch_are_refused_naming_them():
  """masked_eval checked the key kinds of batch 0 only: a later batch with an int key beside
  its string keys failed inside JAX's flatten ("Comparator raised exception ...")."""
  good = {"x": np.zeros(8), "mask": np.ones(8, bool)}
  bad = {"x": np.zeros(8), 0: np.zeros(8), "mask": np.ones(8, bool)}
  with pytest.raises(
    ValueError, match=r"batch 1.*keys \[0, '(x|mask)'.*\] at the top level.*one kind"
  ):
    pe.masked_eval(
      lambda p, b: pe.metrics.Mean().batch_updates(values=b["x"]), None, [good, bad], backend="jit"
    )


@pytest.mark.parametrize("backend", ["pmap", "jit"])
def test_float64_values_that_overflow_float32_are_refused_naming_the_key(backend):
  # Issue 65: 1e300 became inf on the devices and AUROC counted a "nan score", naming no key.
  data = {"score": np.array([1e300] + [0.5] * 12), "label": np.arange(13) % 2}

  def step(params, batch):
    return pe.metrics.AUROC().batch_updates(
      preds=batch["score"], target=batch["label"], mask=batch["mask"]
    )

  with pytest.raises(
    ValueError, match=r"key 'score' holds float64 values up to 1e\+300 .* overflow float32"
  ):
    pe.masked_eval(step, None, pe.pad_batches(data, 8), backend=backend)
  # garbage beyond float32 in padded rows only is not refused
  padded = {
    "score": np.array([0.9, 0.2, 0.7, 0.4] + [1e300] * 4),
    "label": np.array([1, 0, 1, 0] * 2),
  }
  padded["mask"] = np.arange(8) < 4
  assert pe.masked_eval(step, None, [padded], backend=backend)["auroc"] == pytest.approx(1.0)


# ---- int64 batches through masked_eval (issue 26): exact or refused, never wrapped ------------------------------
#
# Without ``jax_enable_x64`` JAX wraps int64 to int32 when a batch is placed on the devices,
# before any metric sees it: the mean of [2**40, 3] came out 1.5 and a target of 2**32 matched a
# prediction of 0. Such a batch is now refused naming the key; int64 values inside int32, and
# garbage outside it in padded rows only, evaluate exactly.


def _mean_step(params, batch):
  del params
  return pe.metrics.Mean("x").batch_updates(x=batch["x"], mask=batch["mask"])


def _accuracy_step(params, batch):
  del params
  return pe.metrics.Accuracy().batch_updates(
    preds=batch["p"], target=batch["t"], mask=batch["mask"]
  )


@pytest.mark.parametrize("backend", ["pmap", "jit"])
def test_int64_values_beyond_int32_are_refused_naming_the_key(backend):
  data = {"x": np.array([2**40, 3] + [5] * 35, np.int64)}
  with pytest.raises(ValueError, match=r"'x'.*outside int32"):
    pe.masked_eval(_mean_step, None, pe.pad_batches(data, 16), backend=backend)


def test_int64_labels_beyond_int32_are_refused():
  data = {"p": np.zeros(37, np.int64), "t": np.full(37, 2**32, np.int64)}
  with pytest.raises(ValueError, match=r"'t'.*outside int32"):
    pe.masked_eval(_accuracy_step, None, pe.pad_batches(data, 16), backend="jit")


def test_int64_within_int32_and_garbage_in_padding_evaluate_exactly():
  rng = np.random.default_rng(0)
  x = rng.integers(-(2**24), 2**24, 37, dtype=np.int64)  # exact in float32
  batches = pe.pad_batches({"x": x}, 16, pad_value=2**40)  # padding outside int32: never read
  result = pe.masked_eval(_mean_step, None, batches, backend="shard_map")
  assert result["num_examples"] == 37
  np.testing.assert_allclose(result["mean"], x.astype(np.float64).mean(), rtol=1e-6)
