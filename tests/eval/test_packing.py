"""The carried state packed into one vector of 32-bit words (padded_eval.eval.packing), and where masked_eval uses it.

Bit-exactness is checked against numpy's own views of the same bytes (NaN payloads, -0.0,
subnormals, bf16/f16); the results of packed evaluations against numpy float64 (exact integer
counts) on data whose size divides neither the batch nor the 8 devices, with garbage
(NaN / inf / out-of-range labels) in every padded row: tests/eval/test_placement.py's data and metrics.
"""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import Mesh, PartitionSpec
from sklearn.metrics import roc_auc_score
from test_placement import check, dataset, garbage_padded, step, weights  # same data and metrics

import padded_eval as pe
from padded_eval.eval import backends, packing, placement
from padded_eval.eval import cache as step_cache
from padded_eval.eval import step as step_parts
from padded_eval.exact.accumulate import ExactCount, ExactSum


def odd_tree(rng):
  """A state-like tree with every dtype a state may hold and awkward bit patterns."""
  f32 = np.array([np.nan, -0.0, np.inf, -np.inf, 1e-45, 3.4e38, 1.0], np.float32)
  f32 = np.concatenate([f32, np.frombuffer(np.uint32(0x7FC12345).tobytes(), np.float32)])
  return {
    "f32": f32.reshape(2, 4),
    "i32": rng.integers(-(2**31), 2**31 - 1, size=(3,), dtype=np.int64).astype(np.int32),
    "u32": np.array([0, 2**32 - 1], np.uint32),
    "bool": np.array([[True, False, True]]),
    "u8": np.array([0, 255, 7], np.uint8),
    "f16": np.array([np.nan, -0.0, 6.1e-5, 65504.0], np.float16),
    "bf16": np.array([np.nan, -0.0, 1e-38, 3e38], ml_dtypes.bfloat16),
    "scalar": np.float32(-2.5),
    "empty": np.zeros((0, 3), np.int32),
  }


def assert_same_bits(got, want):
  got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(got_leaves, want_leaves):
    g, w = np.asarray(g), np.asarray(w)
    assert g.dtype == w.dtype and g.shape == w.shape
    assert g.tobytes() == w.tobytes()


def _numpy_words(x):
  """numpy's own reading of a leaf as 32-bit words: a 32-bit leaf's bytes read as uint32, a
  narrower leaf's unsigned bits zero-extended, one element a word."""
  x = np.ascontiguousarray(x)
  if x.dtype.itemsize == 4:
    return np.frombuffer(x.tobytes(), np.uint32)
  unsigned = {1: np.uint8, 2: np.uint16}[x.dtype.itemsize]
  return np.frombuffer(x.tobytes(), unsigned).astype(np.uint32)


def test_host_round_trip_is_bit_exact():
  tree = odd_tree(np.random.default_rng(0))
  layout = packing.StatePacking(tree)
  packed = layout.pack_host(tree)
  want = np.concatenate([_numpy_words(x) for x in jax.tree.leaves(tree)])
  assert packed.dtype == np.uint32
  np.testing.assert_array_equal(packed, want)
  assert layout.nwords == len(want) == sum(np.size(x) for x in jax.tree.leaves(tree))
  assert_same_bits(layout.unpack_host(packed), tree)


def test_host_packing_of_stacked_shards_is_each_shard_packed():
  """A checkpoint's leaves carry one partial state per shard on a leading axis: packed on the
  host, each shard's words are its own state's (and a 64-bit leaf's two words stay in order)."""
  rng = np.random.default_rng(1)
  shards = [dict(odd_tree(rng), f64=rng.normal(size=(3,))) for _ in range(3)]
  layout = packing.StatePacking(shards[0])
  stacked = jax.tree.map(lambda *xs: np.stack(xs), *shards)
  packed = layout.pack_host(stacked)
  assert packed.shape == (3, layout.nwords)
  for shard, words in zip(shards, packed):
    np.testing.assert_array_equal(words, layout.pack_host(shard))
  assert_same_bits(layout.unpack_host(packed), stacked)


def test_a_32_bit_state_is_packed_without_widening_or_splitting_words():
  """Every leaf of a real metric state is 32-bit: one word per element, read by a same-width
  bitcast (the byte layout cost XLA's CPU backend a shift-and-reduce kernel per word)."""
  metric = pe.Metrics({"accuracy": pe.metrics.Accuracy(), "loss": pe.metrics.Mean("loss")})
  empty = jax.device_get(metric.empty())
  layout = packing.StatePacking(empty)
  leaves = jax.tree.leaves(empty)
  assert {np.asarray(x).dtype.itemsize for x in leaves} == {4}
  assert layout.nwords == sum(np.size(x) for x in leaves)
  hlo = jax.jit(lambda words: layout.pack(layout.unpack(words))).lower(layout.empty).as_text()
  assert "shift" not in hlo and "u8" not in hlo


