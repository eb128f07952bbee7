"""Pictures of exact metric states: confusion matrix, ROC and PR curves, reliability diagram.

Each function takes a metric (after ``update``/``merge``/``reduce``, on the host or on one
device), draws on ``ax`` (a new figure's Axes when ``None``), labels the axes, shows the
metric's value in the legend or title, and returns the Axes. The data drawn are the
metric's own host views: :meth:`ConfusionMatrix.counts`, :meth:`AUROC.curve`,
:meth:`AUPRC.curve` and :meth:`CalibrationError.bins`, so what is seen is exact for the
whole dataset. Each also takes what ``masked_eval`` returns (its ``.metric`` is the final
metric, reduced over every device and process) or a collection, and draws the member of
the right type (``name=`` picks one when there are several).

matplotlib is an optional extra (``pip install 'padded_eval[plot]'``), imported only when
a function here is called. With ``ax=None`` a figure is made with ``matplotlib.pyplot``
(so it shows in notebooks); scripts that only save files can pass the Axes of a
``matplotlib.figure.Figure`` (no GUI backend, Agg when saved), as the demo does.

Several classes: ``roc_curve`` and ``pr_curve`` draw one line per class of a multiclass
(one-vs-rest) or multilabel metric (up to :data:`MAX_LEGEND_CLASSES` named in the legend),
or one class with ``class_index=c`` (``"micro"``: the summed counts). A confusion matrix
writes each cell's value up to :data:`MAX_CELL_TEXT` classes and stays a readable heat
map (thinned ticks, no text) beyond.
"""

from __future__ import annotations

import numpy as np

from padded_eval import validation
from padded_eval.eval.results import EvalResults, find_metric
from padded_eval.metrics.base import Metric
from padded_eval.metrics.classification.calibration import CalibrationError
from padded_eval.metrics.classification.confusion import NORMALIZE, ConfusionMatrix
from padded_eval.metrics.curves.auc import AUPRC, AUROC

MAX_CELL_TEXT = 20  # above this many classes a confusion matrix has no per-cell text
MAX_TICKS = 20  # at most this many tick labels per axis of a confusion matrix
MAX_LEGEND_CLASSES = 10  # above this many curves, classes are not named in the legend
NORM_NAMES = {"l1": "ECE", "l2": "RMS calibration error", "max": "MCE"}
RELIABILITY_TOP = 1.32  # the reliability diagram's y limit: the band above 1 holds the legend
CONFUSION_UNITS = {
  None: "examples",
  "true": "fraction of the true class",
  "pred": "fraction of the predicted class",
  "all": "fraction of all examples",
}


def new_axes(ax=None):
  """``ax``, or the Axes of a new ``matplotlib.pyplot`` figure when ``None``.

  Raises:
    ImportError: when matplotlib is not installed (it is the ``plot`` extra).

  Examples:
    >>> import padded_eval as pe
    >>> ax = pe.plot.new_axes()
    >>> pe.plot.new_axes(ax) is ax
    True
  """
  if ax is not None:
    return ax
  try:
    import matplotlib.pyplot as plt
  except ImportError as error:  # the optional extra is missing
    raise ImportError(
      "padded_eval.plot needs matplotlib: pip install 'padded_eval[plot]'"
    ) from error
  return plt.subplots(figsize=(5.5, 4.5), layout="constrained")[1]


# --- confusion matrix -------------------------------------------------------------------


