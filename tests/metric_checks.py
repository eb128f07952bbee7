"""Generic checks of the Metric protocol, run on every row of ``tests/metric_cases.py``.

Each ``check_*(case)`` asserts one promise of DESIGN.md ("Metrics", "Exactness")
against the case's float64 reference; :func:`check_all` runs them all. Other test
files import these to check their own cases::

  from metric_checks import CHECKS, check_all  # tests/ is on sys.path under pytest

The tests run with 8 virtual CPU devices (``tests/conftest.py``). Programs with
collectives (pmap with ``reduce``/``all_gather``, jitted code over pmap-sharded arrays)
are waited on one at a time: XLA's CPU client deadlocks, then aborts, when more than
about 32 are in flight (HOWTO.md, "Driving metrics yourself").

The second half of the file is the property suite's engine (:func:`evaluate_randomly`:
random padded batchings, merge trees and device counts), used by
``tests/metrics/**/test_properties_*.py``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec
from metric_cases import MetricCase, poison

import padded_eval as pe

AXIS = "devices"


def _value(metric) -> np.ndarray:
  return np.asarray(jax.device_get(metric.compute()), np.float64)


def assert_matches_reference(case: MetricCase, metric, batches, how: str) -> None:
  np.testing.assert_allclose(
    _value(metric),
    case.reference(batches),
    rtol=case.rtol,
    atol=case.atol,
    equal_nan=True,
    err_msg=f"{case.name}: {how}",
  )


def _eager(case, batches):
  metric = case.make()
  for batch in batches:
    metric = metric.update(**batch)
  return metric


def _device_count() -> int:
  return jax.local_device_count()


def _shard(batch, n):
  return jax.tree.map(lambda x: np.reshape(x, (n, x.shape[0] // n) + x.shape[1:]), batch)


def _first_copy(tree):
  return jax.tree.map(lambda x: x[0], tree)


def check_eager(case: MetricCase) -> None:
  """Sequential eager updates match the reference."""
  batches = case.batches()
  assert_matches_reference(case, _eager(case, batches), batches, "eager updates")


_FLOAT_GARBAGE = (np.nan, -3.0, np.inf)
_INT_GARBAGE = (-1, 2**20, 7)


def weight_zero_row(batch: dict, step: int) -> tuple[dict, dict]:
  """``(weight 0, masked)``: ``batch`` with its first real row given weight 0 and garbage (the
  ``step``-th of NaN / -3 / inf, or of -1 / 2**20 / 7 for ints: NaN, values outside a domain,
  ids out of range) in every input, and the same batch with that row masked out instead."""
  mask = np.asarray(batch["mask"])
  row = int(np.argmax(np.any(mask.reshape(len(mask), -1), axis=1)))
  zero = {key: np.array(value, copy=True) for key, value in batch.items()}
  for key, value in zero.items():
    if key == "weights":
      value[row] = 0
    elif key != "mask" and np.issubdtype(value.dtype, np.floating):
      with np.errstate(over="ignore"):  # inf in float16: garbage either way
        value[row] = _FLOAT_GARBAGE[step % len(_FLOAT_GARBAGE)]
    elif key != "mask" and np.issubdtype(value.dtype, np.integer):
      value[row] = _INT_GARBAGE[step % len(_INT_GARBAGE)]
  masked = dict(zero, mask=np.array(mask, copy=True))
  masked["mask"][row] = False
  return zero, masked


def check_padding_changes_nothing(case: MetricCase) -> None:
  """Sequential eager updates match the reference (`check_eager`), and fresh garbage in padded
  elements, and an extra all-padding batch, change no bit. A case with ``weights``: a real row
  of weight 0 per batch, holding garbage, changes nothing either (DESIGN.md, "Trust"): the value
  (bitwise) and ``invalid_counts()`` are those of the batches with that row masked out."""
  batches = case.batches()
  rng = np.random.default_rng(1)
  repoisoned = [poison(b, rng) for b in batches]
  all_padding = poison({**batches[0], "mask": np.zeros_like(batches[0]["mask"])}, rng)
  eager = _eager(case, batches)
  assert_matches_reference(case, eager, batches, "eager updates")
  expected = _value(eager)
  np.testing.assert_array_equal(_value(_eager(case, repoisoned)), expected)
  np.testing.assert_array_equal(_value(_eager(case, repoisoned + [all_padding])), expected)
  if "weights" in batches[0]:
    zero, masked = zip(*(weight_zero_row(b, step) for step, b in enumerate(batches)))
    zero, masked = _eager(case, zero), _eager(case, masked)
    assert zero.invalid_counts() == masked.invalid_counts(), f"{case.name}: weight 0"
    np.testing.assert_array_equal(_value(zero), _value(masked), err_msg=f"{case.name}: weight 0")


def check_split_and_merge(case: MetricCase) -> None:
  """One update on everything == per-batch metrics merged (both orders) == reference."""
  batches = case.batches()
  whole = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
  assert_matches_reference(case, case.make().update(**whole), batches, "one whole batch")
  parts = [case.make().batch_updates(**b) for b in batches]
  forward = functools.reduce(lambda a, b: a.merge(b), parts)
  backward = functools.reduce(lambda a, b: a.merge(b), parts[::-1])
  assert_matches_reference(case, forward, batches, "merged batch_updates")
  assert_matches_reference(case, backward, batches, "merged in reverse")
  if np.ndim(batches[0]["mask"]) == 1:  # rows can be dropped: unpadded, unmasked
    unpadded = {k: v[whole["mask"]] for k, v in whole.items() if k != "mask"}
    assert_matches_reference(case, case.make().update(**unpadded), batches, "no padding")


def check_merge_laws(case: MetricCase) -> None:
  """merge is commutative (bitwise) and associative (to rounding)."""
  a, b, c = (case.make().batch_updates(**batch) for batch in case.batches()[:3])
  np.testing.assert_array_equal(_value(a.merge(b)), _value(b.merge(a)))
  np.testing.assert_allclose(
    _value(a.merge(b).merge(c)), _value(a.merge(b.merge(c))), rtol=1e-6, atol=1e-7, equal_nan=True
  )
  empty = case.make()
  np.testing.assert_allclose(
    _value(a.merge(empty)), _value(a), rtol=1e-6, atol=1e-7, equal_nan=True
  )


def check_jit_traces_once(case: MetricCase) -> None:
  """A jitted update traces once for all batches and matches the reference."""
  batches = case.batches()
  traces = []

  @jax.jit
  def step(metric, batch):
    traces.append(1)
    return metric.update(**batch)

  metric = case.make()
  for batch in batches:
    metric = step(metric, batch)
  assert len(traces) == 1, f"{case.name}: the jitted update traced {len(traces)} times"
  assert_matches_reference(case, metric, batches, "jit")


def check_scan(case: MetricCase) -> None:
  """``lax.scan`` carrying an empty metric matches the reference."""
  batches = case.batches()
  stacked = jax.tree.map(lambda *xs: np.stack(xs), *batches)
  scan = jax.jit(lambda m, bs: jax.lax.scan(lambda c, b: (c.update(**b), None), m, bs)[0])
  assert_matches_reference(case, scan(case.make(), stacked), batches, "lax.scan")


def check_pmap(case: MetricCase) -> None:
  """In one ``jax.pmap`` program: ``reduce`` gives every device the total,
  ``all_gather(...).aggregate()`` too, and ``aggregate()`` of the per-device copies it returns
  (on the host) as well; each merged over the steps == reference."""
  batches, n = case.batches(), _device_count()

  def per_device(batch):
    part = case.make().batch_updates(**batch)
    return part.reduce(AXIS), jax.lax.all_gather(part, AXIS).aggregate(), part

  step = jax.pmap(per_device, axis_name=AXIS)
  via_reduce, via_gather, via_copies = case.make(), case.make(), case.make()
  for batch in batches:
    reduced, gathered, copies = step(_shard(batch, n))
    reduced, gathered = jax.device_get((reduced, gathered))  # one collective program at a time
    for leaf in jax.tree.leaves(reduced):
      np.testing.assert_array_equal(np.asarray(leaf), np.broadcast_to(leaf[0], leaf.shape))
    via_reduce = via_reduce.merge(_first_copy(reduced))
    via_gather = via_gather.merge(_first_copy(gathered))
    # aggregate() of pmap's outputs fetches them to the host first (no cross-device programs)
    via_copies = via_copies.merge(copies.aggregate())
  assert_matches_reference(case, via_reduce, batches, "pmap reduce")
  assert_matches_reference(case, via_gather, batches, "pmap all_gather aggregate")
  assert_matches_reference(case, via_copies, batches, "aggregate of pmap output")


def check_shard_map(case: MetricCase) -> None:
  """``jax.shard_map`` over a 1-D mesh with ``reduce`` inside matches the reference."""
  batches = case.batches()
  mesh = jax.make_mesh((_device_count(),), (AXIS,))
  step = jax.jit(
    jax.shard_map(
      lambda m, b: m.merge(case.make().batch_updates(**b).reduce(AXIS)),
      mesh=mesh,
      in_specs=(PartitionSpec(), PartitionSpec(AXIS)),
      out_specs=PartitionSpec(),
    )
  )
  metric = jax.device_put(case.make(), NamedSharding(mesh, PartitionSpec()))
  for batch in batches:
    metric = step(metric, jax.device_put(batch, NamedSharding(mesh, PartitionSpec(AXIS))))
    jax.block_until_ready(metric)  # one collective program at a time
  assert_matches_reference(case, metric, batches, "shard_map reduce")


def assert_empty_like_updated(case: MetricCase, batch: dict) -> None:
  """``make()``, ``reset()`` and ``empty()`` have the structure, shapes and dtypes of an update."""
  updated = case.make().update(**batch)
  for empty in (case.make(), updated.reset(), updated.empty()):
    assert jax.tree.structure(empty) == jax.tree.structure(updated)
    for got, want in zip(jax.tree.leaves(empty), jax.tree.leaves(updated)):
      assert (jnp.shape(got), jnp.result_type(got)) == (jnp.shape(want), jnp.result_type(want))


def check_empty_state(case: MetricCase) -> None:
  """``empty()``/``reset()`` have the updated state's structure, shapes and dtypes; NaN in jit."""
  batch = case.batches()[0]
  assert_empty_like_updated(case, batch)
  assert np.all(np.isnan(np.asarray(jax.jit(lambda m: m.compute())(case.make()))))
  all_padding = {**batch, "mask": np.zeros_like(batch["mask"])}
  seen_nothing = jax.jit(lambda m, b: m.update(**b).compute())(case.make(), all_padding)
  assert np.all(np.isnan(np.asarray(seen_nothing)))


