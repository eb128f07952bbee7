"""`PmapBackend` (``"pmap"``): ``jax.pmap`` over the local devices; ``step_fn`` sees one
device's rows ``[B // devices, ...]``. With one process the step is what ``jax.pmap`` runs
(``jax.jit`` of a ``jax.shard_map``), called directly: pmap's per-call Python is a noticeable
part of a short evaluation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from padded_eval.data import sharding as sharding_lib
from padded_eval.eval import placement
from padded_eval.eval import step as step_parts
from padded_eval.eval.backends._base import CompiledStep, MeshBackend
from padded_eval.eval.step import checked_step_fn
from padded_eval.multihost.distributed import several_processes

__all__ = ["PmapBackend"]


class PmapBackend(MeshBackend):
  """``jax.pmap`` over the local devices; one partial state per device."""

  row_axes = 2  # a step's per_row output is [devices, rows per device, ...]

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
    refuse_replicated(params)
    # jax.pmap misaligns in_axes=None for an argument without leaves (None, {}): anchor it.
    return (placement.anchor(), self.prepared_params(params))

  def place_batch(self, inputs):
    return jax.device_put(sharding_lib.shard(inputs, self.num_shards), self.split)

  def place_saved_state(self, state):
    return jax.device_put(state, self.split)

  def compile_step(self, step_fn, mask, outputs=False):
    inner = jax.jit(checked_step_fn(step_fn, mask, outputs))  # one trace cache
    axis = self.data_axis
    sync_total = lambda flag: jax.lax.psum(jnp.sum(flag), axis)
    unanchored = lambda fn: lambda anchored, *args: fn(anchored[1], *args)
    statistics = jax.pmap(
      unanchored(step_parts.batch_statistics(inner, mask, axis)), axis, in_axes=(None, 0)
    )
    step_for = lambda carrier: self._mapped(
      unanchored(step_parts.merge_step(inner, mask, sync_total, carrier)), 3, carrier.donated
    )
    final_for = lambda carrier: self._mapped(step_parts.reduce_carried(carrier, axis), 2)
    traced = step_parts.traced_statistics(statistics, per_device=True)
    return CompiledStep(traced, step_for, final_for)

  def _mapped(self, fn, arity, donate=False):
    """``fn(params, *per-device args)`` mapped over the devices as ``jax.pmap`` maps it."""
    donate_argnums = (1,) if donate else ()
    if several_processes():  # pmap's axis spans every process's devices
      in_axes = (None,) + (0,) * (arity - 1)
      return jax.pmap(fn, self.data_axis, in_axes=in_axes, donate_argnums=donate_argnums)
    mapped = jax.shard_map(  # what jax.pmap runs, without its Python work on every call
      lambda params, *blocks: step_parts.restack(fn(params, *step_parts.unstack(blocks))),
      mesh=self.mesh,
      in_specs=(PartitionSpec(),) + (self.split.spec,) * (arity - 1),
      out_specs=self.split.spec,
      check_vma=False,
    )
    return self.jit_step(mapped, donate_argnums=donate_argnums)


def refuse_replicated(params) -> None:
  """ValueError if ``params`` are already one copy per local device (``flax.jax_utils.replicate``).

  The pmap backend replicates ``params`` itself (as ``in_axes=None``); replicated params would
  be replicated again and broadcast against the rows ("Incompatible shapes for broadcasting").
  Detected when every array leaf is a ``jax.Array`` whose leading axis, of the local device
  count, is split over the local devices one row each.
  """
  devices = jax.local_devices()
  leaves = [leaf for leaf in jax.tree.leaves(params) if hasattr(leaf, "shape")]
  if len(devices) < 2 or not leaves or not all(_one_copy_per_device(x, devices) for x in leaves):
    return
  raise ValueError(
    f"params look replicated for pmap: every leaf has a leading axis of {len(devices)} (the local "
    f"devices), one copy per device, as flax.jax_utils.replicate(state) makes (e.g. leaf shape "
    f"{tuple(leaves[0].shape)}). masked_eval replicates params itself: pass "
    "flax.jax_utils.unreplicate(params) (or jax.tree.map(lambda x: x[0], params))."
  )


def _one_copy_per_device(leaf, devices) -> bool:
  if not isinstance(leaf, jax.Array) or leaf.ndim == 0 or leaf.shape[0] != len(devices):
    return False
  shards = leaf.addressable_shards
  return len(shards) == len(devices) and all(shard.data.shape[0] == 1 for shard in shards)
