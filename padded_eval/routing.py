"""Keyword routing, and the base that metrics and losses share: name, routes, inputs.

A leaf module (it imports nothing from the package). Metrics and losses are both
*keyword readers*: configured, named objects that collections feed one shared set of
update keywords (``preds``, ``target``, ``mask``, ...). :class:`KeywordReader` holds what
they have in common, written once:

* ``name`` (the key in logs; the lowercase class name unless given) and the
  configuration check hook ``_check_config``;
* ``arg_routes``, set by :meth:`KeywordReader.map_arg` and
  :meth:`KeywordReader.index_into`, applied by :meth:`KeywordReader.routed`;
* the update keywords it reads (:meth:`KeywordReader.required_inputs`, from the
  signature of its reader methods) and the ``ValueError`` for a missing one.

A route step is a tuple of ``(argname, source_keyword, index_path)`` triples: the
reader's keyword ``argname`` is ``kwargs[source_keyword][path[0]][path[1]]...``. Steps
are applied in order, the most recently added first (it sees the caller's keywords).
Other keywords pass through unchanged.

Examples:
  >>> from padded_eval import routing
  >>> step = routing.map_arg_step({"preds": "logits"})
  >>> routing.route_kwargs((step,), {"logits": 1, "target": 2})
  {'logits': 1, 'target': 2, 'preds': 1}
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar, cast

if TYPE_CHECKING:
  from typing_extensions import dataclass_transform
else:  # it only informs type checkers (typing has it from Python 3.11)

  def dataclass_transform(**_):
    return lambda cls: cls


def map_arg_step(sources: Mapping[str, str]) -> tuple:
  """The route step of ``map_arg(argname=source, ...)``.

  Raises:
    ValueError: if a source is not a str.
  """
  for argname, source in sources.items():
    if not isinstance(source, str):
      raise ValueError(
        f"map_arg({argname}=...) takes the name of the keyword to read, a str; got {source!r}"
      )
  return tuple((argname, source, ()) for argname, source in sources.items())


def index_into_step(paths: Mapping[str, Any]) -> tuple:
  """The route step of ``index_into(argname=path, ...)``.

  Raises:
    ValueError: if a path is empty or holds a key that is not a str or int.
  """
  step = []
  for argname, path in paths.items():
    path = tuple(path) if isinstance(path, (tuple, list)) else (path,)
    if not path or not all(isinstance(k, (str, int)) for k in path):
      raise ValueError(
        f"index_into({argname}=...) takes a key or a tuple of keys (str or "
        f"int); got {paths[argname]!r}"
      )
    step.append((argname, argname, path))
  return tuple(step)


def route_kwargs(routes: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
  """Applies route steps to update keywords (see :meth:`KeywordReader.map_arg`).

  Args:
    routes: route steps, the most recently added first.
    kwargs: the caller's keywords.

  Returns:
    The keywords the reader sees.

  Raises:
    ValueError: if a source keyword is missing or an index path does not fit.
  """
  kwargs = dict(kwargs)
  for step in routes:
    routed = dict(kwargs)
    for argname, source, path in step:
      if source not in kwargs:
        raise ValueError(
          f"{argname!r} is read from the keyword {source!r} (map_arg/index_into)"
          f", but got keywords {sorted(kwargs)}"
        )
      routed[argname] = index_path(kwargs[source], path, argname=argname, source=source)
    kwargs = routed
  return kwargs


def index_path(value: Any, path: tuple, *, argname: str, source: str) -> Any:
  """``value[path[0]][path[1]]...``; ValueError naming ``index_into`` if a key is missing."""
  for depth, key in enumerate(path):
    try:
      value = value[key]
    except (KeyError, IndexError, TypeError) as e:
      where = "".join(f"[{k!r}]" for k in path[:depth])
      raise ValueError(f"index_into({argname}={path!r}): {source}{where} has no key {key!r}") from e
  return value


def keyword_parameters(*readers) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """``(required, optional)``: the keyword-only parameter names of ``readers``' signatures.

  Required ones have no default. Used to find the update keywords a reader method
  (``_batch_state``, ``_batch_terms``) takes.
  """
  keywords = [
    p
    for reader in readers
    for p in inspect.signature(reader).parameters.values()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
  ]
  # each name once, in order of first appearance (several readers may take the same keyword)
  required = tuple(dict.fromkeys(p.name for p in keywords if p.default is inspect.Parameter.empty))
  optional = tuple(
    dict.fromkeys(p.name for p in keywords if p.default is not inspect.Parameter.empty)
  )
  return required, optional


@dataclasses.dataclass(frozen=True, eq=False)
class KeywordReader:
  """Base of metrics and losses: a named, configured reader of update keywords.

  Subclasses are frozen dataclasses. They name their reader methods in
  ``input_readers`` (e.g. ``("_batch_state",)``); the keyword-only parameters of those
  methods are the update keywords they read (without a default: required).

  Attributes:
    name: the key in logs; the lowercase class name unless given (a non-empty str).
    arg_routes: keyword routing set by :meth:`map_arg` / :meth:`index_into` (static).
  """

  # None by default, replaced in __post_init__: a str once constructed
  name: str = dataclasses.field(default=cast(str, None), kw_only=True)
  arg_routes: tuple = dataclasses.field(default=(), kw_only=True, repr=False)

  #: The methods whose keyword-only parameters are the update keywords read; names of
  #: methods a class does not have are skipped.
  input_readers: ClassVar[tuple[str, ...]] = ()
  _required_inputs: ClassVar[tuple[str, ...]] = ()
  _optional_inputs: ClassVar[tuple[str, ...]] = ()

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    readers = [getattr(cls, r) for r in cls.input_readers if hasattr(cls, r)]
    cls._required_inputs, cls._optional_inputs = keyword_parameters(*readers)

  def __post_init__(self):
    if self.name is None:
      object.__setattr__(self, "name", type(self).__name__.lower())
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"name must be a non-empty str; got {self.name!r}")
    self._check_config()

  def _check_config(self) -> None:
    """Raises ValueError for a bad configuration (override to check)."""

  # --- inputs -------------------------------------------------------------------------

  def required_inputs(self) -> tuple[str, ...]:
    """The update keywords this reader needs (by default, the keyword-only parameters
    without a default of its ``input_readers``; a reader of a configurable keyword
    overrides it)."""
    return self._required_inputs

  def optional_inputs(self) -> tuple[str, ...]:
    """The update keywords this reader uses when given (``mask``, ``weights``, ...)."""
    return self._optional_inputs

  def check_inputs_present(self, kwargs: Mapping[str, Any], owner: str) -> None:
    """Raises ValueError if a required keyword is missing from ``kwargs`` (routed).

    Args:
      kwargs: the keywords after routing.
      owner: who reads them (``"Accuracy.update"``), for the message.
    """
    missing = [k for k in self.required_inputs() if k not in kwargs]
    if missing:
      raise ValueError(
        f"{owner} needs the keyword(s) {', '.join(map(repr, missing))}; got keywords "
        f"{sorted(kwargs)}. Pass them by name (map_arg renames another keyword)."
      )

  # --- routing ------------------------------------------------------------------------

  def routed(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The caller's keywords as this reader sees them (its ``arg_routes`` applied)."""
    return route_kwargs(self.arg_routes, kwargs)

  def map_arg(self, **sources: str):
    """A copy that reads each keyword from another one: ``map_arg(preds="logits")``.

    The copy behaves the same but ``update(logits=...)`` (or ``loss(logits=...)``)
    feeds ``preds``. The renaming is static configuration (``arg_routes``).

    Raises:
      ValueError: if a source name is not a string.
    """
    return self._with_route(map_arg_step(sources))

  def index_into(self, **paths):
    """A copy that indexes into a keyword: ``index_into(preds=("out", "logits"))``.

    ``update(preds={"out": {"logits": x}})`` then feeds ``x`` as ``preds``. A path is a
    key or a tuple/list of keys (str or int).

    Raises:
      ValueError: if a path is empty or holds a key that is not a str or int.
    """
    return self._with_route(index_into_step(paths))

  def _with_route(self, step: tuple):
    reader = copy.copy(self)
    object.__setattr__(reader, "arg_routes", (step,) + tuple(self.arg_routes))
    return reader
