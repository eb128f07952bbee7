"""A checkpoint directory answers only its own question (#26, "Checkpoints").

A finished directory returns its stored result only for the same metric, batch spec, batch size
and params (by value: `padded_eval.eval.fingerprint.params_checksum`); the stored result keeps its final metric,
so curves and plots work after a resume. 203 rows in batches of 16 (8 devices): neither divides
the rows; padded rows hold NaN / inf features and out-of-range labels. References: scikit-learn.
"""

import functools

import jax
import metric_cases
import numpy as np
import pytest
import sklearn.metrics as skm

import padded_eval as pe

ROWS, BATCH, CLASSES = 203, 16, 3
GRID = 1000  # binary scores k / 1000: the linear bins of AUROC(1001) hold one score each


def _data(seed=0):
  rng = np.random.default_rng(seed)
  label = rng.integers(0, CLASSES, ROWS).astype(np.int32)
  x = rng.normal(size=(ROWS, 4)).astype(np.float32)
  x[np.arange(ROWS), label] += 1.0
  binary = (rng.random(ROWS) < 0.4).astype(np.int32)
  score = 1.0 / (1.0 + np.exp(-rng.normal(np.where(binary == 1, 1.0, -1.0), 1.2)))
  return {
    "x": x,
    "label": label,
    "binary": binary,
    "score": (np.round(score * GRID) / GRID).astype(np.float32),
  }


def _params(seed=1):
  return {"w": np.random.default_rng(seed).normal(size=(4, CLASSES)).astype(np.float32)}


def _batches(data, batch_size=BATCH, *, stop_after=None, fail_at=None):
  """Padded batches (NaN / inf / out-of-range padding); raise when asked for batch ``fail_at``
  (a preemption), or AssertionError past batch ``stop_after`` (a source that must not be read)."""
  pad = {"x": np.nan, "label": 99, "binary": -3, "score": np.inf}
  for index, batch in enumerate(pe.pad_batches(data, batch_size, pad_value=pad)):
    if index == fail_at:
      raise RuntimeError("preempted")
    assert stop_after is None or index <= stop_after, f"batch {index} was read"
    yield batch


def _logits(params, batch):
  return batch["x"] @ params["w"]


def accuracy_step(params, batch):
  return pe.metrics.Accuracy().batch_updates(
    preds=_logits(params, batch), target=batch["label"], mask=batch["mask"]
  )


def f1_step(params, batch):
  return pe.metrics.F1Score(num_classes=CLASSES).batch_updates(
    preds=_logits(params, batch), target=batch["label"], mask=batch["mask"]
  )


def accuracy_and_f1_step(params, batch):
  metrics = {"accuracy": pe.metrics.Accuracy(), "f1": pe.metrics.F1Score(num_classes=CLASSES)}
  return pe.Metrics(metrics).batch_updates(
    preds=_logits(params, batch), target=batch["label"], mask=batch["mask"]
  )


def auroc_step(params, batch):
  del params
  return pe.metrics.AUROC(GRID + 1, binning="linear").batch_updates(
    preds=batch["score"], target=batch["binary"], mask=batch["mask"]
  )


def _sklearn_accuracy(data, params):
  predicted = np.argmax(data["x"].astype(np.float64) @ params["w"], axis=-1)
  return skm.accuracy_score(data["label"], predicted)


