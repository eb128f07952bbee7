"""What every backend shares: the `Backend` protocol, `CompiledStep` and `MeshBackend`.

A backend places the params, each step's input and the empty state on the devices, compiles
the step ``(params, state, StepInput) -> (state, token)``, reduces the per-device partial
states once at the end (`Backend.finalize`) and fetches the state to the host. One backend is
one module of this package (`pmap`, `shard_map`, `jit`) plus one line in `BACKENDS`
(``padded_eval/eval/backends/__init__.py``).

Under pmap and shard_map every shard of the data axis carries its own partial state (stacked
on a leading axis): a step merges locally and runs no collective; `finalize` reduces the
partial states exactly, once: small states (one process) are fetched and combined with
``aggregate()`` in one single-device program (`padded_eval.eval.placement.combined_on_one_device`),
larger ones by ``Metric.reduce``, the one collective of a call. The pieces of the step itself
are in `padded_eval.eval.step`.

A small state with one process and no checkpoint is carried packed, one ``uint32`` vector per
shard (`padded_eval.eval.packing`; ``CompiledStep.packed_step``, and the
``packing`` argument of ``finalize`` and ``to_host``): a short evaluation then copies one
array per shard instead of one per leaf and shard.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from padded_eval.data import sharding as sharding_lib
from padded_eval.eval import compiling, placement
from padded_eval.eval import packing as packing_lib
from padded_eval.multihost.distributed import StepInput

__all__ = ["Backend", "CompiledStep", "MeshBackend", "finalize_program"]


@dataclasses.dataclass(frozen=True)
class CompiledStep:
  """The compiled functions of one ``(step_fn, backend, mask)``.

  Attributes:
    traced_statistics: ``(placed params, placed batch) -> (shapes, written)``: ``shapes``, the
      ``(metric, ExactCount)`` of ``jax.ShapeDtypeStruct`` of one shard's carried state, and
      ``written``, the bytes the statistics' program writes
      (`padded_eval.eval.compiling.written_bytes`, what chooses the step's tier), from one trace
      of one batch's statistics (`padded_eval.eval.step.traced_statistics`, which traces
      ``step_fn`` into the jit cache the step reuses).
    step: ``(placed params, state, placed StepInput) -> (state, token, per_row)``;
      ``state`` (the tree) is donated. ``token`` is ``(rows_so_far, sync_totals)``: a small
      array that is ready when the step has finished, and each ``sync`` array summed over all
      shards. ``per_row`` is what ``step_fn`` returned next to its metric (``outputs=True``),
      rows split over the data axis like the batch; None without outputs.
    packed_step: ``(packing, count_rows) -> step`` for a `padded_eval.eval.packing.StatePacking`:
      the step (not donating) whose carried state is one ``uint32`` vector per shard
      (`padded_eval.eval.step.merge_step` with the packing); without ``count_rows`` it leaves the carried count
      as it came (the run counts the rows on the host: `padded_eval.eval.run`).
  """

  traced_statistics: Callable
  step: Callable
  packed_step: Callable

  def state_shapes(self, params: Any, batch: Any) -> Any:
    """The ``shapes`` of `traced_statistics`: one shard's carried state."""
    return self.traced_statistics(params, batch)[0]


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
  counts_rows_on_host: bool  # a count in the step costs a collective: the run counts on the host

  @property
  def data_axis(self) -> str | tuple[str, ...]: ...

  @property
  def num_shards(self) -> int: ...

  @classmethod
  def create(cls, axis_name: str, mesh: Mesh | None, data_axes: Any = None) -> Backend:
    """The backend for ``masked_eval(axis_name=..., mesh=..., data_axes=...)``; ValueError on a
    bad mesh or data axes."""
    ...

  def prepared_params(self, params: Any) -> Any:
    """``params`` on the devices as the step takes them (replicated, or as sharded), in the form
    a caller may keep across calls (`padded_eval.place_params`); arrays already so laid out
    are not copied."""
    ...

  def place_params(self, params: Any) -> Any:
    """``params`` (host, or `prepared_params`'s) -> what the compiled step's params argument takes."""
    ...

  def place_batch(self, inputs: StepInput) -> Any:
    """A checked host `StepInput` -> device arrays in the layout the compiled step takes."""
    ...

  def place_state(self, state: Any) -> Any:
    """The empty host state (one shard's, a tree or a packed vector) -> the carried device
    state, in fresh buffers."""
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

  def compile_step(self, step_fn: Callable, mask: Any, outputs: bool = False) -> CompiledStep:
    """The (not yet cached) compiled functions for ``step_fn`` (which returns ``(metric, per_row)``
    when ``outputs``) over batches whose real rows ``mask`` (a `padded_eval.eval.step.RowMask`)
    marks."""
    ...

  def finalize(self, state: Any, packing: Any = None) -> Any:
    """The carried state -> the global state: the one exact reduce across shards (``packing``:
    the state is packed by this `padded_eval.eval.packing.StatePacking`, and stays packed)."""
    ...

  def to_host(self, state: Any, packing: Any = None) -> Any:
    """One copy of the finalized (replicated) state, as numpy, in one transfer (unpacked)."""
    ...


