"""The one list of what padded_eval keeps between calls; `pe.clear_caches()` empties all of it.

Every cache of the package registers here where it is made: a module-level jitted helper
(`jit`), a ``functools`` cache (`cache`, `lru_cache`), a dict or set that remembers
(`kept`). `registered` lists them, `entries` says how much each holds, `clear` empties every
one (`padded_eval.clear_caches` calls it). Nothing else keeps state between calls:
``tests/test_caches.py`` scans every module of the package for a jitted or cached function, or
a container that fills up while evaluations run, that is not registered here.

This module sits at the bottom layer (it imports nothing of the package) so that every layer
registers its caches with it. Examples:

  >>> from padded_eval.caches import registry
  >>> @registry.jit
  ... def double(x):
  ...   return 2 * x
  >>> int(double(3))
  6
  >>> registry.entries(double)
  1
  >>> registry.clear()
  >>> registry.entries(double)
  0
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

__all__ = ["cache", "clear", "entries", "jit", "kept", "lru_cache", "registered"]

_KEPT: dict[int, tuple[str, Any, Callable[[], None]]] = {}  # id(obj) -> (name, obj, clear)


def kept(obj: Any, name: str | None = None, clear: Callable[[], None] | None = None) -> Any:
  """Registers ``obj`` as kept between calls and returns it.

  Args:
    obj: a jitted function (``clear_cache``), a ``functools`` cache (``cache_clear``), or a
      container (``clear``): a dict, set, ``collections.Counter``, ``weakref.WeakSet``, ...
    name: how `registered` names it; default: its module and name, else its type.
    clear: how to empty it, when not its own method (e.g. a function that also drops what the
      cache put elsewhere).

  Returns:
    ``obj`` itself (so a decorator or an assignment can register in one line).
  """
  if clear is None:
    clear = _clearer(obj)
  if name is None:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    name = f"{module}.{getattr(obj, '__qualname__', type(obj).__name__)}"
  _KEPT[id(obj)] = (name, obj, clear)
  return obj


def _clearer(obj: Any) -> Callable[[], None]:
  for method in ("clear_cache", "cache_clear", "clear"):
    if callable(getattr(obj, method, None)):
      return getattr(obj, method)
  raise TypeError(f"{type(obj).__name__} has no clear_cache, cache_clear or clear: pass clear=")


def jit(fn: Callable | None = None, **jit_kwargs: Any) -> Any:
  """``jax.jit(fn, **jit_kwargs)``, registered; as a decorator: ``@jit`` or ``@jit(static_argnums=1)``."""
  if fn is None:
    return functools.partial(jit, **jit_kwargs)
  jitted = jax.jit(fn, **jit_kwargs)
  module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
  return kept(jitted, f"{module}.{qualname}" if module and qualname else None)


def cache(fn: Callable) -> Any:
  """``functools.cache(fn)``, registered."""
  return kept(functools.cache(fn))


def lru_cache(maxsize: int) -> Callable[[Callable], Any]:
  """``functools.lru_cache(maxsize)``, registered."""
  return lambda fn: kept(functools.lru_cache(maxsize=maxsize)(fn))


def registered() -> dict[str, Any]:
  """``{name: object}`` of everything kept between calls (names of repeated kinds numbered)."""
  found: dict[str, Any] = {}
  for name, obj, _ in _KEPT.values():
    key, n = name, 1
    while key in found:
      n += 1
      key = f"{name}#{n}"
    found[key] = obj
  return found


def entries(obj: Any) -> int:
  """How many entries ``obj`` (a registered object) holds: compiled programs of a jitted
  function, results of a ``functools`` cache, items of a container."""
  if callable(getattr(obj, "_cache_size", None)):
    return int(obj._cache_size())  # noqa: SLF001 - jax's own count of a jit's programs
  if callable(getattr(obj, "cache_info", None)):
    return int(obj.cache_info().currsize)
  return len(obj)


def clear() -> None:
  """Empties everything registered (`padded_eval.clear_caches`)."""
  for _, _, clear_one in list(_KEPT.values()):
    clear_one()