def test_device_pack_and_unpack_match_the_host_bit_for_bit():
  tree = odd_tree(np.random.default_rng(1))
  layout = packing.StatePacking(tree)
  on_device = jax.jit(layout.pack)(tree)
  np.testing.assert_array_equal(np.asarray(on_device), layout.pack_host(tree))
  assert_same_bits(jax.device_get(jax.jit(layout.unpack)(layout.pack_host(tree))), tree)


def test_unpack_keeps_leading_axes():
  rng = np.random.default_rng(2)
  trees = [odd_tree(rng) for _ in range(3)]
  layout = packing.StatePacking(trees[0])
  stacked_bytes = np.stack([layout.pack_host(t) for t in trees])
  want = jax.tree.map(lambda *xs: np.stack(xs), *trees)
  assert_same_bits(layout.unpack_host(stacked_bytes), want)
  assert_same_bits(jax.device_get(jax.jit(layout.unpack)(stacked_bytes)), want)


def test_layouts_are_equal_when_structure_shapes_and_dtypes_are():
  a = {"x": np.zeros(3, np.float32), "n": np.zeros((), np.int32)}
  b = {"x": np.ones(3, np.float32), "n": np.ones((), np.int32)}
  c = {"x": np.zeros(3, np.float64), "n": np.zeros((), np.int32)}
  assert packing.StatePacking(a) == packing.StatePacking(b)
  assert hash(packing.StatePacking(a)) == hash(packing.StatePacking(b))
  assert packing.StatePacking(a) != packing.StatePacking(c)


def test_the_packed_final_reduce_is_the_exact_total_of_the_shards():
  """Per-shard exact sums (50 elements each) and counts, reduced packed across 8 devices (the
  final reduce of pmap and shard_map: `padded_eval.eval.step.reduce_carried`), against float64
  and integer totals over the shards: large offsets, tiny and huge magnitudes, cancellation."""
  rng = np.random.default_rng(3)
  shards = jax.device_count()
  values = (rng.normal(size=(shards, 50)) * 1e6).astype(np.float32)
  values[:, :5] = np.float32(1e-25)
  values[:, 5] = np.float32(1e18) * np.where(np.arange(shards) % 2, 1, -1)
  values[:, 6] = np.float32(1e6) + np.float32(0.0625)
  counts = rng.integers(0, 2**30, size=(shards, 3)).astype(np.int32)
  parts = [(ExactSum.of(v), ExactCount.of(c)) for v, c in zip(values, counts)]
  layout = packing.StatePacking(jax.device_get(parts[0]))
  stacked = np.stack([layout.pack_host(jax.device_get(p)) for p in parts])
  mesh = Mesh(np.array(jax.devices()), ("shards",))
  reduce = step_parts.reduce_carried(layout, "shards")
  final = jax.jit(
    jax.shard_map(
      lambda state: step_parts.restack(reduce(None, step_parts.unstack(state))),
      mesh=mesh,
      in_specs=PartitionSpec("shards"),
      out_specs=PartitionSpec("shards"),
    )
  )
  reduced = np.asarray(final(stacked))
  for shard in reduced:  # every shard holds the total
    total_sum, total_count = layout.unpack_host(shard)
    np.testing.assert_array_equal(total_sum.to_numpy(), values.astype(np.float64).sum(0))
    np.testing.assert_array_equal(total_count.to_numpy(), counts.astype(np.int64).sum(0))


# --- masked_eval's packed path -------------------------------------------------------------


class StateSpy:
  """Records the carried state each compiled step is called with."""

  def __init__(self, monkeypatch):
    self.states = []
    original = step_cache.CachedStep.entry

    def entry(cached, empty, packed):
      found = original(cached, empty, packed)
      if packed and not getattr(found, "spied", False):
        compiled = found.step

        def spied(params, state, inputs):
          self.states.append(state)
          return compiled(params, state, inputs)

        found.step, found.spied = spied, True
      return found

    monkeypatch.setattr(step_cache.CachedStep, "entry", entry)