@pytest.mark.parametrize("backend", ["pmap", "jit"])
def test_a_finished_directory_answers_only_its_own_question(backend, tmp_path):
  data, params = _data(), _params()
  common = dict(backend=backend, checkpoint_dir=tmp_path)
  first = pe.masked_eval(accuracy_step, params, _batches(data), **common)
  assert first["accuracy"] == pytest.approx(_sklearn_accuracy(data, params), abs=1e-7)
  other_questions = [
    (f1_step, BATCH, "the metric differs"),
    (accuracy_and_f1_step, BATCH, "the metric differs"),
    (accuracy_step, 2 * BATCH, "the batch size differs"),
  ]
  for step_fn, batch_size, message in other_questions:
    with pytest.raises(ValueError, match=message) as error:
      pe.masked_eval(step_fn, params, _batches(data, batch_size), **common)
    assert "one evaluation" in str(error.value) and str(tmp_path) in str(error.value)
  extra = dict(data, extra=np.zeros(ROWS, np.int8))
  with pytest.raises(ValueError, match="the batch structure differs"):
    pe.masked_eval(accuracy_step, params, _batches(extra), **common)
  # The same question: the stored result, read from the directory (batches after the first unread).
  again = pe.masked_eval(accuracy_step, params, _batches(data, stop_after=0), **common)
  assert again == first and type(again["num_examples"]) is int
  assert again["accuracy"] == pytest.approx(_sklearn_accuracy(data, params), abs=1e-7)
  assert again["num_examples"] == ROWS


def _new_checkpoint(params):
  """Another model checkpoint: the same structure, one weight moved by one float32 ulp."""
  moved = {"w": params["w"].copy()}
  moved["w"][2, 1] = np.nextafter(moved["w"][2, 1], np.float32(np.inf))
  return moved


@pytest.mark.parametrize("backend", ["pmap", "shard_map", "jit"])
def test_a_new_model_in_a_finished_directory_is_refused(backend, tmp_path):
  data, params = _data(), _params()
  common = dict(backend=backend, checkpoint_dir=tmp_path)
  pe.masked_eval(accuracy_step, params, _batches(data), **common)
  with pytest.raises(ValueError, match="params checksum") as error:
    pe.masked_eval(accuracy_step, _new_checkpoint(params), _batches(data), **common)
  assert "one evaluation" in str(error.value)
  copied = jax.tree.map(np.copy, params)  # equal values, other arrays: the same question
  again = pe.masked_eval(accuracy_step, copied, _batches(data, stop_after=0), **common)
  assert again["accuracy"] == pytest.approx(_sklearn_accuracy(data, params), abs=1e-7)


def test_a_new_model_in_an_unfinished_directory_is_refused(tmp_path):
  data, params = _data(), _params()
  common = dict(checkpoint_dir=tmp_path, checkpoint_every=2)
  with pytest.raises(RuntimeError, match="preempted"):
    pe.masked_eval(accuracy_step, params, _batches(data, fail_at=7), **common)
  with pytest.raises(ValueError, match="params checksum"):
    pe.masked_eval(accuracy_step, _new_checkpoint(params), _batches(data), **common)
  resumed = pe.masked_eval(accuracy_step, jax.tree.map(np.copy, params), _batches(data), **common)
  assert resumed["accuracy"] == pytest.approx(_sklearn_accuracy(data, params), abs=1e-7)
  assert resumed["num_examples"] == ROWS


def _check_roc(results, data):
  fpr, tpr, _ = results.metric.curve()
  ref_fpr, ref_tpr, _ = skm.roc_curve(data["binary"], data["score"], drop_intermediate=False)
  np.testing.assert_allclose(fpr, ref_fpr, rtol=1e-14, atol=0)
  np.testing.assert_allclose(tpr, ref_tpr, rtol=1e-14, atol=0)
  assert results["auroc"] == pytest.approx(skm.roc_auc_score(data["binary"], data["score"]), 1e-6)


@pytest.mark.parametrize("backend", ["pmap", "jit"])
def test_a_resumed_and_a_stored_result_keep_their_metric(backend, tmp_path):
  pytest.importorskip("matplotlib")
  import matplotlib

  matplotlib.use("Agg")
  data = _data()
  common = dict(backend=backend, checkpoint_dir=tmp_path, checkpoint_every=3)
  with pytest.raises(RuntimeError, match="preempted"):
    pe.masked_eval(auroc_step, None, _batches(data, fail_at=8), **common)
  resumed = pe.masked_eval(auroc_step, None, _batches(data), **common)
  _check_roc(resumed, data)
  stored = pe.masked_eval(auroc_step, None, _batches(data, stop_after=0), **common)
  assert stored == resumed
  _check_roc(stored, data)
  assert isinstance(stored.metric, pe.metrics.AUROC)
  axes = pe.plot.roc_curve(stored)
  (line,) = [line for line in axes.get_lines() if len(line.get_xdata()) > 2]
  np.testing.assert_allclose(line.get_xdata(), stored.metric.curve()[0])


