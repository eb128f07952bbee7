"""Layers of an nnx model left in training mode, seen in ``masked_eval``'s params.

An nnx ``Module`` is a pytree, so users pass the model itself as ``params`` (docs/howto/
image-classification.md). If ``model.eval()`` was forgotten, ``Dropout`` drops activations at
random and ``BatchNorm`` normalises with each batch's own statistics (padding rows included):
the evaluation runs and returns numbers, without a word (issue 65). `training_layers` finds
those layers so that `masked_eval` can warn. flax is never imported here: a model can only be
an nnx ``Module`` once the user has imported ``flax.nnx``, so the module is read from
``sys.modules``.
"""

from __future__ import annotations

import sys
from typing import Any

import jax

__all__ = ["training_layers", "training_message"]


def training_layers(params: Any) -> list[str]:
  """``"Dropout at 'path' (rate 0.5)"``, ... for every layer of an nnx model in ``params`` (the
  model itself, or any pytree holding models) that is in training mode: a ``Dropout`` of nonzero
  rate that is not ``deterministic``, a ``BatchNorm`` without ``use_running_average``. Empty when
  ``flax.nnx`` was never imported or no model is in training mode."""
  nnx = sys.modules.get("flax.nnx")
  if nnx is None:
    return []
  models = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Module))
  found = []
  for model in models:
    if not isinstance(model, nnx.Module):
      continue
    # nnx.iter_modules in current flax; Module.iter_modules before it (deprecated since)
    walk = getattr(nnx, "iter_modules", None) or type(model).iter_modules
    for path, layer in walk(model):
      where = "/".join(str(part) for part in path) or "the model"
      if isinstance(layer, nnx.Dropout) and layer.rate > 0 and not layer.deterministic:
        found.append(f"Dropout at {where!r} (rate {layer.rate}, deterministic=False)")
      if isinstance(layer, nnx.BatchNorm) and not layer.use_running_average:
        found.append(f"BatchNorm at {where!r} (use_running_average=False)")
  return found


def training_message(layers: list[str]) -> str:
  """The warning for `training_layers`' findings."""
  return (
    f"masked_eval: params hold an nnx model in training mode: {'; '.join(layers)}. Dropout "
    "would drop activations at random and BatchNorm normalise with each batch's statistics "
    "(padding rows included), so the results are not the model's. Call model.eval() before "
    "evaluating (and model.train() after), or pass deterministic=True / "
    "use_running_average=True in step_fn"
  )
