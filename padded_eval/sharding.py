"""Placing padded batches on devices: pmap layout (`shard`, `prefetch_to_device`) and global arrays (`global_batch`).

Nothing here touches a JAX backend until called.
"""

from __future__ import annotations

import collections
import collections.abc as cabc
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

__all__ = ["global_batch", "prefetch_to_device", "shard", "unshard"]

_PMAP_AXIS = "devices"


def shard(tree: Any, num_devices: int | None = None) -> Any:
  """Splits every leaf's leading axis over devices (the pmap layout).

  Args:
    tree: a pytree whose every leaf is an array ``[B, ...]`` (numpy or jax).
    num_devices: number of devices; default ``jax.local_device_count()``.

  Returns:
    The same pytree with every leaf ``[num_devices, B // num_devices, ...]``, numpy leaves as views, jax leaves as
    jax arrays.

  Raises:
    ValueError: a leaf is a scalar or its leading size is not divisible by `num_devices` (the leaf's path is named).

  Example:
    >>> import numpy as np
    >>> shard({"x": np.zeros((8, 3))}, num_devices=4)["x"].shape
    (4, 2, 3)
  """
  if num_devices is None:
    num_devices = jax.local_device_count()

  def split(path, leaf):
    shape = _check_divisible(path, leaf, num_devices, f"{num_devices} devices")
    return leaf.reshape((num_devices, shape[0] // num_devices) + shape[1:])

  return jax.tree_util.tree_map_with_path(split, _as_arrays(tree))


def unshard(tree: Any) -> Any:
  """Inverse of `shard`: every leaf ``[D, b, ...]`` becomes ``[D * b, ...]``.

  Args:
    tree: a pytree of arrays with at least two dimensions (e.g. a `pmap` output).

  Returns:
    The pytree with the first two axes of every leaf merged.

  Raises:
    ValueError: a leaf has fewer than two dimensions.
  """

  def merge(path, leaf):
    shape = np.shape(leaf)
    if len(shape) < 2:
      raise ValueError(
        f"leaf {jax.tree_util.keystr(path)} has shape {shape}; expected [devices, per_device, ...]"
      )
    return leaf.reshape((shape[0] * shape[1],) + shape[2:])

  return jax.tree_util.tree_map_with_path(merge, _as_arrays(tree))


def prefetch_to_device(
  batches: cabc.Iterable[Any], size: int = 2, devices: Sequence[jax.Device] | None = None
) -> Iterator[Any]:
  """Yields sharded batches already on the devices, `size` batches ahead of the consumer.

  Each batch is split with `shard` and placed with one asynchronous `jax.device_put` whose sharding splits the
  leading axis over `devices`, which is the layout `jax.pmap` takes without another copy. Keeping `size`
  batches in flight overlaps host-to-device copies with the compute on earlier batches.

  Args:
    batches: iterable of pytrees of numeric arrays ``[B, ...]`` (e.g. from `pad_batches`).
    size: number of batches in flight (>= 1); 2 overlaps one copy with one step.
    devices: the devices; default ``jax.local_devices()``.

  Returns:
    An iterator of pytrees with leaves ``jax.Array [len(devices), B // len(devices), ...]``.

  Raises:
    ValueError: `size` < 1, a leading size not divisible by the device count, or a string leaf (which cannot live
      on a device: drop it from the batch first).
  """
  if isinstance(size, bool) or not isinstance(size, int) or size < 1:
    raise ValueError(f"size must be an integer >= 1; got {size!r}")
  devices = list(jax.local_devices() if devices is None else devices)
  mesh = jax.sharding.Mesh(np.array(devices), (_PMAP_AXIS,))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(_PMAP_AXIS))

  def put(batch):
    _reject_strings(batch)
    return jax.device_put(shard(batch, len(devices)), sharding)

  queue: collections.deque = collections.deque()
  for batch in batches:
    queue.append(put(batch))
    if len(queue) >= size:
      yield queue.popleft()
  while queue:
    yield queue.popleft()


def global_batch(batch: Any, mesh: jax.sharding.Mesh | None = None, axis: str | None = None) -> Any:
  """Turns this process's host batch into global `jax.Array`s sharded on the leading axis (for `jax.jit`).

  Every leaf is split on its leading axis over mesh axis `axis` and replicated over the mesh's other axes, with
  `jax.make_array_from_process_local_data`. With several processes, each passes its own local rows; the global
  leading size is the sum over processes (rows are ordered by process).

  Args:
    batch: pytree of numeric host arrays ``[local_B, ...]``; `local_B` divisible by the number of this process's
      shards along `axis`.
    mesh: the device mesh; default all devices on one axis named ``"batch"``.
    axis: the mesh axis to split rows over; default the mesh's first axis.

  Returns:
    The pytree with leaves ``jax.Array [global_B, ...]`` with sharding ``NamedSharding(mesh, P(axis))``.

  Raises:
    ValueError: `axis` is not a mesh axis, a leading size does not divide evenly over the local shards, or a
      leaf holds strings.
  """
  if mesh is None:
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("batch",))
  axis = mesh.axis_names[0] if axis is None else axis
  if axis not in mesh.axis_names:
    raise ValueError(f"axis {axis!r} is not an axis of the mesh; expected one of {mesh.axis_names}")
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(axis))
  local_shards = mesh.local_mesh.shape[axis]
  _reject_strings(batch)

  def make(path, leaf):
    _check_divisible(
      path, leaf, local_shards, f"{local_shards}, this process's shards along mesh axis {axis!r}"
    )
    return jax.make_array_from_process_local_data(sharding, leaf)

  return jax.tree_util.tree_map_with_path(make, _as_arrays(batch))


def _as_arrays(tree: Any) -> Any:
  """Converts leaves that are neither numpy nor jax arrays (lists, scalars) to numpy."""
  return jax.tree_util.tree_map(
    lambda x: x if isinstance(x, (np.ndarray, jax.Array)) else np.asarray(x), tree
  )


def _reject_strings(tree: Any) -> None:
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if isinstance(leaf, np.ndarray) and leaf.dtype.kind in "USO":
      raise ValueError(
        f"leaf {jax.tree_util.keystr(path)} holds strings (dtype {leaf.dtype}), which cannot be placed on "
        "a device; drop it from the batch first"
      )


def _check_divisible(path, leaf, parts: int, what: str) -> tuple:
  """The leaf's shape; ValueError naming the leaf unless its leading size divides into `parts`."""
  shape = np.shape(leaf)
  if not shape or shape[0] % parts:
    raise ValueError(
      f"leaf {jax.tree_util.keystr(path)} has shape {shape}; expected a leading size divisible by {what}"
    )
  return shape
