"""A griffe extension for the API reference (mkdocs.yml): every metric lists every constructor argument.

A metric's configuration fields are partly inherited (``name`` and ``arg_routes`` from every
metric, ``task`` / ``num_classes`` / ``from_logits`` from the classification base, the binning
options from the curves' base), and a class docstring documents only its own. For each public
class of ``padded_eval.metrics`` this extension appends to its ``Args:`` section each constructor
argument it lacks: from the docstring of the public class that documents the declaring base's
fields (`DOCUMENTED_BY`), else from `SHARED` (what the declaring base's fields mean). Docs only:
the docstrings in the package are unchanged.
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re
import sys
from typing import Any

import griffe

ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if ROOT not in sys.path:  # the checkout being documented, not an installed copy
  sys.path.insert(0, ROOT)

DOCUMENTED_BY = {
  "padded_eval.metrics.curves.histogram.ScoreHistogram": "padded_eval.metrics.curves.auc.AUROC",
  "padded_eval.metrics.averages._PerOutputMean": "padded_eval.metrics.averages.MSE",
  "padded_eval.metrics.averages.WeightedMean": "padded_eval.metrics.averages.Mean",
}
"""The declaring base -> the public class whose ``Args:`` describe its fields."""

_CLASSIFICATION = "padded_eval.metrics.classification"
SHARED: dict[tuple[str | None, str], str] = {
  (None, "name"): "the key of the value in ``compute_logs()`` (default: the lowercase class name).",
  (None, "arg_routes"): (
    "keyword routing, set by ``map_arg(preds=...)`` / ``index_into(...)`` rather than by hand "
    "(static configuration; default: none)."
  ),
  (None, "task"): (
    '``"binary"``, ``"multiclass"`` or ``"multilabel"``: what ``preds`` and ``target`` hold '
    "(see the confusion metrics' inputs)."
  ),
  (None, "num_classes"): (
    "the number of classes ``C`` (multiclass) or labels (multilabel); needed where a result has "
    "one value per class."
  ),
  (None, "from_logits"): (
    "``preds`` are logits (sigmoid for binary / multilabel, softmax for multiclass scores), "
    "not probabilities."
  ),
  (None, "ignore_index"): (
    "a target value whose elements are left out (not counted, not invalid); None: none."
  ),
  (f"{_CLASSIFICATION}.confusion.ConfusionState", "threshold"): (
    "binary / multilabel probabilities (logits with ``from_logits``) at or above it predict "
    "the positive class."
  ),
  (f"{_CLASSIFICATION}.stat_scores.ZeroOneLoss", "threshold"): (
    "binary / multilabel probabilities at or above it predict the positive class."
  ),
  (f"{_CLASSIFICATION}.confusion.ConfusionState", "top_k"): (
    "multiclass: the ``k`` best-scored classes are predicted (see ``top_k_rule``)."
  ),
  (f"{_CLASSIFICATION}.confusion.ConfusionState", "top_k_rule"): (
    '``"every"`` (each of the ``k`` best is predicted) or ``"torchmetrics"`` (the target when '
    "among the ``k`` best, else the best class)."
  ),
  (f"{_CLASSIFICATION}.scores.ClassScore", "average"): (
    '``"micro"`` (the summed counts), ``"macro"`` (the mean over classes), ``"weighted"`` '
    '(by support), ``None`` (``[C]`` per-class scores), or ``"samples"`` (multilabel rows); '
    'not used with ``task="binary"``.'
  ),
  (f"{_CLASSIFICATION}.scores.ClassScore", "zero_division"): (
    "the value of an undefined ratio (0, 1 or NaN, as scikit-learn's ``zero_division``)."
  ),
  (f"{_CLASSIFICATION}.scores.ClassScore", "multidim_average"): (
    '``"global"`` (every element counted together) or ``"samplewise"`` (each row scored over '
    "its extra axes; ``compute()`` is their mean)."
  ),
  (f"{_CLASSIFICATION}.scores.ClassScore", "labels"): (
    "the class ids to score and average over (scikit-learn's ``labels``); None: every class."
  ),
  (f"{_CLASSIFICATION}.scores.ClassScore", "weighted"): (
    "count each element with its sample weights (the ``weights`` keyword, scikit-learn's "
    "``sample_weight``); without it ``weights=`` is refused."
  ),
  ("padded_eval.metrics.curves.histogram.ScoreHistogram", "average"): (
    '``"macro"``, ``"weighted"``, ``"micro"``, ``None`` (per class) or ``"samples"`` '
    '(multilabel) over the per-class values; not used with ``task="binary"``.'
  ),
  ("padded_eval.metrics.curves.histogram.ScoreHistogram", "binning"): (
    "how scores map to bins (see [the module docstring][padded_eval.metrics.curves.auc]); "
    "None: the default for ``from_logits``."
  ),
  (f"{_CLASSIFICATION}.stat_scores.BalancedAccuracy", "adjusted"): (
    "chance scores 0: ``(score - 1 / K) / (1 - 1 / K)`` over the ``K`` classes in the target "
    "(scikit-learn's ``adjusted``)."
  ),
  ("padded_eval.metrics.images.SSIM", "k1"): "``C1 = (k1 * data_range)**2``.",
  ("padded_eval.metrics.images.SSIM", "k2"): "``C2 = (k2 * data_range)**2``.",
  ("padded_eval.metrics.curves.operating_points.PrecisionAtFixedRecall", "min_recall"): (
    "the smallest recall a threshold must reach (required)."
  ),
  ("padded_eval.metrics.curves.operating_points.SensitivityAtSpecificity", "min_specificity"): (
    "the smallest specificity a threshold must reach (required)."
  ),
  ("padded_eval.metrics.curves.operating_points.SpecificityAtSensitivity", "min_sensitivity"): (
    "the smallest sensitivity a threshold must reach (required)."
  ),
  ("padded_eval.metrics.values.FromFun", "fun"): (
    "the function, called as ``fun(**update_keywords)``; it returns the wrapped metric's keywords."
  ),
  ("padded_eval.metrics.values.FromFun", "metric"): "the wrapped metric (``compute()`` is its).",
}
"""``(declaring class or None, argument) -> description`` for what no public docstring describes."""


def documented_args(doc: str | None) -> dict[str, str]:
  """``{argument: description}`` of a Google-style docstring's ``Args:`` section."""
  doc = inspect.cleandoc(doc or "")
  match = re.search(r"^Args[^\n]*:\n((?:[ \t]+\S.*\n?|[ \t]*\n)*)", doc, re.M)
  args: dict[str, list[str]] = {}
  current = None
  for line in (match.group(1) if match else "").splitlines():
    entry = re.match(r"^  (\w+)(?: \([^)]*\))?:\s*(.*)$", line)
    if entry:
      current = entry.group(1)
      args[current] = [entry.group(2)]
    elif current and line.startswith("    "):
      args[current].append(line.strip())
  return {name: " ".join(lines) for name, lines in args.items()}


