"""The all-reduces in one compiled `masked_eval` step: what the multi-host has-data flag adds per step.

Used by tests/eval/test_step.py and benchmarks/bench_multihost.py. A step of P processes with one device
each is the same SPMD program as a step over a mesh of P devices in one process, so counting the collectives on
meshes of 2, 4 and 8 (virtual) devices shows how they grow with P.
"""

from __future__ import annotations

import re

import numpy as np

ROWS_PER_DEVICE = 8


def step_collectives(backend_name: str, devices: int, flagged: bool) -> list[str]:
  """The all-reduce instructions of one compiled step of a tiny Mean on ``devices`` devices.

  Args:
    backend_name: "pmap" (all local devices: ``devices`` must be their count), "shard_map" or "jit".
    devices: the mesh size.
    flagged: whether the step carries the has-data flag (``StepInput.sync``), as with unknown lengths.

  Returns:
    The result shape of each all-reduce in the compiled HLO, e.g. ``["s32[]"]``.
  """
  import jax
  from jax.sharding import Mesh

  import padded_eval as pe
  from padded_eval.eval.backends import StepInput, make_backend
  from padded_eval.eval.step import RowMask
  from padded_eval.exact.accumulate import ExactCount

  mesh = None if backend_name == "pmap" else Mesh(np.array(jax.devices()[:devices]), ("data",))
  if backend_name == "pmap" and devices != jax.local_device_count():
    raise ValueError("pmap runs on all local devices")
  backend = make_backend(backend_name, "data", mesh)

  def step_fn(params, batch):
    return pe.metrics.Mean("x").batch_updates(x=batch["x"][:, 0], mask=batch["mask"])

  compiled = backend.compile_step(step_fn, RowMask("mask"))
  rows = ROWS_PER_DEVICE * devices
  batch = {"x": np.zeros((rows, 3), np.float32), "mask": np.ones(rows, bool)}
  sync = (np.ones(backend.num_shards, np.int32),) if flagged else ()
  placed, params = backend.place_batch(StepInput(batch, sync)), backend.place_params(None)
  metric_shape, count_shape = compiled.state_shapes(params, placed.batch)
  state = backend.place_state((metric_shape.empty(), ExactCount.zeros(count_shape.shape)))
  text = compiled.step.lower(params, state, placed).compile().as_text()
  return re.findall(r"= (.+?) all-reduce(?:-start)?\(", text)
