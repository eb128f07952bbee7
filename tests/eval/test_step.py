"""padded_eval.eval.step, the step every backend maps: a step_fn that cannot be called or reads a
missing key is named (issue 65), and the unknown-length lockstep costs one small all-reduce per step, whatever the process count, and no request
to the coordination service.

A step of P processes with one device each is the same SPMD program as a step over a mesh of P devices in one
process: the compiled steps over meshes of 2, 4 and 8 devices (tests/conftest.py's virtual CPU devices) show
what the has-data flag adds as P grows.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _counting_client import CountingClient
from _step_collectives import step_collectives

import padded_eval as pe
from padded_eval.multihost import _coordination as coordination
from padded_eval.multihost import distributed

SCALAR = "s32[]"


@pytest.mark.parametrize("backend", ["shard_map", "jit"])
def test_flag_adds_one_scalar_all_reduce_whatever_the_mesh_size(backend):
  shapes_at = {}
  for devices in (2, 4, 8):
    without, flagged = (
      step_collectives(backend, devices, False),
      step_collectives(backend, devices, True),
    )
    shapes_at[devices] = (without, flagged)
    for shape in without + flagged:  # small fixed sizes (a metric's stacked totals), no more
      assert re.fullmatch(r"\(?((s32|f32)\[\d?\](\{0\})?(, )?)+\)?", shape), (devices, shape)
    if backend == "shard_map":  # per-device states: the flag's psum is the step's only collective
      assert (without, flagged) == ([], [SCALAR]), devices
    else:  # a global state: the flag's sum joins an existing all-reduce as one more scalar operand
      assert len(flagged) == len(without), (devices, without, flagged)
      assert " ".join(flagged).count(SCALAR) == " ".join(without).count(SCALAR) + 1
  assert shapes_at[2] == shapes_at[4] == shapes_at[8]  # no size grows with P


def test_pmap_flag_is_the_steps_only_collective():
  devices = jax.local_device_count()
  assert step_collectives("pmap", devices, False) == []
  assert step_collectives("pmap", devices, True) == [SCALAR]


def test_lockstep_steps_make_no_coordination_request(monkeypatch):
  client = CountingClient(1)
  monkeypatch.setattr(coordination.Peers, "current", classmethod(lambda cls: cls(client, 0, 1)))
  batches = iter(
    [{"x": np.full((4, 2), i, np.float32), "mask": np.ones(4, bool)} for i in range(5)]
  )
  options = distributed.FeedOptions(mask_key="mask", settings={}, num_shards=2, timeout=5.0)
  feed = distributed.lockstep(batches, None, options)
  after_preflight = client.requests
  assert after_preflight == 4 * 1 + 2  # the pre-flight of agreement.py: 4P + 2
  steps = 0
  for step, inputs in enumerate(feed):
    (flag,) = inputs.sync
    total = jnp.asarray(np.sum(flag))  # what the step's psum returns with one process
    feed.wait(step, (jnp.asarray(0), (total,)))
    steps += 1
  assert steps == 5 and feed.batches_consumed == 5
  assert client.requests == after_preflight  # per step: zero requests


# ---- a step_fn that cannot be called or reads a missing key (issue 65) ----

DATA = {"image": np.ones((13, 3), np.float32), "label": np.arange(13) % 3}


def test_a_step_fn_of_the_wrong_signature_is_named():
  # Before: a bare "<lambda>() takes 1 positional argument but 2 were given".
  def step(batch):
    return pe.metrics.Mean("image").batch_updates(image=batch["image"], mask=batch["mask"])

  with pytest.raises(
    TypeError, match=r"step_fn\(params, batch\), but step_fn .*step\(batch\)"
  ) as e:
    pe.masked_eval(step, None, pe.pad_batches(DATA, 8), backend="jit")
  assert "['image', 'label', 'mask']" in str(e.value)


def test_a_missing_batch_key_lists_the_batch_keys():
  # Before: a bare KeyError: 'labels'.
  def step(params, batch):
    return pe.metrics.Mean("label").batch_updates(label=batch["labels"], mask=batch["mask"])

  with pytest.raises(
    KeyError, match=r"step_fn .* read the batch key 'labels', which the batch lacks"
  ) as e:
    pe.masked_eval(step, None, pe.pad_batches(DATA, 8), backend="jit")
  assert "the batch's keys: ['image', 'label', 'mask']" in str(e.value)
