"""masked_eval: exact full-dataset evaluation with one compiled step.

The driver turns ``step_fn(params, batch) -> Metric`` (masked statistics of one
padded batch) into one compiled function

    (params, state, batch) -> (state merged with this batch's statistics, token)

whose carried ``state`` (the metric and an exact count of real rows) stays on the
devices, with its buffers donated from step to step. Under ``"pmap"`` and
``"shard_map"`` each device carries its own partial state, so a step runs no
collective at all; the partial states are reduced exactly (``Metric.reduce``) once,
after the last step. Batches are placed on the
devices while the previous step runs, at most two steps are in flight (step t-1 is
waited for after step t is dispatched), and the state comes to the host once, at
the end. ``step_fn`` is traced once per call whatever the dataset length: the
empty state's structure comes from ``jax.eval_shape`` of the step on the first
batch, and that trace is reused by the compiled step (``step_fn`` is wrapped in a
cached ``jax.jit``, whose trace cache both share). Compiled steps are cached per
``(step_fn, backend, axes, devices)``, so a second call with the same shapes
compiles nothing.

Three backends place the work:

* ``"pmap"``: ``jax.pmap`` over the local devices; ``step_fn`` sees one device's
  rows ``[B // devices, ...]``; statistics are reduced with ``Metric.reduce`` at the end.
* ``"shard_map"``: ``jax.shard_map`` over a mesh; the batch is split over the
  mesh's first axis and replicated over the others; ``step_fn`` sees one shard.
* ``"jit"``: ``jax.jit``; ``step_fn`` sees the global batch, a ``jax.Array``
  sharded over the mesh's first axis; XLA inserts the reductions.
"""

from __future__ import annotations

import collections
import collections.abc as cabc
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from padded_eval import distributed
from padded_eval import sharding as sharding_lib
from padded_eval.accumulate import ExactCount
from padded_eval.metrics.base import Metric, check_choice

__all__ = ["masked_eval"]

BACKENDS = ("pmap", "shard_map", "jit")
NUM_EXAMPLES = "num_examples"


@dataclasses.dataclass(frozen=True)
class _Layout:
  """Where the work runs and how a host batch ``[B, ...]`` is laid out on the devices.

  Attributes:
    backend: one of ``BACKENDS``.
    mesh: the device mesh. For ``"pmap"``: the local devices on one axis, the
      layout ``jax.pmap`` itself uses, so placed batches are not copied again.
    data_axis: the mesh axis the rows are split over (the one reduced across).
    num_shards: how many parts this process's batch is split into along its rows.
  """

  backend: str
  mesh: Mesh
  data_axis: str

  @property
  def num_shards(self) -> int:
    # This process's part of the data axis: each process splits its own rows (all of it with one process).
    return self.mesh.local_mesh.shape[self.data_axis]

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec())

  @property
  def split(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec(self.data_axis))

  def place_params(self, params):
    """``params`` replicated on the devices, as the compiled step takes them.

    For pmap they travel as ``(anchor, params)`` with a scalar ``anchor``: jax.pmap
    misaligns ``in_axes=None`` when that argument has no leaves (``None``, ``{}``).
    """
    if self.backend == "pmap":
      params = (np.zeros((), np.int32), params)
    return jax.device_put(params, self.replicated)

  def place_batch(self, batch):
    """A checked host batch -> device arrays in the layout the compiled step takes."""
    if self.backend == "pmap":
      return jax.device_put(sharding_lib.shard(batch, self.num_shards), self.split)
    return sharding_lib.global_batch(batch, self.mesh, self.data_axis)

  def place_state(self, state):
    """The empty host state -> on the devices.

    ``"pmap"`` and ``"shard_map"`` carry one partial state per shard of the data axis
    (stacked on a leading axis, split over it): steps merge locally, with no
    collective, and the partial states are reduced once, at the end. ``"jit"``
    carries one replicated state.
    """
    # np.array copies: every leaf gets its own buffer, so none is donated twice.
    if self.backend == "pmap":
      state = jax.tree.map(lambda x: np.stack([np.array(x)] * self.num_shards), state)
      return jax.device_put(state, self.split)
    if self.backend == "shard_map":
      state = jax.tree.map(lambda x: np.stack([np.array(x)] * self.num_shards), state)
      return jax.tree.map(lambda x: jax.make_array_from_process_local_data(self.split, x), state)
    return jax.device_put(jax.tree.map(np.array, state), self.replicated)

  def state_to_host(self, state):
    """One device's copy of the (replicated) state, fetched in one transfer."""
    if self.backend == "pmap":
      local = jax.tree.map(lambda x: x.addressable_shards[0].data[0], state)
    else:
      local = jax.tree.map(lambda x: x.addressable_shards[0].data, state)
    return jax.device_get(local)


