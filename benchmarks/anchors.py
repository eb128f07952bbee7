"""The anchor libraries padded_eval is compared with, each loaded only if installed.

The anchors (flax's ``nnx`` metrics and ``pad_shard_unpad``, ``clu.metrics``, ``metrax``) come with
the ``bench`` extra; CI installs only the ``test`` extra, so every benchmark must degrade to a cell
that says ``not installed``. Setting ``PADDED_EVAL_BENCH_HIDE=clu,metrax`` hides installed anchors,
which is how the quick test checks that degradation on a machine that has them (``matplotlib``
can be hidden too: the plot is then skipped).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

NOT_INSTALLED = "not installed"
HIDE_ENV = "PADDED_EVAL_BENCH_HIDE"

# column name -> (distribution shown in the machine notes, module to import)
_ANCHOR_MODULES = {
  "flax": ("flax", "flax.nnx"),
  "clu": ("clu", "clu.metrics"),
  "metrax": ("google-metrax", "metrax"),
}


def _hidden() -> set[str]:
  return {name.strip() for name in os.environ.get(HIDE_ENV, "").split(",") if name.strip()}


def load(anchor: str) -> ModuleType | None:
  """The anchor's module (``flax.nnx``, ``clu.metrics``, ``metrax``), or None if absent or hidden.

  Args:
    anchor: one of ``"flax"``, ``"clu"``, ``"metrax"``.

  Raises:
    ValueError: for an unknown anchor name.
  """
  if anchor not in _ANCHOR_MODULES:
    raise ValueError(f"anchor must be one of {sorted(_ANCHOR_MODULES)}; got {anchor!r}")
  if anchor in _hidden():
    return None
  try:
    return importlib.import_module(_ANCHOR_MODULES[anchor][1])
  except Exception:  # noqa: BLE001 - any import failure means "not installed" here
    return None


def pad_shard_unpad():
  """``flax.jax_utils.pad_shard_unpad``, or None without flax."""
  if load("flax") is None:
    return None
  return importlib.import_module("flax.jax_utils").pad_shard_unpad


def matplotlib_pyplot():
  """``matplotlib.pyplot`` on the Agg backend, or None if matplotlib is absent or hidden."""
  if "matplotlib" in _hidden():
    return None
  try:
    import matplotlib

    matplotlib.use("Agg")
    return importlib.import_module("matplotlib.pyplot")
  except Exception:  # noqa: BLE001
    return None


def versions() -> dict[str, str]:
  """``{distribution: version or 'not installed'}`` for the anchors and jax."""
  from importlib import metadata

  found = {}
  for anchor, (dist, _) in _ANCHOR_MODULES.items():
    if load(anchor) is None:
      found[dist] = NOT_INSTALLED
      continue
    try:
      found[dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
      found[dist] = "unknown version"
  for dist in ("jax", "jaxlib", "numpy"):
    found[dist] = metadata.version(dist)
  return found