@functools.lru_cache(maxsize=64)
def finalize_program(backend: Backend) -> Callable:
  """The compiled finalize of ``backend``, shared by every step function on it."""
  return backend.finalize_program()


# --- the backends -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MeshBackend(abc.ABC):
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
    return sharding_lib.local_shard_count(self.mesh, self.data_axes)

  @property
  def shards_in_words(self) -> str | None:
    """The shards of the data axes, in words, for messages; None: "the {n} devices"."""
    if self.mesh.devices.ndim == 1:
      return None
    axes = self.data_axes
    named = f"axis {axes[0]!r}" if len(axes) == 1 else f"axes {axes!r} (data_axes)"
    return f"the {self.num_shards} shards of the mesh's data {named} (mesh {dict(self.mesh.shape)})"

  @functools.cached_property
  def compiler_options(self) -> dict | None:
    """The XLA options of this backend's programs (`padded_eval.eval.compiling`)."""
    return compiling.compiler_options(self.mesh.devices.flat[0].platform)

  def jit_step(self, fn: Callable, **jit_kwargs) -> compiling.TieredStep:
    """``fn`` jitted as a step of this backend: `padded_eval.eval.compiling.TieredStep` with
    `compiler_options` (on CPU also a quick tier, chosen per input shapes by the run)."""
    platform = self.mesh.devices.flat[0].platform
    return compiling.TieredStep(fn, self.compiler_options, platform, **jit_kwargs)

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
        f"split over {axes} (see padded_eval.data.sharding.data_axes); pass data_axes={axis_name!r} "
        "to split it there"
      )
    return cls(mesh, axes)

  def prepared_params(self, params):
    return jax.device_put(params, self.replicated)  # replicated jax.Arrays are not copied

  def place_params(self, params):
    return self.prepared_params(params)

  def place_batch(self, inputs):
    if jax.process_count() == 1:  # checked by the driver (BatchSpec): one transfer, no re-check
      return jax.device_put(sharding_lib.as_arrays(inputs), self.split)
    return sharding_lib.global_batch(inputs, self.mesh, self.data_axes)

  per_shard_state = True  # the carried leaves are [shards, ...]: one partial state per shard
  counts_rows_on_host = False  # the step counts the real rows (free without a collective)
  keeps_device_axis = False  # the finalized leaves keep a leading axis of size 1 (pmap)

  def packed_steps(self, make: Callable, merge: Callable) -> Callable:
    """`CompiledStep.packed_step` of a backend whose steps are ``make(merge(count_rows,
    packing), donate)``. Where the partial states are combined at the end (`finalize`), their
    combination starts compiling with the step, on a worker thread
    (`padded_eval.eval.packing.prepare_aggregate`), instead of after the last step."""

    def packed_step(packing, count_rows):
      if self.per_shard_state:
        packing_lib.prepare_aggregate(packing, self.num_shards)
      return make(merge(count_rows, packing), ())

    return packed_step

  def finalize(self, state, packing=None):
    if packing is not None:  # small, one process: fetched, combined on one device, packed
      if not self.per_shard_state:
        return state
      return packing_lib.aggregate_packed(np.asarray(state), packing)
    if self.per_shard_state:  # small and one process: no collective (placement module)
      combined = placement.combined_on_one_device(state, self.keeps_device_axis)
      if combined is not None:
        return combined
      # XLA lays out a zero-size output (an empty score buffer) replicated; the reduce takes
      # every carried leaf split over the devices
      state = jax.tree.map(lambda x: jax.device_put(x, self.split) if x.size == 0 else x, state)
    return finalize_program(self)(state)

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
      return placement.fetched(leaf)
    if leaf.is_fully_replicated:
      return np.asarray(leaf.addressable_shards[0].data)
    return np.concatenate([np.asarray(block) for block in sharding_lib.local_blocks(leaf)])

  def place_state(self, state):
    return self.place_saved_state(placement.stacked(state, self.num_shards))

  @abc.abstractmethod
  def finalize_program(self) -> Callable:
    """The uncached compiled reduce of the carried state; `finalize` caches it per backend."""

  def to_host(self, state, packing=None):
    if packing is not None:  # one array: the combined (or replicated) packed state
      return packing.unpack_host(np.asarray(state.addressable_data(0)))
    return jax.device_get(jax.tree.map(lambda x: x.addressable_data(0), state))