def check_bad_mask(case: MetricCase) -> None:
  """A mask of the wrong shape or dtype raises ValueError naming ``mask``."""
  batch = case.batches()[0]
  mask = np.asarray(batch["mask"])
  bad_masks = [
    mask.astype(np.float32),
    mask.astype(np.int32),
    np.ones((mask.shape[0] + 1,) + mask.shape[1:], bool),
    np.ones(mask.shape + (99, 2), bool),
  ]
  for bad in bad_masks:
    with pytest.raises(ValueError, match="mask"):
      case.make().update(**{**batch, "mask": bad})
    with pytest.raises(ValueError, match="mask"):
      jax.jit(lambda m, b: m.update(**b))(case.make(), {**batch, "mask": bad})


CHECKS = [  # check_eager is the first half of check_padding_changes_nothing
  check_padding_changes_nothing,
  check_split_and_merge,
  check_merge_laws,
  check_jit_traces_once,
  check_scan,
  check_pmap,
  check_shard_map,
  check_empty_state,
  check_bad_mask,
]


def check_all(case: MetricCase) -> None:
  """Runs every generic check on ``case``."""
  for check in CHECKS:
    check(case)


# --- the property suite's engine: random batchings, merge trees and device counts ----------
#
# ``evaluate_randomly(metric, fields, rng)`` feeds the real rows of ``fields`` (arrays with
# a leading row axis) to ``metric`` the way an evaluation loop might: split at random
# points into padded batches of one random size (padded rows hold NaN, inf, huge and
# random values), ``batch_updates`` per batch (jitted, one trace per shape), the partial
# states dealt to ``k`` in 1..8 "devices", merged on each device in a random merge tree,
# then stacked on a leading axis and ``aggregate()``d, as after pmap. The result must not
# depend on any of these choices, so the tests compare it with a float64 reference.

