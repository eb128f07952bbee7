"""Array-likes to numpy: `np.asarray`, plus torch tensors whose dtype numpy lacks (bfloat16, float8).

`np.asarray` turns any array-like (a jax Array, a tensor with ``__array__``, nested lists) into numpy, except torch
tensors of dtypes numpy has no type for (torch raises "unsupported ScalarType BFloat16") and tensors on an
accelerator. Those are moved to the host and their bits reinterpreted as the `ml_dtypes` type of the same name,
which is what jax uses for them. torch is never imported here: a torch tensor is recognised by its type's module,
and torch is only touched through the tensor's own methods.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["is_torch_tensor", "to_numpy"]

# torch dtype name -> (same-width torch integer dtype name, ml_dtypes type name)
_REINTERPRETED = {
  "bfloat16": ("int16", "bfloat16"),
  "float8_e4m3fn": ("uint8", "float8_e4m3fn"),
  "float8_e5m2": ("uint8", "float8_e5m2"),
  "float8_e4m3fnuz": ("uint8", "float8_e4m3fnuz"),
  "float8_e5m2fnuz": ("uint8", "float8_e5m2fnuz"),
}


def is_torch_tensor(obj: Any) -> bool:
  """Whether `obj` is a torch tensor (decided without importing torch)."""
  return any(
    cls.__module__ == "torch" and cls.__name__ == "Tensor" for cls in type(obj).__mro__[:-1]
  )


def to_numpy(leaf: Any) -> np.ndarray:
  """One leaf as a numpy array.

  Args:
    leaf: a numpy array (returned as is), a torch tensor (any device; bfloat16 and float8 become the `ml_dtypes`
      types, bit for bit), or anything `np.asarray` takes.

  Returns:
    The numpy array (sharing memory with a CPU tensor where torch allows it).
  """
  if type(leaf) is np.ndarray:
    return leaf
  if is_torch_tensor(leaf):
    return _torch_to_numpy(leaf)
  return np.asarray(leaf)


def _torch_to_numpy(tensor: Any) -> np.ndarray:
  import torch  # already imported: `tensor` is a torch tensor

  tensor = tensor.detach()
  if tensor.device.type != "cpu":
    tensor = tensor.cpu()
  name = str(tensor.dtype).removeprefix("torch.")
  if name not in _REINTERPRETED:
    return tensor.numpy()
  bits_name, ml_name = _REINTERPRETED[name]
  import ml_dtypes  # a dependency of jax

  return tensor.view(getattr(torch, bits_name)).numpy().view(getattr(ml_dtypes, ml_name))