def test_masked_eval_carries_one_word_vector_and_stays_exact(backend, monkeypatch):
  spy = StateSpy(monkeypatch)
  data, (w, b) = dataset(1003, seed=4), weights(5)
  got = pe.masked_eval(step, {"w": w, "b": b}, garbage_padded(data, 64), backend=backend)
  check(got, data, w, b)
  assert len(spy.states) == 16  # ceil(1003 / 64) steps, every one packed
  for state in spy.states:
    assert isinstance(state, jax.Array) and state.dtype == jnp.uint32
    if backend == "jit":  # one replicated vector
      assert state.ndim == 1 and state.sharding.is_fully_replicated
    else:  # one vector per shard
      assert state.shape[:1] == (jax.device_count(),) and state.ndim == 2


def test_a_checkpointed_evaluation_carries_a_small_state_packed_too(tmp_path, monkeypatch):
  """A checkpoint saves and restores the packed state (its tree leaves on disk): the step is
  the packed one, as without a checkpoint (tests/eval/test_compiling.py counts the programs)."""
  spy = StateSpy(monkeypatch)
  data, (w, b) = dataset(203, seed=6), weights(6)
  got = pe.masked_eval(
    step,
    {"w": w, "b": b},
    garbage_padded(data, 32),
    backend="shard_map",
    checkpoint_dir=tmp_path / "ckpt",
    checkpoint_every=2,
  )
  check(got, data, w, b)
  assert len(spy.states) == 7  # ceil(203 / 32) steps, every one packed
  assert all(state.dtype == jnp.uint32 for state in spy.states)


def test_a_large_state_is_not_packed_and_stays_exact(monkeypatch):
  monkeypatch.setattr(placement, "SMALL_STATE_BYTES", 0)
  spy = StateSpy(monkeypatch)
  data, (w, b) = dataset(203, seed=7), weights(7)
  check(
    pe.masked_eval(step, {"w": w, "b": b}, garbage_padded(data, 32), backend="pmap"), data, w, b
  )
  assert spy.states == []


def test_make_backend_reuses_equal_settings_and_still_checks_them():
  assert backends.make_backend("jit", "batch", None) is backends.make_backend("jit", "batch", None)
  mesh = jax.make_mesh((2, 4), ("data", "model"))
  listed = backends.make_backend("shard_map", "batch", mesh, ["data"])  # unhashable: not cached
  assert listed.data_axes == ("data",)
  for _ in range(2):
    with pytest.raises(ValueError, match="data_axes"):
      backends.make_backend("pmap", "batch", None, "data")


# --- the packed merge: every exact sum and count of a state merged as vectors ---------------

NOT_KERNELS = ("parameter(", "constant(", "tuple(", "get-tuple-element(", "bitcast(")


def entry_kernels(program, *args) -> int:
  """The instructions of a jitted program's compiled entry computation that run as kernels."""
  hlo = program.lower(*args).compile().as_text()
  entry = hlo[hlo.index("\nENTRY") :].splitlines()[1:]
  return sum(1 for line in entry if "=" in line and not any(op in line for op in NOT_KERNELS))


def test_exact_sums_merged_packed_compile_to_kernels_that_do_not_grow_with_their_number():
  """XLA's CPU backend compiles a kernel per array a program computes: merged leaf by leaf, a
  state of n means is about 8n kernels; merged as vectors, the same few whatever n."""

  def layout_and_empty(n):
    metric = pe.Metrics({f"m{i}": pe.metrics.Mean(f"x{i}") for i in range(n)})
    empty = jax.device_get((metric.empty(), ExactCount.zeros()))
    return packing.StatePacking(empty), empty

  def kernels(n, leaf_by_leaf=False):
    layout, empty = layout_and_empty(n)

    def merge(words, batch):
      (metric, count) = layout.unpack(words)
      return layout.pack((metric.merge(batch[0]), count.merge(batch[1])))

    return entry_kernels(jax.jit(merge if leaf_by_leaf else layout.merge), layout.empty, empty)

  assert kernels(8) <= kernels(1) + 2 < 10
  assert kernels(8, leaf_by_leaf=True) > 8 * 6  # what the vectors save


