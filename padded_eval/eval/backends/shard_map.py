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

__all__ = ["ShardMapBackend"]


class ShardMapBackend(MeshBackend):
  """``jax.shard_map`` over the mesh; one partial state per shard of the data axis."""

  def place_saved_state(self, state):
    if jax.process_count() == 1:  # this process's part is the whole: one transfer
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
    merge = lambda count_rows, packing=None: step_parts.merge_step(
      inner, mask, sync_total, count_rows, packing
    )

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

    traced = step_parts.traced_statistics(statistics)
    make = lambda merge, donate: self.jit_step(mapped(merge), donate_argnums=donate)
    packed = self.packed_steps(make, merge)
    return CompiledStep(traced, make(merge(True), 1), packed)

  def finalize_program(self):
    return jax.jit(
      jax.shard_map(
        lambda state: step_parts.reduce_state(self.data_axis)(step_parts.unstack(state)),
        mesh=self.mesh,
        in_specs=sharding_lib.partition_spec(self.data_axes),
        out_specs=PartitionSpec(),
      ),
      compiler_options=self.compiler_options,
    )