# --- the params checksum: its definition in numpy, wherever the params lie ---------------------

_MASK32 = 2**32 - 1


def _reference_checksum(tree) -> str:
  """`padded_eval.eval.fingerprint.params_checksum` written out in numpy (uint64 arithmetic, masked to 32 bits)."""
  words = []
  for leaf in jax.tree.leaves(tree):
    leaf = np.asarray(leaf)
    if leaf.dtype == bool or leaf.dtype.itemsize == 4:
      as_words = leaf.astype(np.uint32) if leaf.dtype == bool else leaf.view(np.uint32)
    else:
      as_words = leaf.view(np.uint16 if leaf.dtype.itemsize == 2 else np.uint8)
    words.append(as_words.ravel().astype(np.uint64))
  word = np.concatenate(words)
  index = np.arange(len(word), dtype=np.uint64)
  x = word ^ ((index * 0x9E3779B9) & _MASK32)
  x ^= x >> 16
  x = (x * 0x85EBCA6B) & _MASK32
  x ^= x >> 13
  x = (x * 0xC2B2AE35) & _MASK32
  x ^= x >> 16
  first = int(np.sum(x) % 2**32)
  second = int(np.sum((x * ((2 * index + 1) & _MASK32)) & _MASK32) % 2**32)
  return f"{first:08x}{second:08x}"


def _mixed_tree(rng):
  return {
    "dense": rng.normal(size=(40, 6)).astype(np.float32),
    "half": rng.normal(size=(2, 3, 4)).astype(np.float16),
    "bf16": rng.normal(size=(11,)).astype(jax.numpy.bfloat16),
    "int8": rng.integers(-128, 128, (3, 7)).astype(np.int8),
    "flags": rng.random(5) < 0.5,
    "step": np.int32(12345),
  }


def test_params_checksum_equals_its_numpy_definition_wherever_the_params_lie():
  from jax.sharding import NamedSharding, PartitionSpec

  from padded_eval.eval.fingerprint import params_checksum

  tree = _mixed_tree(np.random.default_rng(3))
  reference = _reference_checksum(tree)
  mesh = jax.make_mesh((8,), ("d",))
  replicated = jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))
  sharded = dict(
    replicated, dense=jax.device_put(tree["dense"], NamedSharding(mesh, PartitionSpec("d")))
  )
  assert not sharded["dense"].is_fully_replicated
  for placed in (jax.tree.map(jax.numpy.asarray, tree), replicated, sharded):
    assert params_checksum(placed) == reference


