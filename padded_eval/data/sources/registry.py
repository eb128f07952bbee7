"""The registry of source kinds: `pad_batches` wraps its source with the first kind that accepts it."""

from __future__ import annotations

from typing import Any

from padded_eval.data.sources.base import Source, SourceOptions

__all__ = ["kinds", "open_source", "register", "unregister"]

_KINDS: list[type[Source]] = []


def register(kind: type[Source]) -> type[Source]:
  """Adds a source kind. Kinds registered later are tried first, so a specific kind wins over a generic one.

  Args:
    kind: a `Source` subclass.

  Returns:
    `kind` (so this works as a class decorator).

  Raises:
    TypeError: `kind` is not a `Source` subclass.
  """
  if not (isinstance(kind, type) and issubclass(kind, Source)):
    raise TypeError(f"kind must be a subclass of padded_eval.data.sources.Source; got {kind!r}")
  if kind not in _KINDS:
    _KINDS.append(kind)
  return kind


def unregister(kind: type[Source]) -> None:
  """Removes a source kind added by `register` (nothing happens if it is absent)."""
  if kind in _KINDS:
    _KINDS.remove(kind)


def kinds() -> tuple[type[Source], ...]:
  """The registered kinds, in registration order."""
  return tuple(_KINDS)


def open_source(
  obj: Any, *, mask_key: str, batched: bool | None = None, keys: tuple[str, ...] | None = None
) -> Source:
  """Wraps `obj` with the last-registered kind that accepts it.

  Args:
    obj: the user's source.
    mask_key: passed to the kind (a source key equal to it raises ValueError).
    batched: passed to the kind (tf.data and grain read it).
    keys: the names of the fields of tuple elements, passed to a kind that `names_fields`.

  Raises:
    TypeError: no kind accepts `obj` (the message lists the kinds).
    ValueError: the kind rejects `obj` (see the kind), or `keys` given for a kind whose fields have names.
  """
  for kind in reversed(_KINDS):
    if kind.accepts(obj):
      if keys is not None and not kind.names_fields:
        raise ValueError(
          f"keys={keys!r} names the fields of tuple elements, but the source is {kind.description} "
          "(its fields have names already); drop keys="
        )
      return kind(obj, SourceOptions(mask_key, batched, keys))
  names = [kind.description for kind in _KINDS]
  listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
  raise TypeError(f"source must be {listed}; got {type(obj).__name__}")