def _layout(backend: str, axis_name: str, mesh: Mesh | None) -> _Layout:
  """Checks the backend and mesh arguments and builds the layout."""
  check_choice("backend", backend, BACKENDS)
  if backend == "pmap":
    if mesh is not None:
      raise ValueError(
        "mesh is used by the 'shard_map' and 'jit' backends; backend='pmap' runs on "
        f"all local devices. Got mesh={mesh!r}; pass mesh=None or another backend."
      )
    return _Layout(backend, Mesh(np.array(jax.local_devices()), (axis_name,)), axis_name)
  if mesh is None:
    return _Layout(backend, Mesh(np.array(jax.devices()), (axis_name,)), axis_name)
  if not isinstance(mesh, Mesh):
    raise ValueError(f"mesh must be a jax.sharding.Mesh; got {type(mesh).__name__}")
  data_axis = mesh.axis_names[0]
  if axis_name != data_axis and axis_name in mesh.axis_names:
    raise ValueError(
      f"axis_name {axis_name!r} is not the mesh's first axis {data_axis!r}; the batch is "
      f"split over the first axis of mesh {dict(mesh.shape)}: put {axis_name!r} first"
    )
  return _Layout(backend, mesh, data_axis)


# --- host-side batch checks (each batch must match the first: no recompilation) -------


@dataclasses.dataclass(frozen=True)
class _BatchSpec:
  """The structure, shapes and dtypes every batch must have (the first batch's)."""

  treedef: Any
  leaves: tuple[tuple[tuple[int, ...], np.dtype], ...]
  batch_size: int


