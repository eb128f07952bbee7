"""Where `masked_eval`'s work runs: one `Backend` class per backend, chosen by name in `BACKENDS`.

A backend places the params, each step's input and the empty state on the devices,
compiles the step ``(params, state, StepInput) -> (state, token)``, reduces the
per-device partial states once at the end (`Backend.finalize`) and fetches the state
to the host. The driver (`padded_eval.evaluate`) never tests the backend's name: it
calls these methods. Adding a backend is one class here plus one line in `BACKENDS`.

* `PmapBackend` (``"pmap"``): ``jax.pmap`` over the local devices; ``step_fn`` sees one
  device's rows ``[B // devices, ...]``. With one process the step is what ``jax.pmap``
  runs (``jax.jit`` of a ``jax.shard_map``), called directly: pmap's per-call Python is
  a noticeable part of a short evaluation.
* `ShardMapBackend` (``"shard_map"``): ``jax.shard_map`` over a mesh; rows are split over
  the mesh's data axes (`padded_eval.sharding.data_axes`) and replicated over the others;
  ``step_fn`` sees one shard and whole, replicated params.
* `JitBackend` (``"jit"``): ``jax.jit``; ``step_fn`` sees the global batch, a
  ``jax.Array`` sharded over the data axes; params that are ``jax.Array``s on the mesh keep
  their shardings (FSDP, tensor parallel: no copy, no gather); XLA inserts the reductions.

Under pmap and shard_map every shard of the data axis carries its own partial state
(stacked on a leading axis): a step merges locally and runs no collective; `finalize`
reduces the partial states exactly, once: small states (one process) are fetched and
combined with ``aggregate()`` in one single-device program
(`padded_eval.placement.combined_on_one_device`), larger ones by ``Metric.reduce``, the one
collective of a call. The pieces of the step itself are in `padded_eval.step_parts`.

A small state with one process and no checkpoint is carried packed, one ``uint8`` vector per
shard (`padded_eval.packing`; ``CompiledStep.packed_step``, ``place_packed``, and the
``packing`` argument of ``finalize`` and ``to_host``): a short evaluation then copies one
array per shard instead of one per leaf and shard.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from padded_eval import packing as packing_lib
from padded_eval import placement, step_parts
from padded_eval import sharding as sharding_lib
from padded_eval.step_parts import checked_step_fn
from padded_eval.validation import check_choice

__all__ = ["BACKENDS", "Backend", "CompiledStep", "StepInput", "checked_step_fn", "make_backend"]


class StepInput(NamedTuple):
  """What one compiled step consumes, besides params and state (a pytree, placed as one).

  Attributes:
    batch: the padded batch, a dict of arrays ``[B, ...]`` with a bool mask ``[B]``.
    sync: small int32 arrays ``[shards]`` that the step sums over every shard of every
      process, returned in its token (the multi-host has-data flag); ``()`` for none,
      which adds no collective.
  """

  batch: Any
  sync: tuple = ()


@dataclasses.dataclass(frozen=True)
class CompiledStep:
  """The compiled functions of one ``(step_fn, backend, mask_key)``.

  Attributes:
    state_shapes: ``(placed params, placed batch) -> (metric, ExactCount)`` of
      ``jax.ShapeDtypeStruct``: one shard's carried state, from ``jax.eval_shape`` of the
      step's statistics (which traces ``step_fn`` into the jit cache the step reuses).
    step: ``(placed params, state, placed StepInput) -> (state, token, per_row)``;
      ``state`` is donated. ``token`` is ``(rows_so_far, sync_totals)``: a small array
      that is ready when the step has finished, and each ``sync`` array summed over all
      shards. ``per_row`` is what ``step_fn`` returned next to its metric (``outputs=True``),
      rows split over the data axis like the batch; None without outputs.
    step_keeping_state: the same step without donating ``state``: for a small empty state
      that is placed once and reused by every call (`padded_eval.placement.placed_once`).
    packed_step: ``packing -> step`` for a `padded_eval.packing.StatePacking`: the step
      (not donating) whose carried state is one ``uint8`` vector per shard
      (`padded_eval.step_parts.packed`); compiled on first use. On a backend whose
      ``counts_rows_on_host`` is True and with a mask key, it does not count the real
      rows: the driver does, on the host.
  """

  state_shapes: Callable
  step: Callable
  step_keeping_state: Callable
  packed_step: Callable


@runtime_checkable
class Backend(Protocol):
  """How the work of `masked_eval` is laid out on the devices.

  Attributes:
    mesh: the device mesh (for pmap: the local devices on one axis).
    data_axes: the mesh axes the rows are split over (the ones reduced across).
    data_axis: the same as collectives take it: the one name, or the tuple of names.
    num_shards: how many parts this process's batch is split into along its rows.
  """

  mesh: Mesh
  data_axes: tuple[str, ...]
  row_axes: int  # leading axes of a step's per_row output that index rows (pmap: device, row)
  counts_rows_on_host: bool  # packed steps with a mask key leave the row count to the driver

  @property
  def data_axis(self) -> str | tuple[str, ...]: ...

  @property
  def num_shards(self) -> int: ...

  @classmethod
  def create(cls, axis_name: str, mesh: Mesh | None, data_axes: Any = None) -> Backend:
    """The backend for ``masked_eval(axis_name=..., mesh=..., data_axes=...)``; ValueError on a
    bad mesh or data axes."""
    ...

  def place_params(self, params: Any) -> Any:
    """``params`` on the devices as the compiled step takes them (replicated, or as sharded)."""
    ...

  def place_batch(self, inputs: StepInput) -> Any:
    """A checked host `StepInput` -> device arrays in the layout the compiled step takes."""
    ...

  def place_state(self, state: Any) -> Any:
    """The empty host state (one shard's) -> the carried device state."""
    ...

  def place_packed(self, packing: Any) -> Any:
    """``packing.empty`` (one shard's packed empty state) -> the carried packed device state,
    placed once and reused (`padded_eval.placement.placed_once`)."""
    ...

  def place_saved_state(self, state: Any) -> Any:
    """This process's saved part of a carried state (see `local_part`) -> the carried device state."""
    ...

  def local_part(self, leaf: jax.Array) -> np.ndarray:
    """This process's part of one carried state leaf, as numpy (what a checkpoint saves)."""
    ...

  @property
  def layout(self) -> dict:
    """The backend and its device layout as JSON (what a checkpoint must match)."""
    ...

  def compile_step(self, step_fn: Callable, mask_key: str, outputs: bool = False) -> CompiledStep:
    """The (not yet cached) compiled functions for ``step_fn`` (which returns ``(metric, per_row)``
    when ``outputs``)."""
    ...

  def finalize(self, state: Any, packing: Any = None) -> Any:
    """The carried state -> the global state: the one exact reduce across shards (``packing``:
    the state is packed by this `padded_eval.packing.StatePacking`, and stays packed)."""
    ...

  def to_host(self, state: Any, packing: Any = None) -> Any:
    """One copy of the finalized (replicated) state, as numpy, in one transfer (unpacked)."""
    ...


@functools.lru_cache(maxsize=64)
def _finalize_program(backend: Backend) -> Callable:
  """The compiled finalize of ``backend``, shared by every step function on it."""
  return backend.finalize_program()


# --- the backends -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _OnMesh(abc.ABC):
  """What every backend shares: a mesh and the axes the rows are split over."""

  mesh: Mesh
  data_axes: tuple[str, ...]
  row_axes = 1  # a step's per_row output is [rows, ...], rows split over the data axes

  @property
  def data_axis(self) -> str | tuple[str, ...]:
    return self.data_axes[0] if len(self.data_axes) == 1 else self.data_axes

  @functools.cached_property
  def num_shards(self) -> int:
    # This process's part of the data axes: each process splits its own rows.
    return int(np.prod([self.mesh.local_mesh.shape[axis] for axis in self.data_axes]))

  @property
  def replicated(self) -> NamedSharding:
    return NamedSharding(self.mesh, PartitionSpec())

  @property
  def split(self) -> NamedSharding:
    return NamedSharding(self.mesh, sharding_lib.partition_spec(self.data_axes))

  @classmethod
  def create(cls, axis_name: str, mesh: Mesh | None, data_axes=None):
    if mesh is None:
      mesh = Mesh(np.array(jax.devices()), (axis_name,))
    elif not isinstance(mesh, Mesh):
      raise ValueError(f"mesh must be a jax.sharding.Mesh; got {type(mesh).__name__}")
    axes = sharding_lib.data_axes(mesh, data_axes)
    if data_axes is None and axis_name in mesh.axis_names and axis_name not in axes:
      raise ValueError(
        f"axis_name {axis_name!r} is not a data axis of mesh {dict(mesh.shape)}: the batch is "
        f"split over {axes} (see padded_eval.sharding.data_axes); pass data_axes={axis_name!r} "
        "to split it there"
      )
    return cls(mesh, axes)

  def place_params(self, params):
    leaves, treedef = jax.tree.flatten(params)
    return jax.tree.unflatten(treedef, placement.place_reusing(leaves, self.replicated))

  def place_batch(self, inputs):
    if jax.process_count() == 1:  # checked by the driver (BatchSpec): one transfer, no re-check
      return jax.device_put(sharding_lib.as_arrays(inputs), self.split)
    return sharding_lib.global_batch(inputs, self.mesh, self.data_axes)

  per_shard_state = True  # the carried leaves are [shards, ...]: one partial state per shard
  counts_rows_on_host = False  # the step counts the real rows (free without a collective)
  keeps_device_axis = False  # the finalized leaves keep a leading axis of size 1 (pmap)

  def finalize(self, state, packing=None):
    if packing is not None:  # small, one process: fetched, combined on one device, packed
      if not self.per_shard_state:
        return state
      return packing_lib.aggregate_packed(np.asarray(state), packing)
    if self.per_shard_state:  # small and one process: no collective (placement module)
      combined = placement.combined_on_one_device(state, self.keeps_device_axis)
      if combined is not None:
        return combined
    return _finalize_program(self)(state)

  @property
  def layout(self) -> dict:
    return {
      "backend": type(self).__name__,
      "mesh": {str(k): int(v) for k, v in self.mesh.shape.items()},
      "data_axis": self.data_axis if len(self.data_axes) == 1 else list(self.data_axes),
      "num_shards": self.num_shards,
    }

  def local_part(self, leaf):
    if leaf.is_fully_addressable:  # one process: the whole array is its part
      return np.asarray(leaf)
    if leaf.is_fully_replicated:
      return np.asarray(leaf.addressable_shards[0].data)
    blocks = {}  # first row -> block; replicas over other mesh axes hold the same block
    for shard in leaf.addressable_shards:
      blocks.setdefault(shard.index[0].start or 0, shard.data)
    return np.concatenate([np.asarray(blocks[start]) for start in sorted(blocks)])

  def place_state(self, state):
    place = lambda: self.place_saved_state(placement.stacked(state, self.num_shards))
    return placement.placed_once(state, self, place)

  def place_packed(self, packing):
    return self.place_state(packing.empty)

  @abc.abstractmethod
  def finalize_program(self) -> Callable:
    """The uncached compiled reduce of the carried state; `finalize` caches it per backend."""

  def to_host(self, state, packing=None):
    if packing is not None:  # one array: the combined (or replicated) packed state
      return packing.unpack_host(np.asarray(state.addressable_data(0)))
    return jax.device_get(jax.tree.map(lambda x: x.addressable_data(0), state))


class PmapBackend(_OnMesh):
  """``jax.pmap`` over the local devices; one partial state per device."""

  row_axes = 2  # a step's per_row output is [devices, rows per device, ...]
  keeps_device_axis = True

  @classmethod
  def create(cls, axis_name, mesh, data_axes=None):
    for name, value in (("mesh", mesh), ("data_axes", data_axes)):
      if value is not None:
        raise ValueError(
          f"{name} is used by the 'shard_map' and 'jit' backends; backend='pmap' runs on "
          f"all local devices. Got {name}={value!r}; pass {name}=None or another backend."
        )
    return cls(Mesh(np.array(jax.local_devices()), (axis_name,)), (axis_name,))

  def place_params(self, params):
    # jax.pmap misaligns in_axes=None for an argument without leaves (None, {}): anchor it.
    return super().place_params((placement.anchor(), params))

  def place_batch(self, inputs):
    return jax.device_put(sharding_lib.shard(inputs, self.num_shards), self.split)

  def place_saved_state(self, state):
    return jax.device_put(state, self.split)

  def compile_step(self, step_fn, mask_key, outputs=False):
    inner = jax.jit(checked_step_fn(step_fn, mask_key, outputs))  # one trace cache
    axis = self.data_axis
    sync_total = lambda flag: jax.lax.psum(jnp.sum(flag), axis)
    unanchored = lambda fn: lambda anchored, *args: fn(anchored[1], *args)
    statistics = jax.pmap(
      unanchored(step_parts.batch_statistics(inner, mask_key, axis)), axis, in_axes=(None, 0)
    )
    merge = unanchored(step_parts.merge_step(inner, mask_key, sync_total))

    def make(merge, donate):
      if jax.process_count() > 1:  # pmap's axis spans every process's devices
        return jax.pmap(merge, axis, in_axes=(None, 0, 0), donate_argnums=donate)
      mapped = jax.shard_map(  # what jax.pmap runs, without its Python work on every call
        lambda params, *blocks: step_parts.restack(merge(params, *step_parts.unstack(blocks))),
        mesh=self.mesh,
        in_specs=(PartitionSpec(), self.split.spec, self.split.spec),
        out_specs=self.split.spec,
        check_vma=False,
      )
      return jax.jit(mapped, donate_argnums=donate)

    def state_shapes(params, batch):  # per-device copies: drop the leading device axis
      shapes = jax.eval_shape(statistics, params, batch)
      return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), shapes)

    packed = lambda packing: make(step_parts.packed(merge, packing), ())
    return CompiledStep(state_shapes, make(merge, 1), make(merge, ()), packed)

  def finalize_program(self):
    return jax.pmap(step_parts.reduce_state(self.data_axis), self.data_axis)

  def to_host(self, state, packing=None):
    if packing is not None:
      return super().to_host(state, packing)
    # index on the host: x[0] on the device is one dispatch per leaf
    return jax.tree.map(lambda x: x[0], super().to_host(state))


