"""`ShardMapBackend` (``"shard_map"``): ``jax.shard_map`` over a mesh; rows are split over the
mesh's data axes (`padded_eval.data.sharding.data_axes`) and replicated over the others;
``step_fn`` sees one shard and whole, replicated params."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from padded_eval.data import sharding as sharding_lib
from padded_eval.eval import step as step_parts
from padded_eval.eval.backends._base import CompiledStep, MeshBackend
from padded_eval.eval.step import checked_step_fn
from padded_eval.multihost.distributed import several_processes

__all__ = ["ShardMapBackend"]


class ShardMapBackend(MeshBackend):
  """``jax.shard_map`` over the mesh; one partial state per shard of the data axis."""

  def place_saved_state(self, state):
    if not several_processes():  # this process's part is the whole: one transfer
      return jax.device_put(state, self.split)
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(self.split, x), state)

  def compile_step(self, step_fn, mask, outputs=False):
    inner, axis = jax.jit(checked_step_fn(step_fn, mask, outputs)), self.data_axis
    replicated, split = PartitionSpec(), sharding_lib.partition_spec(self.data_axes)
    statistics = jax.shard_map(
      step_parts.batch_statistics(inner, mask, axis),
      mesh=self.mesh,
      in_specs=(replicated, split),
      out_specs=replicated,
    )
    sync_total = lambda flag: jax.lax.psum(jnp.sum(flag), axis)

    def step_for(carrier):
      merge = step_parts.merge_step(inner, mask, sync_total, carrier)

      def shard_step(params, state, inputs):  # state: this shard's [1, ...] block
        state, token, per_row = merge(params, step_parts.unstack(state), inputs)
        token = jax.tree.map(lambda x: jnp.reshape(x, (1,)), token)
        return step_parts.restack(state), token, per_row

      mapped = jax.shard_map(
        shard_step,
        mesh=self.mesh,
        in_specs=(replicated, split, split),
        out_specs=(split, split, split),
      )
      return self.jit_step(mapped, donate_argnums=(1,) if carrier.donated else ())

    def final_for(carrier):
      reduce = step_parts.reduce_carried(carrier, axis)
      mapped = jax.shard_map(
        lambda params, state: step_parts.restack(reduce(params, step_parts.unstack(state))),
        mesh=self.mesh,
        in_specs=(replicated, split),
        out_specs=split,
      )
      return self.jit_step(mapped)

    traced = step_parts.traced_statistics(statistics)
    return CompiledStep(traced, step_for, final_for)