def test_a_grouped_layout_puts_each_field_of_the_exact_sums_end_to_end():
  state = {"a": ExactSum.zeros((2,)), "b": ExactCount.zeros(()), "c": ExactSum.zeros(())}
  layout = packing.StatePacking(jax.device_get(state))
  starts = {
    path: spec[2]
    for path, spec in zip(
      ["a.hi", "a.lo", "a.e", "b.lo", "b.hi", "c.hi", "c.lo", "c.e"], layout.specs
    )
  }
  # the sums' hi fields, then their lo fields, then their exponents; then the counts'
  assert [starts[k] for k in ("a.hi", "c.hi", "a.lo", "c.lo", "a.e", "c.e", "b.lo", "b.hi")] == [
    0,
    2,
    3,
    5,
    6,
    8,
    9,
    10,
  ]
  assert_same_bits(
    layout.unpack_host(layout.pack_host(jax.device_get(state))), jax.device_get(state)
  )


MIXED = pe.Metrics(
  {
    "mean": pe.metrics.Mean("x"),  # exact sums and counts: merged in the groups
    "weighted": pe.metrics.Mean("y"),
    "pearson": pe.metrics.PearsonCorrelation(),  # Moments: an accumulator merged by itself
    "auroc": pe.metrics.AUROC(exact=True, capacity=64),  # a score buffer: by itself too
  }
)


@functools.cache
def mixed_programs():
  """``(empty, layout, updates, packed merge, tree merge)`` of `MIXED`, each program jitted once."""
  empty = jax.device_get((MIXED.empty(), ExactCount.zeros()))
  layout = packing.StatePacking(empty)
  updates = jax.jit(
    lambda x, y, target, mask: MIXED.batch_updates(x=x, y=y, preds=x, target=target, mask=mask)
  )
  merge_tree = jax.jit(lambda total, batch: (total[0].merge(batch[0]), total[1].merge(batch[1])))
  return empty, layout, updates, jax.jit(layout.merge), merge_tree


@settings(max_examples=12, deadline=None)
@given(
  seed=st.integers(0, 2**32 - 1),
  scale=st.sampled_from([1e-25, 1.0, 1e6, 1e18]),
  offset=st.sampled_from([0.0, 1e6]),
  rows=st.lists(st.integers(0, 16), min_size=1, max_size=4),
)
def test_the_packed_merge_is_exact_and_the_tree_merge_bit_for_bit(seed, scale, offset, rows):
  rng = np.random.default_rng(seed)
  empty, layout, updates, merge_packed, merge_tree = mixed_programs()
  words, tree, seen = layout.empty, empty, []
  for n in rows:
    x = (rng.normal(size=16) * scale + offset).astype(np.float32)
    y = (rng.normal(size=16) * scale).astype(np.float32)
    target = rng.integers(0, 2, size=16).astype(np.int32)
    mask = np.arange(16) < n
    x[~mask], y[~mask] = np.nan, np.inf  # garbage in the padded rows
    batch = (updates(x, y, target, mask), ExactCount.of(np.int32(n)))
    words, tree = merge_packed(words, batch), merge_tree(tree, batch)
    seen.append((x[mask], y[mask], target[mask]))
  got = layout.unpack_host(np.asarray(words))
  assert_same_bits(got, jax.device_get(tree))
  x, y, target = (np.concatenate(parts).astype(np.float64) for parts in zip(*seen))
  assert got[1].to_numpy() == len(x)
  if not len(x):
    return
  logs = jax.device_get(jax.jit(lambda metric: metric.compute())(got[0]))
  for name, values in (("mean", x), ("weighted", y)):  # the exact totals, then the float32 mean
    total = got[0].children[name].total.to_numpy()
    np.testing.assert_allclose(total, values.sum(), rtol=0, atol=1e-12 * np.abs(values).sum())
    np.testing.assert_allclose(logs[name], values.mean(), rtol=2**-23)
  if len(x) > 2 and x.std() > 0:
    np.testing.assert_allclose(logs["pearson"], np.corrcoef(x, target)[0, 1], atol=1e-5)
  if 0 < target.sum() < len(target):
    np.testing.assert_allclose(logs["auroc"], roc_auc_score(target, x), rtol=1e-6)


def test_a_part_given_as_none_is_kept_as_it_is():
  """The row count of a run that counts rows on the host is not merged in the step."""
  metric = pe.metrics.Mean("x")
  empty = jax.device_get((metric.empty(), ExactCount.zeros()))
  layout = packing.StatePacking(empty)
  words = layout.pack_host((metric.empty(), ExactCount.of(np.int32(7))))
  batch = (
    metric.batch_updates(x=np.array([1.0, 2.0, np.nan]), mask=np.array([1, 1, 0], bool)),
    None,
  )
  mean, count = layout.unpack_host(np.asarray(jax.jit(layout.merge)(words, batch)))
  assert count.to_numpy() == 7
  assert float(mean.compute()) == 1.5