def _batch_spec(batch, mask_key: str, layout: _Layout, index: int) -> _BatchSpec:
  """Checks one host batch and returns its spec.

  Raises:
    ValueError: not a Mapping, no ``mask_key``, a mask that is not bool ``[B]``, a
      leaf whose leading size is not ``B``, a string leaf, or ``B`` not divisible by
      the shards of the data axis.
  """
  if not isinstance(batch, cabc.Mapping):
    raise ValueError(
      f"batch {index} is a {type(batch).__name__}; expected a dict of arrays with a "
      f"{mask_key!r} entry (use pe.pad_batches)"
    )
  if mask_key not in batch:
    raise ValueError(
      f"batch {index} has no mask key {mask_key!r}; got keys {sorted(map(str, batch))}. "
      "Pad batches with pe.pad_batches, which adds the mask of real rows."
    )
  mask_shape, mask_dtype = np.shape(batch[mask_key]), _dtype(batch[mask_key])
  if len(mask_shape) != 1 or mask_dtype != np.bool_:
    raise ValueError(
      f"batch {index}: {mask_key!r} has shape {mask_shape} and dtype {mask_dtype}; "
      "expected a bool array [batch_size]"
    )
  batch_size = mask_shape[0]
  flat, treedef = jax.tree_util.tree_flatten_with_path(batch)
  for path, leaf in flat:
    shape, dtype = np.shape(leaf), _dtype(leaf)
    if not shape or shape[0] != batch_size:
      raise ValueError(
        f"batch {index}: leaf {jax.tree_util.keystr(path)} has shape {shape}; expected "
        f"leading size {batch_size}, the size of {mask_key!r}"
      )
    if dtype.kind in "USO":
      raise ValueError(
        f"batch {index}: leaf {jax.tree_util.keystr(path)} holds strings ({dtype}), which "
        "cannot be placed on a device; drop it from the batch"
      )
  if batch_size % layout.num_shards:
    lower = max(batch_size // layout.num_shards, 1) * layout.num_shards
    where = (
      f"the {layout.num_shards} devices"
      if layout.mesh.devices.ndim == 1
      else f"the {layout.num_shards} shards of the mesh's first axis {layout.data_axis!r} "
      f"(mesh {dict(layout.mesh.shape)})"
    )
    raise ValueError(
      f"batch size {batch_size} is not divisible by {where}; use a multiple, e.g. "
      f"{lower} or {lower + layout.num_shards} (pe.pad_batches(..., num_devices="
      f"{layout.num_shards}))"
    )
  leaves = tuple((np.shape(leaf), _dtype(leaf)) for _, leaf in flat)
  return _BatchSpec(treedef, leaves, batch_size)


def _dtype(x) -> np.dtype:
  return np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype


def _check_same_spec(spec: _BatchSpec, first: _BatchSpec, index: int) -> None:
  if spec != first:
    raise ValueError(
      f"batch {index} has structure {spec.treedef} with (shape, dtype) {spec.leaves}; "
      f"expected the first batch's {first.treedef} with {first.leaves}. Every batch needs "
      "the same shapes (pad with pe.pad_batches), else the step recompiles."
    )


# --- multi-host seam: padded_eval.distributed ------------------------------------------


def _first_batch(host_batches, mask_key: str, layout: _Layout):
  """The first batch, checked, or None if there is none."""
  first = next(host_batches, None)
  if first is not None:
    _batch_spec(first, mask_key, layout, 0)
  return first


def _multihost(
  first_batch,
  host_batches,
  total,
  layout: _Layout,
  mask_key: str,
  steps_in_flight: int,
  timeout: float | None,
) -> distributed.Lockstep | None:
  """With several processes: agree on batch structure and steps (see `padded_eval.distributed`)."""
  settings = {
    "backend": layout.backend,
    "axis_name": layout.data_axis,
    "mask_key": mask_key,
    "mesh": {str(k): int(v) for k, v in layout.mesh.shape.items()},
    "steps_in_flight": steps_in_flight,
  }
  # The loop then keeps one step in flight (see distributed.MULTIHOST_STEPS_IN_FLIGHT).
  return distributed.lockstep(
    first_batch,
    host_batches,
    total,
    mask_key=mask_key,
    settings=settings,
    lookahead=distributed.MULTIHOST_STEPS_IN_FLIGHT + 1,
    timeout=timeout,
  )


# --- the compiled step ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _CompiledStep:
  """The mapped functions for one ``(step_fn, layout, mask_key)``.

  Attributes:
    batch_stats: ``(params, batch) -> reduced Metric`` of one batch; only
      ``jax.eval_shape``-d, which traces ``step_fn`` into the shared jit cache.
    step: ``(params, state, batch) -> (state, token)``; ``state`` is donated.
    finalize: ``state -> state`` reduced across the data axis (``"pmap"`` and
      ``"shard_map"``, whose steps merge per-shard partial states); ``None`` for
      ``"jit"``, whose state is already global.
  """

  batch_stats: Callable
  step: Callable
  finalize: Callable | None


def _checked(step_fn: Callable) -> Callable:
  """``step_fn`` that raises ValueError, at trace time, unless it returns a Metric."""

  @functools.wraps(step_fn)
  def checked_step_fn(params, batch):
    metric = step_fn(params, batch)
    if not isinstance(metric, Metric):
      raise ValueError(
        f"step_fn must return a padded_eval Metric holding the batch's masked statistics "
        f"(e.g. pe.metrics.Accuracy().update(preds=..., target=..., mask=batch['mask'])); "
        f"it returned a {type(metric).__module__}.{type(metric).__qualname__}"
      )
    return metric

  return checked_step_fn


@functools.lru_cache(maxsize=64)
def _compiled_step(
  step_fn: Callable, layout: _Layout, mask_key: str, flagged: bool = False
) -> _CompiledStep:
  """Builds (once per key) the batch-statistics and step functions of ``layout.backend``.

  ``flagged`` (several processes, some with unknown lengths): the step takes one more
  argument, ``more`` int32 ``[shards]`` (this process's has-data flag on each of its
  shards), and its token is the number of shards, over all processes, whose flag was 1.
  """
  inner = jax.jit(_checked(step_fn))  # one trace cache shared by batch_stats and step
  axis = layout.data_axis
  reduce = layout.backend != "jit"  # under jit, step_fn's sums are already global

  def reduced_stats(params, batch):
    metric = inner(params, batch)
    count = ExactCount.of(jnp.sum(batch[mask_key], dtype=jnp.int32))
    if reduce:
      metric, count = metric.reduce(axis), count.reduce(axis)
    return metric, count

  def masked_eval_step(params, state, batch, *more):
    # Under pmap / shard_map, ``state`` is this shard's partial state: merging is local
    # and exact, and the one reduction across devices happens in ``finalize``.
    metric = inner(params, batch)
    count = ExactCount.of(jnp.sum(batch[mask_key], dtype=jnp.int32))
    metric_total, count_total = state
    token = count.sync_token()
    if more:  # several processes, unknown lengths: one small psum of has-data flags
      token = jnp.sum(more[0])
      token = jax.lax.psum(token, axis) if reduce else token
    return (metric_total.merge(metric), count_total.merge(count)), token

  if layout.backend == "pmap":
    unanchored = lambda fn: lambda anchored_params, *args: fn(anchored_params[1], *args)
    batch_stats = jax.pmap(unanchored(reduced_stats), axis, in_axes=(None, 0))
    step = jax.pmap(
      unanchored(masked_eval_step), axis, in_axes=(None, 0, 0) + (0,) * flagged, donate_argnums=1
    )
    finalize = _finalize(layout)
  elif layout.backend == "shard_map":
    spec, split = PartitionSpec(), PartitionSpec(axis)
    batch_stats = jax.jit(
      jax.shard_map(reduced_stats, mesh=layout.mesh, in_specs=(spec, split), out_specs=spec)
    )

    def shard_step(params, state, batch, *more):  # state: this shard's [1, ...] block
      state, token = masked_eval_step(params, _unstack(state), batch, *more)
      return _restack(state), jnp.reshape(token, (1,))

    step = jax.jit(
      jax.shard_map(
        shard_step,
        mesh=layout.mesh,
        in_specs=(spec, split, split) + (split,) * flagged,
        out_specs=(split, split),
      ),
      donate_argnums=1,
    )
    finalize = _finalize(layout)
  else:
    batch_stats = jax.jit(reduced_stats)
    step = jax.jit(masked_eval_step, donate_argnums=1, out_shardings=layout.replicated)
    finalize = None
  return _CompiledStep(batch_stats, step, finalize)


def _unstack(tree):
  return jax.tree.map(lambda x: x[0], tree)


def _restack(tree):
  return jax.tree.map(lambda x: x[None], tree)


@functools.lru_cache(maxsize=64)
def _finalize(layout: _Layout) -> Callable:
  """``state -> state`` reduced across the data axis: the one collective of a call.

  Shared by every step function on ``layout``, so it compiles once per state structure.
  """
  axis = layout.data_axis

  def reduce_state(state):
    metric_total, count_total = state
    return metric_total.reduce(axis), count_total.reduce(axis)

  if layout.backend == "pmap":
    return jax.pmap(reduce_state, axis)
  split = PartitionSpec(axis)
  return jax.jit(
    jax.shard_map(
      lambda state: reduce_state(_unstack(state)),
      mesh=layout.mesh,
      in_specs=split,
      out_specs=PartitionSpec(),
    )
  )


def _compiled_step_for(step_fn, layout, mask_key, flagged=False) -> _CompiledStep:
  try:
    return _compiled_step(step_fn, layout, mask_key, flagged)
  except TypeError as e:  # an unhashable step_fn: build it uncached
    if "unhashable" not in str(e):
      raise
    return _compiled_step.__wrapped__(step_fn, layout, mask_key, flagged)


def _empty_state(compiled: _CompiledStep, params, placed_batch, layout: _Layout):
  """The empty (metric, count) state, shaped from ``eval_shape`` of the first batch."""
  shapes = jax.eval_shape(compiled.batch_stats, params, placed_batch)
  if layout.backend == "pmap":  # per-device copies: drop the leading device axis
    shapes = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), shapes)
  metric_shape, count_shape = shapes
  empty = (metric_shape.empty(), ExactCount.zeros(count_shape.shape))
  got = [(tuple(np.shape(x)), np.dtype(x.dtype)) for x in jax.tree.leaves(empty)]
  want = [(tuple(s.shape), np.dtype(s.dtype)) for s in jax.tree.leaves(shapes)]
  if jax.tree.structure(empty) != jax.tree.structure(shapes) or got != want:
    raise ValueError(
      f"{type(metric_shape).__name__}.empty() has state leaves (shape, dtype) {got} but "
      f"step_fn's metric has {want}; empty() must match an updated metric's structure, "
      "shapes and dtypes"
    )
  return layout.place_state(empty)