def _runtime(path: str) -> Any:
  module, _, name = path.rpartition(".")
  return getattr(importlib.import_module(module), name)


def _qualified(cls: type) -> str:
  return f"{cls.__module__}.{cls.__qualname__}"


def describe(cls: type, argument: str) -> str | None:
  """What ``argument`` of ``cls`` means, from the class that declares it."""
  owner = next(
    (base for base in cls.__mro__ if argument in vars(base).get("__annotations__", {})), None
  )
  chain = [_qualified(base) for base in cls.__mro__]
  if owner is not None:
    chain.insert(0, _qualified(owner))
  for path in chain:
    if (path, argument) in SHARED:
      return SHARED[(path, argument)]
    if path in DOCUMENTED_BY:
      text = documented_args(_runtime(DOCUMENTED_BY[path]).__doc__).get(argument)
      if text:
        return text
  return SHARED.get((None, argument))


def missing_args(cls: type) -> list[tuple[str, str]]:
  """``(argument, description)`` of the constructor arguments ``cls``'s docstring lacks."""
  own = documented_args(cls.__doc__)
  try:
    parameters = inspect.signature(cls).parameters.values()
  except (TypeError, ValueError):
    return []
  missing = []
  for parameter in parameters:
    if parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL) or parameter.name in own:
      continue
    text = describe(cls, parameter.name)
    if text is not None:
      missing.append((parameter.name, text))
  return missing


def with_args(docstring: str, added: list[tuple[str, str]]) -> str:
  """``docstring`` with ``added`` entries at the end of its ``Args:`` section (a new one before
  its first other section when it has none)."""
  lines = docstring.splitlines()
  entries = [f"    {name}: {text}" for name, text in added]
  start = next((i for i, line in enumerate(lines) if re.match(r"^Args[^\n]*:$", line)), None)
  if start is None:
    section = next(
      (
        i
        for i, line in enumerate(lines)
        if re.match(r"^(Examples?|Raises|Returns|Attributes):$", line)
      ),
      len(lines),
    )
    block = ["Args:", *[entry[2:] for entry in entries], ""]
    return "\n".join(lines[:section] + block + lines[section:])
  end = start + 1
  while end < len(lines) and (not lines[end].strip() or lines[end].startswith(" ")):
    end += 1
  while end > start + 1 and not lines[end - 1].strip():
    end -= 1
  return "\n".join(lines[:end] + [entry[2:] for entry in entries] + lines[end:])


class InheritedArgs(griffe.Extension):
  """Appends the inherited constructor arguments to the public metric classes' ``Args:``."""

  def on_class(self, *, cls: griffe.Class, **kwargs: Any) -> None:
    if not cls.path.startswith("padded_eval.metrics.") or cls.docstring is None:
      return
    import padded_eval

    try:
      runtime = _runtime(cls.path)
    except (ImportError, AttributeError):
      return
    if not any(runtime is value for value in vars(padded_eval.metrics).values()):
      return  # not a public name of pe.metrics (NPV is NegativePredictiveValue)
    if not (isinstance(runtime, type) and issubclass(runtime, padded_eval.Metric)):
      return
    added = missing_args(runtime)
    if added:
      cls.docstring.value = with_args(cls.docstring.value, added)