def test_params_checksum_catches_every_bit_flip_and_every_swap():
  from padded_eval.eval.fingerprint import params_checksum

  tree = _mixed_tree(np.random.default_rng(4))
  original = params_checksum(jax.tree.map(jax.numpy.asarray, tree))
  seen = {original}
  for key in ("dense", "half", "bf16", "int8"):
    leaf = tree[key]
    for bit in range(8 * leaf.dtype.itemsize):  # every bit of one element
      flipped = leaf.copy()
      flat = flipped.reshape(-1).view(np.uint8)
      flat[(5 % leaf.size) * leaf.dtype.itemsize + bit // 8] ^= np.uint8(1 << (bit % 8))
      seen.add(params_checksum(jax.tree.map(jax.numpy.asarray, dict(tree, **{key: flipped}))))
  flags = dict(tree, flags=~tree["flags"])
  seen.add(params_checksum(jax.tree.map(jax.numpy.asarray, flags)))
  swapped = tree["dense"].copy()
  swapped[[0, 7]] = swapped[[7, 0]]  # two rows trade places
  seen.add(params_checksum(jax.tree.map(jax.numpy.asarray, dict(tree, dense=swapped))))
  two = {"a": tree["dense"], "b": tree["dense"] * 2}
  seen.add(params_checksum(jax.tree.map(jax.numpy.asarray, two)))
  seen.add(params_checksum(jax.tree.map(jax.numpy.asarray, {"a": two["b"], "b": two["a"]})))
  assert len(seen) == 1 + 32 + 16 + 16 + 8 + 1 + 1 + 2  # every change gave a new checksum


def test_the_checksum_is_stored_with_the_result(tmp_path):
  from padded_eval.eval import checkpoint_files

  data, params = _data(), _params()
  pe.masked_eval(accuracy_step, params, _batches(data), backend="jit", checkpoint_dir=tmp_path)
  header, leaves = checkpoint_files.read_state_file(tmp_path / "process_0" / "result.state")
  assert header["fingerprint"]["params_checksum"] == _reference_checksum(params)
  assert len(leaves) == len(jax.tree.leaves(pe.metrics.Accuracy()))


# --- every metric of the case table: the stored metric is the final one, bit for bit -------------


def _case_step(name, params, batch):
  del params
  (case,) = [case for case in metric_cases.CASES if case.name == name]
  return case.make().batch_updates(**{k: v for k, v in batch.items() if k != "rows"})


def _read_once(batches):
  """``batches`` as a generator (its length unknown) that fails if a batch past the first is read."""
  for index, batch in enumerate(batches):
    assert index == 0, f"batch {index} was read"
    yield batch


@pytest.mark.parametrize("case", metric_cases.CASES, ids=lambda case: case.name)
def test_the_stored_metric_is_the_final_metric(case, tmp_path):
  batches = case.batches()
  for batch in batches:  # masked_eval's row mask; the metric's own mask may be [B, T]
    batch["rows"] = batch["mask"].reshape(len(batch["mask"]), -1).any(-1)
  step = functools.partial(_case_step, case.name)
  # cases may count invalid values on purpose (a row without a reference): not this test's point
  common = dict(backend="jit", mask_key="rows", checkpoint_dir=tmp_path, on_invalid="ignore")
  first = pe.masked_eval(step, None, batches, **common)
  stored = pe.masked_eval(step, None, _read_once(batches), **common)  # only the question
  assert type(stored.metric) is type(first.metric)
  for got, want in zip(jax.tree.leaves(stored.metric), jax.tree.leaves(first.metric), strict=True):
    np.testing.assert_array_equal(got, want)
  with np.errstate(divide="ignore", invalid="ignore"):  # references of undefined values
    expected = case.reference(batches)
  np.testing.assert_allclose(
    np.asarray(stored.metric.compute(), np.float64),
    expected,
    rtol=case.rtol,
    atol=case.atol,
  )
  assert sorted(stored) == sorted(first)
  for key in first:
    np.testing.assert_array_equal(stored[key], first[key])


class _Listed(list):
  """A list of padded batches (its length known) whose iteration raises at batch ``fail_at``."""

  def __init__(self, batches, fail_at=None):
    super().__init__(batches)
    self.fail_at = fail_at

  def __iter__(self):
    for index, batch in enumerate(super().__iter__()):
      if index == self.fail_at:
        raise RuntimeError("preempted")
      yield batch


def _listed(data, fail_at=None):
  pad = {"x": np.nan, "label": 99, "binary": -3, "score": np.inf}
  return _Listed(pe.pad_batches(data, BATCH, pad_value=pad), fail_at)


def _grown(data, rows):
  """``data`` with ``rows`` more rows at the end (its first batches unchanged)."""
  more = _data(seed=7)
  return {key: np.concatenate([values, more[key][:rows]]) for key, values in data.items()}


@pytest.mark.parametrize("backend", ["pmap", "jit"])
def test_a_finished_directory_refuses_other_data_of_the_same_shapes(backend, tmp_path):
  data, params = _data(), _params()
  common = dict(backend=backend, checkpoint_dir=tmp_path)
  first = pe.masked_eval(accuracy_step, params, _listed(data), **common)
  assert first["accuracy"] == pytest.approx(_sklearn_accuracy(data, params), abs=1e-7)
  # other rows, the same batch spec and count: the first batch's values tell them apart
  with pytest.raises(
    ValueError, match=r"the first batch \(its real rows' values.*\) differs"
  ) as error:
    pe.masked_eval(accuracy_step, params, _batches(_data(seed=3)), **common)
  assert "one evaluation" in str(error.value)
  # the same first batches and 16 rows more: one batch more than the directory's
  with pytest.raises(
    ValueError, match=r"the number of batches \(.*\) differs \(saved 13, now (14|10)\)"
  ):
    pe.masked_eval(accuracy_step, params, _listed(_grown(data, BATCH)), **common)
  # the same data: the stored answer (a generator's length is unknown: not compared)
  again = pe.masked_eval(accuracy_step, params, _batches(data, stop_after=0), **common)
  assert again == first


def test_an_unfinished_directory_refuses_more_or_fewer_batches(tmp_path):
  data, params = _data(), _params()
  common = dict(checkpoint_dir=tmp_path, checkpoint_every=2)
  with pytest.raises(RuntimeError, match="preempted"):
    pe.masked_eval(accuracy_step, params, _listed(data, fail_at=7), **common)
  for other in (_grown(data, BATCH), {key: values[:150] for key, values in data.items()}):
    with pytest.raises(
      ValueError, match=r"the number of batches \(.*\) differs \(saved 13, now (14|10)\)"
    ):
      pe.masked_eval(accuracy_step, params, _listed(other), **common)
  resumed = pe.masked_eval(accuracy_step, params, _listed(data), **common)
  assert resumed["accuracy"] == pytest.approx(_sklearn_accuracy(data, params), abs=1e-7)
  assert resumed["num_examples"] == ROWS
  # the resumed run stored the first batch's checksum of the run it resumed: other rows refused
  with pytest.raises(ValueError, match=r"the first batch \(its real rows' values.*\) differs"):
    pe.masked_eval(accuracy_step, params, _batches(_data(seed=3)), **common)


@pytest.mark.parametrize("backend", ["pmap", "jit"])
def test_a_finished_directory_refuses_fewer_rows_in_as_many_batches(backend, tmp_path):
  """203 rows and then their first 200 are 13 batches of 16 with the same first batch: before,
  the finished directory answered the 200 with the 203's stored accuracy. ``pad_batches`` over a
  Mapping knows its rows: they are compared, finished or not; the result against scikit-learn."""
  data, params = _data(), _params()
  fewer = {key: values[:200] for key, values in data.items()}
  pad = {"x": np.nan, "label": 99, "binary": -3, "score": np.inf}
  common = dict(backend=backend, checkpoint_dir=tmp_path / "done")
  first = pe.masked_eval(
    accuracy_step, params, pe.pad_batches(data, BATCH, pad_value=pad), **common
  )
  assert first["accuracy"] == pytest.approx(_sklearn_accuracy(data, params), abs=1e-7)
  match = r"the number of real rows \(.*\) differs \(saved 203, now 200\)"
  with pytest.raises(ValueError, match=match):
    pe.masked_eval(accuracy_step, params, pe.pad_batches(fewer, BATCH, pad_value=pad), **common)
  unfinished = dict(backend=backend, checkpoint_dir=tmp_path / "unfinished", checkpoint_every=2)
  preempted = _listed(data, fail_at=7)
  preempted.num_rows = ROWS  # batches that know their rows, as pad_batches' result does
  with pytest.raises(RuntimeError, match="preempted"):
    pe.masked_eval(accuracy_step, params, preempted, **unfinished)
  with pytest.raises(ValueError, match=match):
    pe.masked_eval(accuracy_step, params, pe.pad_batches(fewer, BATCH, pad_value=pad), **unfinished)
  alone = pe.masked_eval(
    accuracy_step, params, pe.pad_batches(fewer, BATCH, pad_value=pad), backend=backend
  )
  assert alone["accuracy"] == pytest.approx(_sklearn_accuracy(fewer, params), abs=1e-7)
  assert alone["num_examples"] == 200
