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

from padded_eval.validation import check_divisible, check_int

__all__ = [
  "DATA_AXIS_NAMES",
  "as_arrays",
  "auto_mesh",
  "data_axes",
  "global_batch",
  "local_blocks",
  "local_shard_count",
  "partition_spec",
  "prefetch_to_device",
  "shard",
  "unshard",
]

_PMAP_AXIS = "devices"

DATA_AXIS_NAMES = ("data", "fsdp", "batch")
"""Mesh axes that split the batch by default (`data_axes`): the names data-parallel and FSDP
meshes give them (flax's lm1b, wmt and gemma examples, maxtext, t5x)."""


def data_axes(
  mesh: jax.sharding.Mesh, requested: str | Sequence[str] | None = None
) -> tuple[str, ...]:
  """The mesh axes a batch's leading dimension is split over.

  The rule when ``requested`` is None: every axis of `DATA_AXIS_NAMES` (``"data"``, ``"fsdp"``,
  ``"batch"``) that the mesh has, in the mesh's order; if it has none, its first axis. So the
  ``(data=1, fsdp=8, tensor=1)`` mesh of flax's lm1b example splits rows 8 ways over
  ``("data", "fsdp")`` and replicates them over ``"tensor"``.

  Args:
    mesh: the device mesh.
    requested: an axis name, a sequence of axis names, or None for the rule above.

  Returns:
    The data axes, a non-empty tuple of distinct axis names of ``mesh``, in the order given
    (rows are split over them as ``PartitionSpec((axes...))`` does: the first is the slowest).

  Raises:
    ValueError: ``requested`` is empty, not a str or sequence of str, names an axis twice, or
      names an axis the mesh does not have.

  Examples:
    >>> import jax
    >>> data_axes(jax.make_mesh((1, 8, 1), ("data", "fsdp", "tensor")))
    ('data', 'fsdp')
  """
  names = tuple(mesh.axis_names)
  if requested is None:
    found = tuple(name for name in names if name in DATA_AXIS_NAMES)
    return found or names[:1]
  axes = (requested,) if isinstance(requested, str) else requested
  if (
    not isinstance(axes, cabc.Sequence)
    or not axes
    or not all(isinstance(a, str) for a in axes)
    or len(set(axes)) != len(axes)
    or not set(axes) <= set(names)
  ):
    raise ValueError(
      f"data_axes must be an axis name or a non-empty tuple of distinct axis names of the mesh "
      f"{dict(mesh.shape)}; got {requested!r}"
    )
  return tuple(axes)


def local_shard_count(mesh: jax.sharding.Mesh, axes: tuple[str, ...]) -> int:
  """This process's shards along the mesh ``axes``: how many parts its own rows are split into."""
  return int(np.prod([mesh.local_mesh.shape[axis] for axis in axes]))