# --- the driver -----------------------------------------------------------------------


def masked_eval(
  step_fn: Callable[[Any, Any], Metric],
  params: Any,
  batches: cabc.Iterable,
  *,
  backend: str = "pmap",
  axis_name: str = "batch",
  mesh: Mesh | None = None,
  progress: bool = False,
  mask_key: str = "mask",
  steps_in_flight: int | None = None,
  timeout: float | None = None,
) -> dict[str, Any]:
  """Evaluates ``step_fn`` over every real row of ``batches``, exactly, compiling once.

  Args:
    step_fn: ``step_fn(params, batch) -> Metric``: the masked statistics of one
      batch (e.g. ``pe.metrics.Accuracy().batch_updates(preds=..., target=...,
      mask=batch["mask"])``). Under ``"pmap"`` and ``"shard_map"`` it sees one
      device's rows ``[B // shards, ...]`` and the driver reduces across
      ``axis_name``; under ``"jit"`` it sees the global batch ``[B, ...]``.
    params: any pytree, passed to ``step_fn`` as it is; placed once, replicated.
    batches: an iterable of dict batches whose every leaf is ``[B, ...]`` with the
      same ``B``, shapes and dtypes in every batch, and ``batch[mask_key]`` bool
      ``[B]`` True for real rows (as ``pe.pad_batches`` yields).
    backend: ``"pmap"``, ``"shard_map"`` or ``"jit"``.
    axis_name: the mapped axis name ``step_fn`` may use in collectives (pmap), and
      the name of the default mesh's one axis. With an explicit ``mesh`` the batch
      is split over ``mesh.axis_names[0]``.
    mesh: ``"shard_map"``/``"jit"`` only: the device mesh; rows are split over its
      first axis and replicated over the others. Default: all devices on one axis.
    progress: show a tqdm progress bar (batches, and real examples per second).
    mask_key: the batch key of the mask.
    steps_in_flight: at most this many dispatched steps not yet finished (>= 1).
      The next batch is always copied to the devices while the current step runs.
      Default 2: step t-1 is waited for after step t is dispatched, so the
      devices never idle on dispatch and the queue stays bounded (unbounded
      queues of pmap steps thrash CPU devices that share cores).
    timeout: several processes only: seconds to wait for the other processes (the
      pre-flight check, or one step) before raising; default
      ``padded_eval.distributed.DEFAULT_TIMEOUT_S`` (300). Must exceed the slowest
      process's compilation and per-batch loading time.

  Returns:
    ``metric.compute_logs()`` with scalars as Python floats and arrays as numpy
    arrays, plus ``"num_examples"``: the exact int number of real rows seen.

  Raises:
    ValueError: an unknown backend; a mesh with ``"pmap"``; no batches; a batch
      without ``mask_key`` or with a batch size not divisible by the devices (or
      the mesh's first axis); a batch whose shapes differ from the first; a
      ``step_fn`` that does not return a Metric; with several processes, batches or
      settings that differ between processes (on every process, naming the one
      that differs).
    TimeoutError: several processes: another process did not arrive, or a step did
      not finish, within ``timeout`` seconds.
    RuntimeError: several processes: a step failed, e.g. because another process died.

  Several processes (``jax.distributed``): each passes its own batches, of any
  number, known or not; every process runs the same steps and gets the same, global
  result (see `padded_eval.distributed`).

  Example:
    >>> import jax, numpy as np, padded_eval as pe
    >>> def step_fn(params, batch):
    ...   return pe.metrics.Mean().batch_updates(values=batch["x"] * params,
    ...                                          mask=batch["mask"])
    >>> batches = pe.pad_batches({"x": np.arange(5.0)}, 8, num_devices=1)
    >>> pe.masked_eval(step_fn, 2.0, batches, backend="jit",
    ...                mesh=jax.make_mesh((1,), ("batch",)))
    {'mean': 4.0, 'num_examples': 5}
  """
  layout = _layout(backend, axis_name, mesh)
  steps_in_flight = _steps_in_flight(steps_in_flight)
  total = _length(batches)
  host_batches = iter(batches)
  if timeout is not None:
    distributed.check_timeout(timeout)
  first_batch = lambda: _first_batch(host_batches, mask_key, layout)
  lockstep = _multihost(
    first_batch, host_batches, total, layout, mask_key, steps_in_flight, timeout
  )
  if lockstep is not None:  # every process now runs the same steps; a host without data pads
    first, host_batches = lockstep.first, lockstep
    steps_in_flight = distributed.MULTIHOST_STEPS_IN_FLIGHT
  else:
    first = first_batch()
  if first is None:
    raise ValueError(
      "batches yielded no batch; masked_eval needs at least one (an all-padding batch "
      "is fine: pe.pad_batches(..., num_batches=1))"
    )
  spec = _batch_spec(first, mask_key, layout, 0)
  flagged = lockstep is not None and lockstep.flagged
  compiled = _compiled_step_for(step_fn, layout, mask_key, flagged)
  params = layout.place_params(params)
  placed = layout.place_batch(first)
  state = _empty_state(compiled, params, placed, layout)
  bar = _ProgressBar(total, mask_key) if progress else None
  if bar:
    bar.add(first)

  in_flight: collections.deque = collections.deque()  # tokens of the steps not yet waited for
  index = 0
  while placed is not None:
    more = (
      (layout.place_batch(np.full(layout.num_shards, lockstep.flag(index), np.int32)),)
      if flagged
      else ()
    )
    state, token = compiled.step(params, state, placed, *more)  # dispatch step t
    in_flight.append((index, token))
    placed, index = None, index + 1
    batch = next(host_batches, None)
    if batch is not None:  # place batch t+1 while step t runs
      _check_same_spec(_batch_spec(batch, mask_key, layout, index), spec, index)
      placed = layout.place_batch(batch)
      if bar:
        bar.add(batch)
    while len(in_flight) >= steps_in_flight:  # bounded: wait on step t-1 (or t)
      _wait(lockstep, *in_flight.popleft())
  while in_flight and lockstep is not None:
    _wait(lockstep, *in_flight.popleft())
  if compiled.finalize is not None:  # the one reduction across devices (and processes)
    state = compiled.finalize(state)
    if lockstep is not None:
      lockstep.wait(index, state[1].sync_token())
  metric, count = layout.state_to_host(state)
  if bar:
    bar.close()
  return _results(metric, count)