class ShardMapBackend(_OnMesh):
  """``jax.shard_map`` over the mesh; one partial state per shard of the data axis."""

  def place_saved_state(self, state):
    if jax.process_count() == 1:  # this process's part is the whole: one transfer
      return jax.device_put(state, self.split)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(self.split, x), state)

  def compile_step(self, step_fn, mask_key, outputs=False):
    inner, axis = jax.jit(checked_step_fn(step_fn, mask_key, outputs)), self.data_axis
    replicated, split = PartitionSpec(), sharding_lib.partition_spec(self.data_axes)
    statistics = jax.shard_map(
      step_parts.batch_statistics(inner, mask_key, axis),
      mesh=self.mesh,
      in_specs=(replicated, split),
      out_specs=replicated,
    )
    merge = step_parts.merge_step(inner, mask_key, lambda flag: jax.lax.psum(jnp.sum(flag), axis))

    def mapped(merge):
      def shard_step(params, state, inputs):  # state: this shard's [1, ...] block
        state, token, per_row = merge(params, step_parts.unstack(state), inputs)
        token = jax.tree.map(lambda x: jnp.reshape(x, (1,)), token)
        return step_parts.restack(state), token, per_row

      return jax.shard_map(
        shard_step,
        mesh=self.mesh,
        in_specs=(replicated, split, split),
        out_specs=(split, split, split),
      )

    state_shapes = lambda params, batch: jax.eval_shape(statistics, params, batch)
    step = mapped(merge)
    packed = lambda packing: jax.jit(mapped(step_parts.packed(merge, packing)))
    return CompiledStep(state_shapes, jax.jit(step, donate_argnums=1), jax.jit(step), packed)

  def finalize_program(self):
    return jax.jit(
      jax.shard_map(
        lambda state: step_parts.reduce_state(self.data_axis)(step_parts.unstack(state)),
        mesh=self.mesh,
        in_specs=sharding_lib.partition_spec(self.data_axes),
        out_specs=PartitionSpec(),
      )
    )


