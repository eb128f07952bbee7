"""`JitBackend` (``"jit"``): ``jax.jit``; ``step_fn`` sees the global batch, a ``jax.Array``
sharded over the data axes; params that are ``jax.Array``s on the mesh keep their shardings
(FSDP, tensor parallel: no copy, no gather); XLA inserts the reductions."""

from __future__ import annotations

import functools
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.data import sharding as sharding_lib
from padded_eval.eval import step as step_parts
from padded_eval.eval.backends._base import CompiledStep, MeshBackend
from padded_eval.eval.step import checked_step_fn

__all__ = ["JitBackend"]


class JitBackend(MeshBackend):
  """``jax.jit`` of the global batch; one replicated state whose sums XLA makes global."""

  per_shard_state = False

  @classmethod
  def create(cls, axis_name, mesh, data_axes=None):
    """As for every backend, on the mesh's `padded_eval.data.sharding.auto_mesh` view: a
    ``jax.make_mesh`` mesh (``Explicit`` axes) is traced like a ``jax.sharding.Mesh``. Called
    under ``jax.set_mesh(mesh)`` of that same mesh (gemma's loop), the step is traced on the
    explicit mesh instead, as the model's own ``jax.jit`` would be there (layers that pass
    ``out_sharding=`` need it); the metrics then compute their statistics with the axes
    ``Auto`` (`padded_eval.metrics.base.explicit_context_axes`)."""
    backend = super().create(axis_name, mesh, data_axes)
    if _explicit_context_is(backend.mesh):
      return backend
    return cls(sharding_lib.auto_mesh(backend.mesh), backend.data_axes)

  def place_state(self, state):
    return self.place_saved_state(jax.tree.map(np.array, state))  # fresh buffers: donated

  def place_saved_state(self, state):
    return jax.device_put(state, self.replicated)

  def prepared_params(self, params):
    """Arrays already on the mesh keep their shardings (no copy); the rest is replicated."""
    return keep_or_replicate(params, self.mesh)

  def compile_step(self, step_fn, mask, outputs=False):
    inner = jax.jit(_under_mesh(checked_step_fn(step_fn, mask, outputs), self.mesh))
    statistics = jax.jit(step_parts.batch_statistics(inner, mask, None))
    # per_row stays split like the batch: each process reads back its own rows
    shardings = (self.replicated, self.replicated, self.split)
    step_for = lambda carrier: self.jit_step(
      step_parts.merge_step(inner, mask, jnp.sum, carrier),
      donate_argnums=(1,) if carrier.donated else (),
      out_shardings=shardings,
    )
    # no final program: the carried state is global, XLA reduced every step's sums
    return CompiledStep(step_parts.traced_statistics(statistics), step_for)


def _explicit_context_is(mesh: jax.sharding.Mesh) -> bool:
  """Whether the context mesh (``jax.set_mesh``) is ``mesh`` and has ``Explicit`` axes."""
  get_mesh = getattr(jax.sharding, "get_abstract_mesh", None)
  axis_type = getattr(jax.sharding, "AxisType", None)
  if get_mesh is None or axis_type is None:
    return False
  context = get_mesh()
  explicit = axis_type.Explicit in (getattr(context, "axis_types", None) or ())
  return explicit and context == mesh.abstract_mesh


def _under_mesh(step: Any, mesh: jax.sharding.Mesh) -> Any:
  """``step`` traced with ``mesh`` as the context mesh when it has ``Explicit`` axes, as under
  the user's ``jax.set_mesh(mesh)``: a layer's ``out_sharding=`` and the metrics'
  `padded_eval.metrics.base.explicit_context_axes` read it."""
  axis_type = getattr(jax.sharding, "AxisType", None)
  types = getattr(mesh, "axis_types", None) or ()
  if axis_type is None or axis_type.Explicit not in types:
    return step

  @functools.wraps(step)
  def traced(params, batch):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return step(params, batch)

  return traced


def keep_or_replicate(tree: Any, mesh: jax.sharding.Mesh) -> Any:
  """``tree`` placed on ``mesh`` the way `masked_eval(backend="jit")` takes params.

  A leaf that is a ``jax.Array`` already laid out on the mesh's devices (a ``NamedSharding`` over
  a mesh with the same devices in the same order, e.g. params sharded over ``("fsdp",)``) is kept
  as it is: the same object, no copy, no gather; if its mesh differs from ``mesh`` only in the
  axis types (params placed on a ``jax.make_mesh`` mesh, ``mesh`` its `auto_mesh`), the same
  buffers are re-viewed with ``mesh`` (no copy either). A leaf sharded over another mesh of the
  same devices (a ``(fsdp=4, tensor=2)`` mesh while the rows are split over ``(batch=8,)``) is
  kept, viewed with ``Auto`` axes: the step's ``jax.jit`` lays it out as its ops need. Every
  other leaf (numpy arrays, Python scalars, arrays on other devices or uncommitted ones) is
  replicated over the mesh, in one ``jax.device_put`` (the copy is the call's: nothing keeps it
  after `masked_eval` returns).

  Args:
    tree: any pytree (params).
    mesh: the device mesh.

  Returns:
    The pytree with every leaf a ``jax.Array`` on the mesh's devices.
  """
  leaves, treedef = jax.tree.flatten(tree)
  devices = tuple(mesh.devices.flat)
  leaves = [_viewed_on(leaf, mesh) for leaf in leaves]
  moved = [i for i, leaf in enumerate(leaves) if not _laid_out_on(leaf, devices)]
  if moved:
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    for i, placed in zip(moved, jax.device_put([leaves[i] for i in moved], replicated)):
      leaves[i] = placed
  return jax.tree.unflatten(treedef, leaves)


def _viewed_on(leaf: Any, mesh: jax.sharding.Mesh) -> Any:
  """``leaf`` on ``mesh`` if its own mesh is ``mesh`` but for the axis types (same buffers)."""
  sharding = getattr(leaf, "sharding", None)
  if not isinstance(leaf, jax.Array) or not isinstance(sharding, jax.sharding.NamedSharding):
    return leaf
  own = cast(jax.sharding.Mesh, sharding.mesh)  # a placed array's mesh is a concrete one
  auto_mesh = sharding_lib.auto_mesh
  if own == mesh:
    return leaf
  if auto_mesh(own) != auto_mesh(mesh):  # another mesh: its Auto view (jit lays it out itself);
    target = auto_mesh(own)  # with Explicit axes jit refuses inputs on two meshes
    if target == own:
      return leaf
  else:
    target = mesh
  viewed = jax.sharding.NamedSharding(target, sharding.spec, memory_kind=sharding.memory_kind)
  shards = [shard.data for shard in leaf.addressable_shards]
  return jax.make_array_from_single_device_arrays(leaf.shape, viewed, shards)


def _laid_out_on(leaf: Any, devices: tuple) -> bool:
  if not isinstance(leaf, jax.Array):
    return False
  if isinstance(leaf.sharding, jax.sharding.NamedSharding):
    return tuple(leaf.sharding.mesh.devices.flat) == devices
  return len(devices) == 1 and leaf.sharding.device_set == set(devices)