BATCH_SIZES = (5, 16)
DEVICE_SLOTS = 8
_PAD_FLOATS = np.array([np.nan, np.inf, -np.inf, 3e38, -3e38, 1e30, -7.0, 0.0], np.float64)

jit_batch_updates = jax.jit(lambda metric, batch: metric.batch_updates(**batch))
jit_merge = jax.jit(lambda a, b: a.merge(b))
jit_aggregate = jax.jit(lambda stacked: stacked.aggregate())
jit_compute = jax.jit(lambda metric: metric.compute())


def pad_rows(values: np.ndarray, real: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """``values`` of a padded batch: ``real`` rows kept, the other rows fresh garbage."""
  shape = values.shape
  if np.issubdtype(values.dtype, np.floating):
    garbage = np.where(
      rng.random(shape) < 0.5,
      rng.choice(_PAD_FLOATS, size=shape),
      rng.standard_normal(shape) * 10.0 ** rng.integers(-30, 30, size=shape),
    )
  elif values.dtype == np.bool_:
    garbage = rng.random(shape) < 0.5
  else:
    garbage = rng.integers(-(2**30), 2**30, size=shape)
  keep = real.reshape(real.shape + (1,) * (values.ndim - 1))
  with np.errstate(over="ignore", invalid="ignore"):
    return np.where(keep, values, garbage.astype(values.dtype))


def random_batches(fields: dict, rng: np.random.Generator, batch_size: int) -> list[dict]:
  """The rows of ``fields`` split at random points into batches of ``batch_size`` rows.

  Each batch holds 0..batch_size real rows at random positions (``mask`` ``[B]``); an
  all-padding batch may appear anywhere. The rows keep their order.
  """
  num_rows = len(next(iter(fields.values())))
  batches, start = [], 0
  while start < num_rows or not batches:
    take = int(rng.integers(0, min(batch_size, num_rows - start) + 1))
    if rng.random() < 0.5:  # favour fuller batches, keep the count of batches small
      take = min(batch_size, num_rows - start)
    mask = np.zeros(batch_size, bool)
    mask[np.sort(rng.choice(batch_size, size=take, replace=False))] = True
    batch = {"mask": mask}
    for key, value in fields.items():
      rows = np.zeros((batch_size,) + value.shape[1:], value.dtype)
      rows[mask] = value[start : start + take]
      batch[key] = pad_rows(rows, mask, rng)
    batches.append(batch)
    start += take
  return batches


def merge_randomly(parts: list, rng: np.random.Generator):
  """``parts`` merged in a random binary tree, each merge in a random order."""
  parts = [parts[i] for i in rng.permutation(len(parts))]
  while len(parts) > 1:
    i = int(rng.integers(len(parts) - 1))
    a, b = parts[i], parts[i + 1]
    parts[i : i + 2] = [jit_merge(a, b) if rng.random() < 0.5 else jit_merge(b, a)]
  return parts[0]


def aggregate_over_devices(metric, parts: list, rng: np.random.Generator, devices: int):
  """``parts`` dealt at random to ``devices`` partial states, then ``aggregate()``d.

  The states sit on a stacked axis of 8 (``DEVICE_SLOTS``) at random positions, the
  other slots empty (devices that saw only padding), so the jitted ``aggregate``
  compiles once per metric; ``test_properties_devices.py`` varies the axis length.
  """
  owner = rng.integers(devices, size=len(parts))
  # A device's partial state is a total (its batches merged into empty(), as a loop carries it):
  # one batch's state of an exact curve metric holds only that batch's slots.
  per_device = [
    jit_merge(metric.empty(), merge_randomly([p for p, o in zip(parts, owner) if o == d], rng))
    if any(o == d for o in owner)
    else metric.empty()
    for d in range(devices)
  ]
  slots = [metric.empty()] * (DEVICE_SLOTS - devices) + per_device
  slots = [slots[i] for i in rng.permutation(DEVICE_SLOTS)]
  stacked = jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *slots)
  return jit_aggregate(stacked)