class JitBackend(_OnMesh):
  """``jax.jit`` of the global batch; one replicated state whose sums XLA makes global."""

  per_shard_state = False
  counts_rows_on_host = True  # a count in the step would be one more all-reduce per step

  @classmethod
  def create(cls, axis_name, mesh, data_axes=None):
    """As for every backend, on the mesh's `padded_eval.sharding.auto_mesh` view: a
    ``jax.make_mesh`` mesh (``Explicit`` axes) is traced like a ``jax.sharding.Mesh``."""
    backend = super().create(axis_name, mesh, data_axes)
    return cls(sharding_lib.auto_mesh(backend.mesh), backend.data_axes)

  def place_state(self, state):
    place = lambda: self.place_saved_state(jax.tree.map(np.array, state))
    return placement.placed_once(state, self, place)

  def place_saved_state(self, state):
    return jax.device_put(state, self.replicated)

  def place_params(self, params):
    """Arrays already on the mesh keep their shardings (no copy); the rest is replicated."""
    return sharding_lib.keep_or_replicate(params, self.mesh)

  def compile_step(self, step_fn, mask_key, outputs=False):
    inner = jax.jit(checked_step_fn(step_fn, mask_key, outputs))
    statistics = jax.jit(step_parts.batch_statistics(inner, mask_key, None))
    # per_row stays split like the batch: each process reads back its own rows
    shardings = (self.replicated, self.replicated, self.split)
    merge = step_parts.merge_step(inner, mask_key, jnp.sum)
    make = lambda merge, donate: jax.jit(merge, donate_argnums=donate, out_shardings=shardings)
    state_shapes = lambda params, batch: jax.eval_shape(statistics, params, batch)
    # packed (one process, no checkpoint): with a mask key the driver counts rows on the host
    uncounted = step_parts.merge_step(inner, mask_key, jnp.sum, count_rows=callable(mask_key))
    packed = lambda packing: make(step_parts.packed(uncounted, packing), ())
    return CompiledStep(state_shapes, make(merge, 1), make(merge, ()), packed)

  def finalize_program(self):
    return lambda state: state  # already global: XLA reduced every step's sums across the mesh