def _wait(lockstep: distributed.Lockstep | None, index: int, token) -> None:
  """Waits for step ``index`` (with a deadline and the has-data count with several processes)."""
  if lockstep is None:
    token.block_until_ready()
    return
  live = lockstep.wait(index, token)
  if lockstep.flagged:
    lockstep.observe(index, int(np.ravel(live)[0]))


def _steps_in_flight(steps_in_flight: int | None) -> int:
  if steps_in_flight is None:
    return 2
  if (
    isinstance(steps_in_flight, bool) or not isinstance(steps_in_flight, int) or steps_in_flight < 1
  ):
    raise ValueError(f"steps_in_flight must be an int >= 1; got {steps_in_flight!r}")
  return steps_in_flight


def _results(metric: Metric, count: ExactCount) -> dict[str, Any]:
  logs = dict(metric.compute_logs())
  if NUM_EXAMPLES in logs:
    raise ValueError(
      f"the metric logs a value named {NUM_EXAMPLES!r}, which masked_eval reserves for "
      "the count of real rows; rename the metric (name=...)"
    )
  logs = jax.tree.map(_to_python, logs)
  logs[NUM_EXAMPLES] = int(count.to_numpy())
  return logs


def _to_python(value):
  """A scalar -> Python float; an array -> numpy array."""
  value = np.asarray(value)
  return float(value) if value.ndim == 0 else value


def _length(batches) -> int | None:
  try:
    return len(batches)
  except TypeError:
    return None


class _ProgressBar:
  """A tqdm bar over batches showing real examples per second (counted on the host)."""

  def __init__(self, total: int | None, mask_key: str):
    import tqdm  # imported only when asked for

    self._bar = tqdm.tqdm(total=total, unit="batch", desc="masked_eval")
    self._mask_key = mask_key
    self._examples = 0
    self._start = time.perf_counter()

  def add(self, batch) -> None:
    self._examples += int(np.count_nonzero(np.asarray(batch[self._mask_key])))
    elapsed = max(time.perf_counter() - self._start, 1e-9)
    self._bar.set_postfix(
      examples=self._examples, ex_per_s=f"{self._examples / elapsed:.0f}", refresh=False
    )
    self._bar.update(1)

  def close(self) -> None:
    self._bar.close()