def evaluate_randomly(metric, fields: dict, rng: np.random.Generator, batch_sizes=BATCH_SIZES):
  """``metric`` over the real rows of ``fields`` by a random batching (of one of
  ``batch_sizes`` rows), merge tree and device count (see above); the computed value as
  float64 numpy (a dict of them for a collection)."""
  batch_size = int(rng.choice(batch_sizes))
  parts = [jit_batch_updates(metric, b) for b in random_batches(fields, rng, batch_size)]
  total = aggregate_over_devices(metric, parts, rng, int(rng.integers(1, 9)))
  return jax.tree.map(lambda v: np.asarray(v, np.float64), jax.device_get(jit_compute(total)))


def assert_close(got, expected, *, atol, rtol=0.0, what: str = "") -> None:
  """``|got - expected| <= atol + rtol * |expected|`` elementwise; NaN must match NaN."""
  got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
  np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def with_garbage_rows(
  rng: np.random.Generator, arrays: dict, pad: int, float_garbage: np.ndarray, int_bound: int
) -> dict:
  """``arrays`` plus ``pad`` garbage rows each (floats drawn from ``float_garbage``, ints from
  ``[-int_bound, int_bound)``), and the ``[n + pad]`` row mask under ``"mask"``."""
  out = {}
  for key, value in arrays.items():
    value = np.asarray(value)
    shape = (pad,) + value.shape[1:]
    if np.issubdtype(value.dtype, np.floating):
      garbage = rng.choice(float_garbage, size=shape).astype(value.dtype)
    else:
      garbage = rng.integers(-int_bound, int_bound, size=shape).astype(value.dtype)
    out[key] = np.concatenate([value, garbage])
  n = len(next(iter(arrays.values())))
  out["mask"] = np.arange(n + pad) < n
  return out


def check_masked_eval_on_8_devices(
  case: MetricCase, rtol: float = 2e-6, atol: float = 1e-7
) -> None:
  """``pe.masked_eval`` (default backend, 8 devices) of the case's metric equals its reference."""
  assert jax.local_device_count() == 8
  make = case.make

  def step(params, batch):
    return make().batch_updates(**batch)

  batches = case.batches()
  logs = pe.masked_eval(step, None, batches)
  np.testing.assert_allclose(logs[make().name], case.reference(batches), rtol=rtol, atol=atol)
