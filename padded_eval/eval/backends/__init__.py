"""Where `masked_eval`'s work runs: one `Backend` class per module, chosen by name in `BACKENDS`.

The driver (`padded_eval.eval`) never tests the backend's name: it calls the `Backend` methods
(`_base`). Adding a backend is one module here plus one line in `BACKENDS`
(docs/architecture.md, "Adding a backend").
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh

from padded_eval.caches import registry
from padded_eval.eval.backends._base import Backend as Backend
from padded_eval.eval.backends._base import CompiledStep as CompiledStep
from padded_eval.eval.backends._base import MeshBackend as MeshBackend
from padded_eval.eval.backends.jit import JitBackend as JitBackend
from padded_eval.eval.backends.pmap import PmapBackend as PmapBackend
from padded_eval.eval.backends.shard_map import ShardMapBackend as ShardMapBackend
from padded_eval.multihost.distributed import StepInput as StepInput
from padded_eval.validation import check_choice

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
      mesh axis that the default rule does not split the batch over, or not a non-empty string.
  """
  check_choice("backend", name, tuple(BACKENDS))
  if not isinstance(axis_name, str) or not axis_name:
    raise ValueError(
      "axis_name must be a non-empty string, the mapped axis name step_fn's collectives use "
      f"(default 'batch'); got {axis_name!r}"
    )
  try:  # keyed by the context mesh too: under jax.set_mesh the jit backend traces on it
    return _made_backend(name, axis_name, mesh, data_axes, _context_mesh())
  except TypeError:  # unhashable settings (a list of data axes): not cached
    return BACKENDS[name].create(axis_name, mesh, data_axes)


def place_params(
  params: Any,
  *,
  backend: str = "pmap",
  axis_name: str = "batch",
  mesh: Mesh | None = None,
  data_axes: Any = None,
) -> Any:
  """``params`` on the devices the way `masked_eval` with the same settings takes them, once.

  `masked_eval` places the params on every call and drops its copy when it returns, so no
  replicated copy outlives a call. A caller that evaluates often (a short evaluation every few
  training steps, where copying the params is most of a call's time) places them once with
  this and passes the result: masked_eval recognises arrays already laid out as its step takes
  them and copies nothing. The copy lives as long as the caller keeps the result.

  Args:
    params: any pytree (host arrays, or ``jax.Array``s anywhere).
    backend, axis_name, mesh, data_axes: as for `masked_eval`.

  Returns:
    The pytree with every leaf a ``jax.Array``: replicated over the backend's devices, or under
    ``"jit"`` kept as it is where already on the mesh (FSDP / tensor-parallel shardings).

  Raises:
    ValueError: bad settings, as `masked_eval` reports them.

  Examples:
    >>> import jax, numpy as np, padded_eval as pe
    >>> placed = pe.place_params({"w": np.ones(3, np.float32)})
    >>> len(placed["w"].sharding.device_set) == len(jax.devices())
    True
    >>> def step(params, batch):
    ...   return pe.metrics.Mean().batch_updates(values=batch["x"] @ params["w"],
    ...                                          mask=batch["mask"])
    >>> data = {"x": np.ones((10, 3), np.float32)}
    >>> float(pe.masked_eval(step, placed, pe.pad_batches(data, 8))["mean"])
    3.0
  """
  return make_backend(backend, axis_name, mesh, data_axes).prepared_params(params)


CACHE_SIZE = 64
"""The most backends (settings) kept."""


@registry.lru_cache(maxsize=CACHE_SIZE)
def _made_backend(
  name: str, axis_name: str, mesh: Mesh | None, data_axes: Any, context: Any
) -> Backend:
  del context  # part of the key only: `create` reads the context mesh itself
  return BACKENDS[name].create(axis_name, mesh, data_axes)


def _context_mesh() -> Any:
  """The abstract context mesh (``jax.set_mesh``), or None where this JAX has none."""
  get_mesh = getattr(jax.sharding, "get_abstract_mesh", None)
  return None if get_mesh is None else get_mesh()
