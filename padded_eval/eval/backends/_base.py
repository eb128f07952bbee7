"""What every backend shares: the `Backend` protocol, `CompiledStep` and `MeshBackend`.

A backend places the params, each step's input and the empty state on the devices, compiles
the step ``(params, state, StepInput) -> (state, token, per_row)`` and, where every shard
carries its own partial state, the final reduce of the partial states; and fetches the state to
the host. One backend is one module of this package (`pmap`, `shard_map`, `jit`) plus one line
in `BACKENDS` (``padded_eval/eval/backends/__init__.py``).

Under pmap and shard_map every shard of the data axis carries its own partial state (stacked
on a leading axis): a step merges locally and runs no collective; the final reduce
(``CompiledStep.final_for``) combines them exactly, once, with ``Metric.reduce`` across the
data axis: the one collective of a call, one route for every state and process count. Under
jit the carried state is global already (XLA reduces each step's sums): no final program.

How the state is carried (its tree, or one ``uint32`` vector per shard for a small state:
`padded_eval.eval.packing`) is the run's choice (`padded_eval.eval.run`): a backend builds its
programs around the carrier it is handed (``CompiledStep.step_for`` / ``final_for``) and reads
nothing of it but ``merge``, ``last_part``, ``pack``, ``unpack`` and ``donated``. The pieces of
the step itself are in `padded_eval.eval.step`.
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
from padded_eval.eval import packing as packing_lib
from padded_eval.eval import placement
from padded_eval.multihost.distributed import StepInput, several_processes

__all__ = ["Backend", "CompiledStep", "MeshBackend"]


@dataclasses.dataclass(frozen=True)
class CompiledStep:
  """The compiled functions of one ``(step_fn, backend, mask)``.

  Attributes:
    traced_statistics: ``(placed params, placed batch) -> shapes``: the ``(metric, ExactCount)``
      of ``jax.ShapeDtypeStruct`` of one shard's carried state, from one trace of one batch's
      statistics (`padded_eval.eval.step.traced_statistics`, which traces ``step_fn`` into the
      jit cache the step reuses).
    step_for: ``carrier -> step`` for a carrier of `padded_eval.eval.packing` (a `TreeLayout`
      or a `StatePacking`): ``(placed params, state, placed StepInput) -> (state, token,
      per_row)``; the state is donated when ``carrier.donated``. ``token`` is ``(rows_so_far,
      sync_totals)``: a small array that is ready when the step has finished, and each ``sync``
      array summed over all shards. ``per_row`` is what ``step_fn`` returned next to its metric
      (``outputs=True``), rows split over the data axis like the batch; None without outputs.
    final_for: ``carrier -> program``: ``(placed params, state) -> state``, the per-shard
      partial states reduced exactly across the data axis (every shard gets the total, still
      carried by ``carrier``); None for a backend whose carried state is global already.
  """

  traced_statistics: Callable
  step_for: Callable
  final_for: Callable | None = None

  @functools.cached_property
  def step(self) -> Callable:
    """The step of the state's tree (`padded_eval.eval.packing.TreeLayout`), donated."""
    return self.step_for(packing_lib.TreeLayout())

  def state_shapes(self, params: Any, batch: Any) -> Any:
    """`traced_statistics`: one shard's carried state."""
    return self.traced_statistics(params, batch)


@runtime_checkable
class Backend(Protocol):
  """How the work of `masked_eval` is laid out on the devices.

  Attributes:
    mesh: the device mesh (for pmap: the local devices on one axis).
    data_axes: the mesh axes the rows are split over (the ones reduced across).
    data_axis: the same as collectives take it: the one name, or the tuple of names.
    num_shards: how many parts this process's batch is split into along its rows.
  """

  @property
  def mesh(self) -> Mesh: ...

  @property
  def data_axes(self) -> tuple[str, ...]: ...

  @property
  def row_axes(self) -> int:
    """Leading axes of a step's per_row output that index rows (pmap: device, row)."""
    ...

  @property
  def data_axis(self) -> str | tuple[str, ...]: ...

  @property
  def split(self) -> NamedSharding:
    """The rows split over the data axes."""
    ...

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

  def to_host(self, state: Any) -> Any:
    """One copy of the final (replicated) carried state, as numpy, one transfer per leaf."""
    ...


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

  def jit_step(self, fn: Callable, **jit_kwargs) -> Callable:
    """``fn`` jitted as a program of this backend: ``jax.jit`` as the user's own, XLA's defaults."""
    return jax.jit(fn, **jit_kwargs)

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
    if not several_processes():  # checked by the driver (BatchSpec): one transfer, no re-check
      return jax.device_put(sharding_lib.as_arrays(inputs), self.split)
    return sharding_lib.global_batch(inputs, self.mesh, self.data_axes)

  per_shard_state = True  # the carried leaves are [shards, ...]: one partial state per shard

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

  @abc.abstractmethod
  def place_saved_state(self, state: Any) -> Any:
    """This process's saved part of a carried state -> the carried device state."""

  def place_state(self, state: Any) -> Any:
    return self.place_saved_state(placement.stacked(state, self.num_shards))

  def to_host(self, state):
    fetched = jax.device_get(jax.tree.map(lambda x: x.addressable_data(0), state))
    if self.per_shard_state:  # every shard holds the total, as its [1, ...] block
      return jax.tree.map(lambda x: x[0], fetched)
    return fetched
