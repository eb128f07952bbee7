"""What padded_eval keeps between calls is listed in one module (padded_eval.caches.registry),
and ``pe.clear_caches()`` empties all of it.

* After evaluations on every backend (packed and tree states, per-row outputs, a checkpoint)
  and eager metric calls, every registered cache that filled up is empty after
  ``pe.clear_caches()``.
* The list is complete: every module of the package is imported and scanned for module-level
  jitted functions and ``functools`` caches (each must be registered), and for module-level
  containers that the same evaluations filled (each must be registered too).
* A second evaluation after clearing is as exact as the first (numpy float64 reference).
"""

import collections
import functools
import importlib
import pathlib
import weakref

import jax
import numpy as np
import pytest

import padded_eval as pe
from padded_eval.caches import registry
from padded_eval.eval import placement

PACKAGE_DIR = pathlib.Path(pe.__file__).resolve().parent

NOT_CACHES = {
  # a class made once and registered by name with tensorflow_datasets: made again, tfds would
  # refuse the second class of the same name; it holds no results
  "padded_eval.demo.datasets._digits_builder_class",
}
"""Module-level ``functools`` caches that are not caches of results (with the reason)."""


def all_modules():
  """Every module of the package, imported (those whose optional imports are missing skipped)."""
  modules = []
  for path in sorted(PACKAGE_DIR.rglob("*.py")):
    parts = ("padded_eval",) + path.relative_to(PACKAGE_DIR).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    if parts[-1] == "__main__":
      continue
    try:
      modules.append(importlib.import_module(".".join(parts)))
    except ImportError:  # an optional dependency (matplotlib, tensorflow) not installed
      continue
  return modules


_CONTAINERS = (dict, set, list, collections.Counter, weakref.WeakSet, weakref.WeakKeyDictionary)


def module_globals(modules):
  """``(qualified name, object)`` of every module-level object defined in ``modules``."""
  for module in modules:
    for name, obj in vars(module).items():
      if not name.startswith("__"):
        yield f"{module.__name__}.{name}", obj


def is_cached_function(obj) -> bool:
  """A jitted function or a ``functools`` cache (what keeps compiled programs or results)."""
  return type(obj).__name__ == "PjitFunction" or isinstance(obj, functools._lru_cache_wrapper)  # noqa: SLF001


def container_sizes(modules) -> dict:
  """``{name: (id, len)}`` of every module-level container of ``modules``."""
  return {
    name: (id(obj), len(obj))
    for name, obj in module_globals(modules)
    if isinstance(obj, _CONTAINERS)
  }


def step(params, batch):
  logits = batch["x"] @ params
  return pe.metrics.AUROC(exact=True, capacity=256).batch_updates(
    preds=jax.nn.sigmoid(logits[:, 0]), target=batch["y"] == 0, mask=batch["mask"]
  )


def accuracy_step(params, batch):
  logits = batch["x"] @ params
  return pe.metrics.Accuracy().batch_updates(preds=logits, target=batch["y"], mask=batch["mask"])


def outputs_step(params, batch):
  return accuracy_step(params, batch), {"logits": batch["x"] @ params}


W = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)


def dataset(rows, seed):
  rng = np.random.default_rng(seed)
  return {
    "x": rng.normal(size=(rows, 5)).astype(np.float32),
    "y": rng.integers(0, 3, rows).astype(np.int32),
  }


def accuracy_of(data):
  logits = data["x"].astype(np.float64) @ W.astype(np.float64)
  return np.mean(np.argmax(logits, -1) == data["y"])


def run_workload(tmp_path, monkeypatch):
  """Evaluations on every backend, packed and tree, with outputs and a checkpoint, and eager
  metric calls: what fills the package's caches."""
  data = dataset(77, seed=1)
  for backend in ("pmap", "shard_map", "jit"):
    got = pe.masked_eval(accuracy_step, W, pe.pad_batches(data, 16), backend=backend)
    np.testing.assert_allclose(got["accuracy"], accuracy_of(data))
    pe.masked_eval(step, W, pe.pad_batches(data, 16), backend=backend)
    _, per_row = pe.masked_eval(
      outputs_step, W, pe.pad_batches(data, 16), backend=backend, outputs=True
    )
    np.testing.assert_allclose(per_row["logits"], data["x"] @ W, rtol=1e-5, atol=1e-5)
  with monkeypatch.context() as patch:
    patch.setattr(placement, "SMALL_STATE_BYTES", 0)  # the tree carrier
    pe.masked_eval(accuracy_step, W, pe.pad_batches(data, 16), backend="pmap")
  pe.masked_eval(
    accuracy_step, W, pe.pad_batches(data, 16), backend="jit", checkpoint_dir=tmp_path / "c"
  )
  metric = pe.metrics.Accuracy().batch_updates(preds=data["x"][:, :3], target=data["y"])
  metric.merge(metric).compute()  # eager metric calls: their jitted programs
  pe.metrics.Mean().batch_updates(values=data["x"][:, 0]).compute()


@pytest.fixture(scope="module")
def modules():
  return all_modules()


def test_every_module_level_jit_and_functools_cache_is_registered(modules):
  kept = {id(obj) for obj in registry.registered().values()}
  missing = [
    name
    for name, obj in module_globals(modules)
    if is_cached_function(obj) and id(obj) not in kept and name not in NOT_CACHES
  ]
  assert not missing, f"module-level caches not in padded_eval.caches.registry: {missing}"


def test_clear_caches_empties_every_registered_cache_and_the_list_covers_them(
  modules, tmp_path, monkeypatch
):
  pe.clear_caches()
  before = container_sizes(modules)
  run_workload(tmp_path, monkeypatch)
  filled = {name: obj for name, obj in registry.registered().items() if registry.entries(obj)}
  # the driver's own caches filled up: the list is not vacuous
  for name in ("padded_eval.eval.cache._cache", "padded_eval.eval.cache._logs_programs"):
    assert name in filled, sorted(filled)
  assert any("jit" in type(obj).__name__.lower() for obj in filled.values()), sorted(filled)
  after = container_sizes(modules)
  kept = {id(obj) for obj in registry.registered().values()}
  grown = [
    name
    for name, (ident, size) in after.items()
    if size > before.get(name, (ident, 0))[1] and ident not in kept
  ]
  assert not grown, f"module-level containers that filled up, not in the registry: {grown}"
  pe.clear_caches()
  full = {name: registry.entries(obj) for name, obj in registry.registered().items()}
  assert not any(full.values()), {name: n for name, n in full.items() if n}
  data = dataset(50, seed=2)  # and evaluations stay exact after clearing
  got = pe.masked_eval(accuracy_step, W, pe.pad_batches(data, 16), backend="shard_map")
  np.testing.assert_allclose(got["accuracy"], accuracy_of(data))
  assert got["num_examples"] == 50
  jax.clear_caches()