def confusion_matrix(m, labels=None, normalize=None, ax=None, *, class_index=None, name=None):
  """Draws a confusion matrix (rows true class, columns predicted) as a heat map.

  Args:
    m: a :class:`~padded_eval.metrics.ConfusionMatrix`, a collection or ``masked_eval``
      result holding one, or a ``[K, K]`` array of counts (a normalised one is drawn as
      it is).
    labels: ``K`` tick labels (default the class ids).
    normalize: ``None`` (counts), ``"true"`` (rows sum to 1), ``"pred"`` (columns) or
      ``"all"``; computed in float64 from the exact counts.
    ax: the Axes to draw on (default: a new figure).
    class_index: the label to draw for a multilabel metric (its ``[2, 2]`` table).
    name: the member's key when ``m`` holds several confusion matrices.

  Returns:
    The Axes; its image array is the drawn table (``ax.images[0].get_array()``), the title
    holds the accuracy (trace over total) and the example count, the colorbar's label the
    unit (`CONFUSION_UNITS`: examples, or the fraction normalised over).

  Raises:
    ValueError: a wrong ``m``, ``normalize``, ``labels`` length or ``class_index``.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> m = pe.metrics.ConfusionMatrix(num_classes=2).update(
    ...   preds=np.array([[2.0, 0], [0, 1.0], [3.0, 1]]), target=np.array([0, 1, 1]))
    >>> ax = pe.plot.confusion_matrix(m)
    >>> ax.images[0].get_array().tolist()
    [[1, 0], [1, 1]]
  """
  validation.check_choice("normalize", normalize, NORMALIZE)
  counts = _confusion_counts(m, class_index, name)
  size = counts.shape[0]
  if labels is None:
    labels = [str(k) for k in range(size)]
  if len(labels) != size:
    raise ValueError(f"labels has {len(labels)} entries; expected {size} (one per class)")
  table = normalized(counts, normalize)
  ax = new_axes(ax)
  image = ax.imshow(table, cmap="Blues", interpolation="nearest", vmin=0)
  ax.figure.colorbar(image, ax=ax, shrink=0.8, label=CONFUSION_UNITS[normalize])
  ticks = np.arange(0, size, max(1, -(-size // MAX_TICKS)))
  ax.set_xticks(ticks, [str(labels[k]) for k in ticks], rotation=90 if size > 10 else 0)
  ax.set_yticks(ticks, [str(labels[k]) for k in ticks])
  if size <= MAX_CELL_TEXT:
    _cell_text(ax, table, integer=normalize is None and np.issubdtype(counts.dtype, np.integer))
  total = counts.sum()
  accuracy = np.trace(counts) / total if total else np.nan
  title = "confusion matrix" + (f" (normalize={normalize!r})" if normalize else "")
  over = (
    f"over {int(total)} examples" if np.issubdtype(counts.dtype, np.integer) else f"of {total:g}"
  )
  ax.set_title(f"{title}\naccuracy = {accuracy:.4f} {over}")
  ax.set_xlabel("predicted class")
  ax.set_ylabel("true class")
  return ax


def _confusion_counts(m, class_index, name) -> np.ndarray:
  """The ``[K, K]`` table to draw (exact int64 counts from a metric)."""
  if isinstance(m, Metric | EvalResults):
    m = find_metric(m, ConfusionMatrix, "m", name)
    counts = m.counts()
    if m.task == "multilabel":
      if not validation.is_int(class_index) or not 0 <= class_index < counts.shape[0]:
        raise ValueError(
          f"class_index must be a label id in [0, {counts.shape[0]}) for a multilabel "
          f"ConfusionMatrix; got {class_index!r}"
        )
      return counts[class_index]
    if class_index is not None:
      raise ValueError(f"class_index is for multilabel metrics; got {class_index!r}")
    return counts
  if isinstance(m, np.ndarray | list) or hasattr(m, "__array__"):
    counts = np.asarray(m)
    if counts.ndim == 2 and counts.shape[0] == counts.shape[1]:
      return counts
  raise ValueError(
    f"m must be a padded_eval.metrics.ConfusionMatrix or a square [K, K] array; got "
    f"{type(m).__name__} of shape {np.shape(m)}"
  )


def normalized(counts: np.ndarray, normalize: str | None) -> np.ndarray:
  """``counts`` normalised over rows (``"true"``), columns (``"pred"``) or ``"all"``,
  float64 (a zero row or column stays 0); the counts themselves for ``None``.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> pe.plot.normalized(np.array([[1, 3], [0, 0]]), "true").tolist()  # a zero row stays 0
    [[0.25, 0.75], [0.0, 0.0]]
  """
  if normalize is None:
    return counts
  axis = {"true": 1, "pred": 0, "all": None}[normalize]
  total = np.sum(counts, axis=axis, keepdims=True, dtype=np.float64)
  return np.divide(counts, total, out=np.zeros(counts.shape), where=total > 0)


def _cell_text(ax, table, integer: bool):
  high = np.nanmax(table) if table.size else 0
  for (row, column), value in np.ndenumerate(table):
    text = f"{int(value)}" if integer else f"{value:.2f}"
    color = "white" if high and value > 0.5 * high else "black"
    ax.text(column, row, text, ha="center", va="center", color=color, fontsize=8)


# --- curves -------------------------------------------------------------------------------


def roc_curve(m, ax=None, *, class_index=None, name=None):
  """Draws the ROC curve of an :class:`~padded_eval.metrics.AUROC` (one line per class).

  Args:
    m: the AUROC metric, or a collection or ``masked_eval`` result holding one.
    ax: the Axes to draw on (default: a new figure).
    class_index: ``None`` (every class), a class id, or ``"micro"``; see ``AUROC.curve``.
    name: the member's key when ``m`` holds several AUROC metrics.

  Returns:
    The Axes: one line per curve, ``(fpr, tpr)`` as :meth:`AUROC.curve` returns them,
    labelled with its area, and a dashed chance line labelled ``"chance"``.

  Raises:
    ValueError: ``m`` is not and holds no AUROC (or several and no ``name``), or a bad ``class_index``.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> m = pe.metrics.AUROC().update(preds=np.array([0.1, 0.4, 0.35, 0.8]), target=np.array([0, 0, 1, 1]))
    >>> ax = pe.plot.roc_curve(m)
    >>> ax.get_xlabel(), ax.get_ylabel()
    ('false positive rate', 'true positive rate')
  """
  m, ax, curves = _metric_curves(m, AUROC, ax, class_index, name)
  for name, (fpr, tpr, _) in curves.items():
    ax.plot(fpr, tpr, lw=1.5, label=_curve_label(name, np.trapezoid(tpr, fpr), len(curves)))
  ax.plot([0, 1], [0, 1], ls="--", color="gray", lw=1, label="chance")
  _finish(ax, m, curves, "false positive rate", "true positive rate", "lower right")
  return ax


def pr_curve(m, ax=None, *, class_index=None, name=None):
  """Draws the precision-recall curve of an :class:`~padded_eval.metrics.AUPRC`.

  Args:
    m: the AUPRC metric, or a collection or ``masked_eval`` result holding one.
    ax: the Axes to draw on (default: a new figure).
    class_index: ``None`` (every class), a class id, or ``"micro"``; see ``AUPRC.curve``.
    name: the member's key when ``m`` holds several AUPRC metrics.

  Returns:
    The Axes: one step line (``drawstyle="steps-post"``) per curve, x recall and y
    precision as :meth:`AUPRC.curve` returns them, labelled with its average precision.

  Raises:
    ValueError: ``m`` is not and holds no AUPRC (or several and no ``name``), or a bad ``class_index``.

  Examples:
    One line per class of a multiclass metric (one-vs-rest), the title holding the macro average:

    >>> import numpy as np
    >>> import padded_eval as pe
    >>> scores = np.array([[0.7, 0.2, 0.1], [0.2, 0.5, 0.3], [0.1, 0.3, 0.6], [0.5, 0.4, 0.1], [0.3, 0.3, 0.4]])
    >>> m = pe.metrics.AUPRC(task="multiclass", num_classes=3)
    >>> ax = pe.plot.pr_curve(m.update(preds=scores, target=np.array([0, 1, 2, 1, 0])))
    >>> [line.get_label() for line in ax.lines], ax.get_title()
    (['class 0 (area = 0.8333)', 'class 1 (area = 1.0000)', 'class 2 (area = 1.0000)'], 'AUPRC, macro = 0.9444')
  """
  m, ax, curves = _metric_curves(m, AUPRC, ax, class_index, name)
  for name, (precision, recall, _) in curves.items():
    area = -np.sum(np.diff(recall) * precision[:-1])
    ax.plot(
      recall, precision, lw=1.5, drawstyle="steps-post", label=_curve_label(name, area, len(curves))
    )
  _finish(ax, m, curves, "recall", "precision", "lower left")
  return ax


def _metric_curves(m, kind: type, ax, class_index, name) -> tuple:
  """``(metric, Axes, {label: curve})``: the `kind` metric `m` holds, the Axes to draw on, and the
  curves of ``m.curve(class_index)`` by the name a legend gives them (``"class c"``; one curve: ``""``)."""
  m = find_metric(m, kind, "m", name)
  curves = m.curve(class_index)
  if isinstance(curves, dict):
    return m, new_axes(ax), {f"class {c}": curve for c, curve in curves.items()}
  return m, new_axes(ax), {"": curves}


def _curve_label(name: str, area: float, count: int) -> str | None:
  if count > MAX_LEGEND_CLASSES:
    return None  # too many classes to name: the title holds the average
  return f"{name} (area = {area:.4f})" if name else f"area = {area:.4f}"


def _finish(ax, m, curves, xlabel: str, ylabel: str, where: str):
  value = float(np.nanmean(np.asarray(m.compute())))
  kind = type(m).__name__
  average = "" if m.task == "binary" or len(curves) == 1 else f", {m.average or 'mean'}"
  ax.set_title(f"{kind}{average} = {value:.4f}")
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_xlim(-0.01, 1.01)
  ax.set_ylim(-0.01, 1.01)
  ax.legend(loc=where, fontsize="small")


# --- reliability ------------------------------------------------------------------------


def reliability_diagram(m, ax=None, *, name=None):
  """Draws the reliability diagram of a :class:`~padded_eval.metrics.CalibrationError`.

  Args:
    m: the CalibrationError metric, or a collection or ``masked_eval`` result holding one.
    ax: the Axes to draw on (default: a new figure).
    name: the member's key when ``m`` holds several CalibrationError metrics.

  Returns:
    The Axes: one bar per non-empty bin (left edge ``b / n_bins``, height its accuracy, or
    fraction of positives for a binary metric, its exact count written at its foot), the
    line through ``(mean confidence, accuracy)`` of those bins (labelled ``"accuracy at each
    bin's mean confidence"``; binary: ``"fraction of positives at each bin's mean predicted
    probability"``) and the dashed diagonal ``"perfect calibration"``. The legend, with the
    metric's value, sits above the line ``y = 1`` (the y axis runs to `RELIABILITY_TOP`),
    where nothing is drawn.

  Raises:
    ValueError: ``m`` is not and holds no CalibrationError (or several and no ``name``).

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> m = pe.metrics.CalibrationError(n_bins=2).update(
    ...   preds=np.array([0.2, 0.3, 0.8, 0.9]), target=np.array([0, 1, 1, 1]))
    >>> ax = pe.plot.reliability_diagram(m)
    >>> [round(float(bar.get_height()), 2) for bar in ax.patches]  # the accuracy of each bin
    [0.5, 1.0]
  """
  m = find_metric(m, CalibrationError, "m", name)
  mean_confidence, accuracy, count = m.bins()
  filled = count > 0
  edges = np.linspace(0.0, 1.0, m.n_bins + 1)[:-1]
  ax = new_axes(ax)
  name = NORM_NAMES[m.norm]
  binary = m.task == "binary"
  height, position = (
    ("fraction of positives", "mean predicted probability")
    if binary
    else ("accuracy", "mean confidence")
  )
  ax.bar(
    edges[filled],
    accuracy[filled],
    width=1.0 / m.n_bins,
    align="edge",
    edgecolor="black",
    alpha=0.6,
    label=f"{height} per bin ({name} = {float(m.compute()):.4f})",
  )
  for left, number in zip(edges[filled], count[filled]):  # how much each bar weighs
    ax.text(left + 0.5 / m.n_bins, 0.01, f"{number}", ha="center", va="bottom", fontsize=7)
  ax.plot(
    mean_confidence[filled],
    accuracy[filled],
    "o-",
    ms=3,
    label=f"{height} at each bin's {position}",
  )
  ax.plot([0, 1], [0, 1], ls="--", color="gray", lw=1, label="perfect calibration")
  ax.set_xlabel("predicted probability" if binary else "confidence (top class probability)")
  ax.set_ylabel(height)
  ax.set_title(f"reliability diagram, {int(count.sum())} examples (count per bar)")
  ax.set_xlim(0, 1)
  # Everything drawn lies at heights in [0, 1]: the legend sits in the band above (no ticks
  # there), so it covers no bar, point or line whatever the model's calibration.
  ax.set_ylim(0, RELIABILITY_TOP)
  ax.set_yticks(np.linspace(0, 1, 6))
  ax.axhline(1.0, color="black", lw=0.8)
  ax.legend(loc="upper center", fontsize="small", frameon=False, borderaxespad=0.2)
  return ax