def auto_mesh(mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
  """``mesh`` with every axis of type ``Auto``: the same devices, axis names and shape.

  ``jax.make_mesh`` gives ``Explicit`` axes by default (JAX >= 0.7): an array placed on such
  a mesh carries its sharding in its type, and inside ``jax.jit`` every op must then resolve
  its output sharding from its operands' types or fail (a scatter of a batch split over
  ``"data"`` into a replicated histogram raises "Resource axis: data ... not found in mesh:
  ()", a ``[B, C]`` one-hot of split ids "All operands should have the same sharding").
  The ``jit`` backend places everything on this view of the mesh instead, so ``step_fn`` and
  the metrics are traced with XLA propagating the shardings, exactly as on a
  ``jax.sharding.Mesh(devices, names)`` (whose axes are ``Auto``).

  Args:
    mesh: any device mesh.

  Returns:
    ``mesh`` itself if its axes are all ``Auto`` (or this JAX has no axis types), else a
    ``Mesh`` of the same devices and names with ``Auto`` axes.

  Example:
    >>> import jax
    >>> auto_mesh(jax.make_mesh((1,), ("data",))).axis_types
    (Auto,)
  """
  axis_type = getattr(jax.sharding, "AxisType", None)
  types = getattr(mesh, "axis_types", None)
  if axis_type is None or types is None or all(t == axis_type.Auto for t in types):
    return mesh
  auto = (axis_type.Auto,) * len(mesh.axis_names)
  return jax.sharding.Mesh(mesh.devices, mesh.axis_names, axis_types=auto)


def local_blocks(leaf: jax.Array) -> list[jax.Array]:
  """The device buffers of ``leaf`` that hold this process's rows, in row order (one per row range).

  The addressable shards are taken once per range of rows (a replica over other mesh axes is
  skipped) and sorted by their first row. With several processes these are this process's rows.
  """
  if leaf.ndim == 0:  # a scalar has no rows: every addressable shard is a full copy
    return [leaf.addressable_shards[0].data]
  by_start = {}
  for shard in leaf.addressable_shards:
    by_start.setdefault(shard.index[0].start or 0, shard.data)
  return [by_start[start] for start in sorted(by_start)]


def partition_spec(axes: tuple[str, ...]) -> jax.sharding.PartitionSpec:
  """``PartitionSpec`` splitting the leading dimension over ``axes`` (one name, or a tuple)."""
  return jax.sharding.PartitionSpec(axes[0] if len(axes) == 1 else tuple(axes))


def shard(tree: Any, num_devices: int | None = None) -> Any:
  """Splits every leaf's leading axis over devices (the pmap layout).

  Args:
    tree: a pytree whose every leaf is an array ``[B, ...]`` (numpy or jax).
    num_devices: number of devices; default ``jax.local_device_count()``.

  Returns:
    The same pytree with every leaf ``[num_devices, B // num_devices, ...]``, numpy leaves as views, jax leaves as
    jax arrays.

  Raises:
    ValueError: `num_devices` is not an int >= 1, or a leaf is a scalar or its leading size is not divisible by
      `num_devices` (the leaf's path is named).

  Examples:
    >>> import numpy as np
    >>> shard({"x": np.zeros((8, 3))}, num_devices=4)["x"].shape
    (4, 2, 3)
  """
  if num_devices is None:
    num_devices = jax.local_device_count()
  num_devices = check_int("num_devices", num_devices, minimum=1)

  def split(path, leaf):
    shape = _check_divisible(path, leaf, num_devices, f"{num_devices} devices")
    return leaf.reshape((num_devices, shape[0] // num_devices) + shape[1:])

  return jax.tree_util.tree_map_with_path(split, as_arrays(tree))


def unshard(tree: Any) -> Any:
  """Inverse of `shard`: every leaf ``[D, b, ...]`` becomes ``[D * b, ...]``.

  Args:
    tree: a pytree of arrays with at least two dimensions (e.g. a `pmap` output).

  Returns:
    The pytree with the first two axes of every leaf merged.

  Raises:
    ValueError: a leaf has fewer than two dimensions.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> per_device = {"x": np.arange(24).reshape(4, 2, 3)}  # 4 devices, 2 rows each
    >>> pe.unshard(per_device)["x"].shape
    (8, 3)
    >>> bool((pe.unshard(pe.shard({"x": np.arange(8)}, 4))["x"] == np.arange(8)).all())
    True
  """

  def merge(path, leaf):
    shape = np.shape(leaf)
    if len(shape) < 2:
      raise ValueError(
        f"leaf {jax.tree_util.keystr(path)} has shape {shape}; expected [devices, per_device, ...]"
      )
    return leaf.reshape((shape[0] * shape[1],) + shape[2:])

  return jax.tree_util.tree_map_with_path(merge, as_arrays(tree))


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
    ValueError: `size` < 1, `devices` empty, a leading size not divisible by the device count, or a string leaf
      (which cannot live on a device: drop it from the batch first).

  Examples:
    >>> import jax
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> n = jax.local_device_count()
    >>> batches = [{"x": np.ones((2 * n, 3), np.float32)} for _ in range(3)]
    >>> placed = list(pe.prefetch_to_device(batches, size=2))
    >>> len(placed), placed[0]["x"].shape == (n, 2, 3)
    (3, True)
  """
  check_int("size", size, minimum=1)
  devices = list(jax.local_devices() if devices is None else devices)
  if not devices:
    raise ValueError(f"devices must be a non-empty sequence of devices; got {devices!r}")
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


def global_batch(
  batch: Any, mesh: jax.sharding.Mesh | None = None, axis: str | Sequence[str] | None = None
) -> Any:
  """Turns this process's host batch into global `jax.Array`s sharded on the leading axis (for `jax.jit`).

  Every leaf is split on its leading axis over mesh axis `axis` (or axes) and replicated over the mesh's other
  axes, with
  `jax.make_array_from_process_local_data`. With several processes, each passes its own local rows; the global
  leading size is the sum over processes (rows are ordered by process).

  Args:
    batch: pytree of numeric host arrays ``[local_B, ...]``; `local_B` divisible by the number of this process's
      shards along `axis`.
    mesh: the device mesh; default all devices on one axis named ``"batch"``.
    axis: the mesh axis to split rows over, or a tuple of axes (rows split over their product);
      default the mesh's first axis.

  Returns:
    The pytree with leaves ``jax.Array [global_B, ...]`` with sharding ``NamedSharding(mesh, P(axis))``.

  Raises:
    ValueError: `axis` is not a mesh axis, a leading size does not divide evenly over the local shards, or a
      leaf holds strings.

  Examples:
    >>> import jax
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> n = jax.device_count()
    >>> batch = pe.global_batch({"x": np.ones((2 * n, 3), np.float32)})
    >>> batch["x"].shape == (2 * n, 3), len(batch["x"].sharding.device_set) == n
    (True, True)
  """
  if mesh is None:
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("batch",))
  if axis is None:
    axes = (mesh.axis_names[0],)
  elif isinstance(axis, str):
    axes = (axis,)
  else:  # a sequence of names (an int, say, is not one)
    axes = tuple(axis) if isinstance(axis, Sequence) else ()
  if not axes or not set(axes) <= set(mesh.axis_names):
    raise ValueError(f"axis {axis!r} is not an axis of the mesh; expected one of {mesh.axis_names}")
  sharding = jax.sharding.NamedSharding(mesh, partition_spec(axes))
  local_shards = local_shard_count(mesh, axes)
  what = f"mesh axis {axes[0]!r}" if len(axes) == 1 else f"mesh axes {axes!r}"
  _reject_strings(batch)
  batch = as_arrays(batch)
  for path, leaf in jax.tree_util.tree_flatten_with_path(batch)[0]:
    _check_divisible(
      path, leaf, local_shards, f"{local_shards}, this process's shards along {what}"
    )
  if jax.process_count() == 1:  # the local rows are all the rows: one transfer for the tree
    return jax.device_put(batch, sharding)
  return jax.tree.map(lambda leaf: jax.make_array_from_process_local_data(sharding, leaf), batch)


def as_arrays(tree: Any) -> Any:
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
  shape, name = np.shape(leaf), f"leaf {jax.tree_util.keystr(path)}"
  if not shape:
    raise ValueError(f"{name} has shape (); expected a leading size divisible by {what}")
  if shape[0] % parts:
    check_divisible(f"{name} of shape {shape}: leading size", shape[0], parts, what)
  return shape