BACKENDS: dict[str, type[Backend]] = {
  "pmap": PmapBackend,
  "shard_map": ShardMapBackend,
  "jit": JitBackend,
}
"""The backends by name: the only place where a backend's name is looked at."""


def make_backend(name: str, axis_name: str, mesh: Mesh | None, data_axes: Any = None) -> Backend:
  """The backend called ``name``, for ``masked_eval(backend=name, axis_name=..., mesh=...,
  data_axes=...)``; the same settings give the same (cached) backend.

  Raises:
    ValueError: ``name`` is not in `BACKENDS`; a mesh or data_axes with ``"pmap"``; a mesh that
      is not a ``jax.sharding.Mesh``; data_axes that are not axes of the mesh; ``axis_name`` a
      mesh axis that the default rule does not split the batch over.
  """
  check_choice("backend", name, tuple(BACKENDS))
  try:
    return _made_backend(name, axis_name, mesh, data_axes)
  except TypeError:  # unhashable settings (a list of data axes): not cached
    return BACKENDS[name].create(axis_name, mesh, data_axes)


@functools.lru_cache(maxsize=64)
def _made_backend(name: str, axis_name: str, mesh: Mesh | None, data_axes: Any) -> Backend:
  return BACKENDS[name].create(axis_name, mesh, data_axes)
