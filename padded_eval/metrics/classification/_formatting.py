"""One input formatter per classification task, shared by every classification metric.

Confusion counts, curves, calibration and Accuracy all read ``preds`` / ``target`` /
``mask`` through :func:`format_inputs`, which checks shapes and dtypes eagerly (a
``ValueError`` naming the keyword) and returns the elements with one ``valid`` mask and
the invalid real elements by kind (values that cannot raise inside ``jit`` are counted,
never silently dropped):

* ``"binary"``: ``preds`` ``[...]`` probabilities (or logits with ``from_logits=True``, or
  hard 0/1), ``target`` ``[...]`` int 0/1. Elements get a trailing axis of size 1.
* ``"multilabel"``: ``preds`` and ``target`` ``[..., C]``, as for binary per label.
* ``"multiclass"``: ``target`` ``[...]`` int class ids in ``[0, C)``; ``preds`` ``[...]`` int
  class ids or ``[..., C]`` scores (the ``k`` best, NaN ranked worst, ties to the lower
  class like ``lax.top_k``).

Targets must be ints (or bool): float targets are refused with a ``ValueError``. An
element is *considered* when it is real (``mask``) and its target is not
``ignore_index``; it is *valid* (counted) when its target is also a label (0/1, or a
class id in ``[0, C)``). The invalid kinds, counted over considered elements:

* ``"target out of range"``: a target that is not a label (binary ``{1, 2}``, ``-1``, a
  class id ``>= C``); the element is not counted;
* ``"pred id out of range"``: a multiclass class-id prediction outside ``[0, C)``; it is
  a wrong prediction (a miss of the true class, no class predicted);
* ``"nan score"``: a NaN score (for multiclass scores: a row with any NaN); NaN is
  ranked worst (never predicted), thresholded as negative, and left out of curves and
  calibration bins;
* ``"probability outside [0, 1]"``: a finite or infinite probability outside ``[0, 1]``
  where ``preds`` are read as probabilities (``from_logits=False``; binary and
  multilabel always, multiclass scores for curves and calibration), e.g. logits passed
  without ``from_logits=True``;
* ``"preds look like probabilities, not logits"``: with ``from_logits=True``, probabilities
  passed as logits. Binary and multilabel: every considered score of the *whole evaluation*
  is in ``[0, 1]`` (more than one; each is counted). The scores outside ``[0, 1]`` are
  counted too, under `LOGIT_EVIDENCE`, a kind that is never reported: one of them anywhere,
  on any device, clears the report (`reported_invalid_counts`), so the verdict does not
  depend on how the rows were batched or split over devices. Multiclass scores: each row
  that is a distribution (all in ``[0, 1]``, summing to 1), more than one in all.

An element of weight 0 is not seen (``weights=`` of :func:`format_inputs`, see
:func:`weighed_invalid`): it is counted under no kind, `LOGIT_EVIDENCE` included.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.exact.accumulate import upcast
from padded_eval.masking import broadcast_mask, broadcast_prefix

TARGET_OUT_OF_RANGE = "target out of range"
PRED_ID_OUT_OF_RANGE = "pred id out of range"
NAN_SCORE = "nan score"
PROBABILITY_OUT_OF_RANGE = "probability outside [0, 1]"
PROBABILITIES_AS_LOGITS = "preds look like probabilities, not logits"
#: Scores outside ``[0, 1]`` with ``from_logits=True``: counted, never reported; any of them
#: clears `PROBABILITIES_AS_LOGITS` (see `reported_invalid_counts`).
LOGIT_EVIDENCE = "score outside [0, 1] (logits)"
#: Every kind an input formatter can report, in the order metrics declare them.
INVALID_KINDS = (
  TARGET_OUT_OF_RANGE,
  PRED_ID_OUT_OF_RANGE,
  NAN_SCORE,
  PROBABILITY_OUT_OF_RANGE,
  PROBABILITIES_AS_LOGITS,
  LOGIT_EVIDENCE,
)
#: The kinds of score-only metrics (curves, calibration): no class-id predictions.
SCORE_INVALID_KINDS = (
  TARGET_OUT_OF_RANGE,
  NAN_SCORE,
  PROBABILITY_OUT_OF_RANGE,
  PROBABILITIES_AS_LOGITS,
  LOGIT_EVIDENCE,
)


def reported_invalid_counts(counts: dict[str, int]) -> dict[str, int]:
  """A metric's ``{kind: count}`` as reported: without `LOGIT_EVIDENCE`, and with
  `PROBABILITIES_AS_LOGITS` 0 unless no score outside ``[0, 1]`` was seen and more than one
  looked like a probability (the verdict of the whole evaluation, see the module docstring).
  Counts of a metric that does not declare `LOGIT_EVIDENCE` are returned as they are."""
  if LOGIT_EVIDENCE not in counts:
    return counts
  counts = dict(counts)
  evidence = counts.pop(LOGIT_EVIDENCE)
  if PROBABILITIES_AS_LOGITS in counts and (evidence or counts[PROBABILITIES_AS_LOGITS] < 2):
    counts[PROBABILITIES_AS_LOGITS] = 0
  return counts


class LabelElements(NamedTuple):
  """Binary / multilabel elements, each ``[..., L]`` (``L`` = 1 for binary).

  Attributes:
    scores: float32 ``preds`` as given (probabilities, or logits with ``from_logits``).
    truth: bool, the target is 1.
    valid: bool, the element is counted (real, not ignored, target 0 or 1).
    invalid: ``{kind: bool [..., L]}`` invalid considered elements.
  """

  scores: jax.Array
  truth: jax.Array
  valid: jax.Array
  invalid: dict


class ClassElements(NamedTuple):
  """Multiclass elements of ``target``'s shape ``[...]``.

  Attributes:
    labels: int32 target class ids.
    valid: bool, the element is counted (real, not ignored, target in ``[0, C)``).
    scores: float32 ``[..., C]`` score preds as given, or None for class-id preds.
    ids: int32 class-id preds (-1 where out of range), or None for score preds.
    invalid: ``{kind: bool [...]}`` invalid considered elements.
  """

  labels: jax.Array
  valid: jax.Array
  scores: jax.Array | None
  ids: jax.Array | None
  invalid: dict

  def top_k(self, k: int = 1) -> jax.Array:
    """int32 ``[..., k]`` predicted class ids, best first; -1 means no class (a miss).

    Raises:
      ValueError: ``k > 1`` for class-id preds (top-k needs scores).
    """
    if self.ids is not None:
      if k != 1:
        raise ValueError(
          f"top_k={k} needs score preds [..., C]; got class ids of shape {self.ids.shape}"
        )
      return self.ids[..., None]
    assert self.scores is not None  # score preds when there are no ids
    return top_k_ids(self.scores, k)


def label_inputs(elements: LabelElements | ClassElements) -> LabelElements:
  """``elements`` of a binary / multilabel task, as its formatter returns them."""
  assert isinstance(elements, LabelElements), type(elements)
  return elements


def class_inputs(elements: LabelElements | ClassElements, scores: bool = False) -> ClassElements:
  """``elements`` of a multiclass task, as its formatter returns them; ``scores``: score preds
  (a metric that refuses class ids), whose ``scores`` are not None."""
  assert isinstance(elements, ClassElements), type(elements)
  assert not scores or elements.scores is not None
  return elements


def _order_keys(scores: jax.Array, is_nan: jax.Array) -> jax.Array:
  """int32 keys in the order of the float ``scores``: -0.0 equal to 0.0 (``lax.top_k`` on
  floats ranks 0.0 above -0.0), NaN below -inf (as -inf, it would tie with a real -inf)."""
  scores = upcast(jnp.asarray(scores))
  bits = jax.lax.bitcast_convert_type(jnp.where(scores == 0, 0.0, scores), jnp.int32)
  keys = jnp.where(bits < 0, bits ^ np.int32(0x7FFFFFFF), bits)  # negatives: magnitude flipped
  return jnp.where(is_nan, np.iinfo(np.int32).min, keys)


def top_k_ids(scores: jax.Array, k: int) -> jax.Array:
  """int32 ``[..., k]`` ids of the ``k`` best scores; NaN ranks worst and reads -1.

  Ties go to the lower class (``argmax`` / ``lax.top_k``). A NaN score is never
  preferred to a number; a pick that had to fall on a NaN score (fewer than ``k``
  numbers in the row) is -1, no class.
  """
  is_nan = jnp.isnan(scores)
  ranked = _order_keys(scores, is_nan)
  if k == 1:
    ids = jnp.argmax(ranked, axis=-1)[..., None]
  else:
    ids = jax.lax.top_k(ranked, k)[1]
  ids = ids.astype(jnp.int32)
  return jnp.where(jnp.take_along_axis(is_nan, ids, axis=-1), -1, ids)


def probabilities(scores, from_logits: bool, axis=None) -> jax.Array:
  """float32 probabilities: ``scores`` as they are, or sigmoid / softmax of logits."""
  scores = upcast(jnp.asarray(scores))
  if not from_logits:
    return scores
  return jax.nn.sigmoid(scores) if axis is None else jax.nn.softmax(scores, axis=axis)


# --- eager checks (shapes and dtypes: known even inside jit) -----------------------------


def check_label_dtype(target, task: str) -> None:
  """Raises ValueError unless ``target`` holds ints (or bools)."""
  if not (jnp.issubdtype(target.dtype, jnp.integer) or target.dtype == jnp.bool_):
    raise ValueError(
      f"task={task!r}: target must hold int labels; got dtype {target.dtype}. Cast it "
      "(target.astype(int)): float labels such as 0.7 or 1.5 are not classes"
    )


def check_bool_classes(preds, target, num_classes: int | None) -> None:
  """Raises ValueError naming ``target`` when a bool target meets more than two classes.

  A bool target reads as classes 0 (False) and 1 (True): with ``num_classes=10`` (or
  ``[..., 10]`` scores) it is almost always a mistake (``labels == k``, a binary label fed to a
  10-class metric), and the accuracy of a 10-class model against it is near 0.1, silently.
  Two classes (or an unknown count: class-id preds without ``num_classes``) are accepted.
  """
  if target.dtype != jnp.bool_:
    return
  classes = num_classes
  if classes is None and preds.ndim == target.ndim + 1:
    classes = preds.shape[-1]
  if classes is None or classes == 2:
    return
  raise ValueError(
    f"task='multiclass' with {classes} classes: target has dtype bool (shape {target.shape}), "
    f"which reads as classes 0 (False) and 1 (True) only; expected int class ids in [0, {classes}). "
    "Pass the int labels, or for a yes/no target use task='binary' with one score per row"
  )


def check_same_shape(preds, target, task: str) -> None:
  """Raises ValueError unless ``preds`` and ``target`` have one shape."""
  if preds.shape != target.shape:
    raise ValueError(
      f"task={task!r}: preds has shape {preds.shape} but target has shape "
      f"{target.shape}; expected equal shapes"
    )


def _probability_out_of_range(scores) -> jax.Array:
  return ~jnp.isnan(scores) & ((scores < 0) | (scores > 1))


def nan_missing_labels(target, mask):
  """``(int32 target, mask [..., L])`` of float multilabel labels with NaN for missing.

  NaN is a missing label: the element is masked out, neither counted nor invalid (OGB's
  ``y_true == y_true``). 0.0 and 1.0 are the labels; any other value becomes 2, an
  invalid ``"target out of range"``. Int targets are returned as they are.
  """
  target = jnp.asarray(target)
  if jnp.issubdtype(target.dtype, jnp.integer) or target.dtype == jnp.bool_:
    return target, mask
  labelled = ~jnp.isnan(target)
  labels = jnp.where(target == 1, 1, jnp.where(target == 0, 0, 2)).astype(jnp.int32)
  return labels, broadcast_mask(mask, target.shape, "target") & labelled


# --- the formatters ------------------------------------------------------------------


def label_elements(preds, target, mask, *, task, num_classes, from_logits, ignore_index):
  """Binary / multilabel inputs as :class:`LabelElements` (see the module docstring).

  Args:
    preds: ``[...]`` (binary) or ``[..., C]`` (multilabel) probabilities / logits / 0-1.
    target: int 0/1 of ``preds``' shape.
    mask: None or a bool prefix of ``target``'s shape.
    task: ``"binary"`` or ``"multilabel"``.
    num_classes: ``C`` for multilabel (None for binary).
    from_logits: ``preds`` are logits (no probability range check; a batch whose every considered
      score is in [0, 1] is counted, kind ``"preds look like probabilities, not logits"``).
    ignore_index: None or a target value whose elements are left out.

  Returns:
    :class:`LabelElements`, each ``[..., L]``.

  Raises:
    ValueError: float targets, or shapes that do not fit the task.
  """
  preds, target = jnp.asarray(preds), jnp.asarray(target)
  check_label_dtype(target, task)
  check_same_shape(preds, target, task)
  if task == "multilabel" and (target.ndim == 0 or target.shape[-1] != num_classes):
    raise ValueError(
      f"task='multilabel' needs target [..., {num_classes}] (num_classes labels last); got "
      f"shape {target.shape}"
    )
  target = target.astype(jnp.int32)
  scores = upcast(preds)
  considered = broadcast_mask(mask, target.shape, "target")
  if ignore_index is not None:
    considered &= target != ignore_index
  is_label = (target == 0) | (target == 1)
  invalid = {
    TARGET_OUT_OF_RANGE: considered & ~is_label,
    NAN_SCORE: considered & jnp.isnan(scores),
  }
  if not from_logits:
    invalid[PROBABILITY_OUT_OF_RANGE] = considered & _probability_out_of_range(scores)
  else:  # probabilities passed as logits: sigmoid(p) >= 0.5 predicts every element positive;
    # decided over the whole evaluation from both counts (reported_invalid_counts)
    in_unit = (scores >= 0) & (scores <= 1)
    invalid[PROBABILITIES_AS_LOGITS] = considered & in_unit
    invalid[LOGIT_EVIDENCE] = considered & ~in_unit & ~jnp.isnan(scores)
  elements = LabelElements(scores, target == 1, considered & is_label, invalid)
  if task == "binary":
    return LabelElements(
      elements.scores[..., None],
      elements.truth[..., None],
      elements.valid[..., None],
      {k: v[..., None] for k, v in invalid.items()},
    )
  return elements


def class_elements(
  preds,
  target,
  mask,
  *,
  num_classes,
  ignore_index,
  scores_only=False,
  probability_scores=False,
  logit_scores=False,
):
  """Multiclass inputs as :class:`ClassElements` (see the module docstring).

  Args:
    preds: ``[...]`` int class ids or ``[..., C]`` float scores.
    target: ``[...]`` int class ids.
    mask: None or a bool prefix of ``target``'s shape.
    num_classes: ``C``; None only for class-id preds of unknown range (then only negative
      ids are out of range).
    ignore_index: None or a target value whose elements are left out.
    scores_only: refuse class-id preds (curves, calibration).
    probability_scores: the scores are probabilities: count rows with one outside [0, 1].
    logit_scores: the scores are logits (a softmax follows): count rows that look like
      probabilities (kind ``"preds look like probabilities, not logits"``, see
      :func:`looks_like_probabilities`); the softmax of probabilities flattens them toward uniform.

  Returns:
    :class:`ClassElements`.

  Raises:
    ValueError: float targets, float class ids, or shapes that do not fit.
  """
  preds, target = jnp.asarray(preds), jnp.asarray(target)
  check_label_dtype(target, "multiclass")
  check_bool_classes(preds, target, num_classes)
  labels = target.astype(jnp.int32)
  considered = broadcast_mask(mask, target.shape, "target")
  if ignore_index is not None:
    considered &= target != ignore_index
  in_range = labels >= 0 if num_classes is None else (labels >= 0) & (labels < num_classes)
  invalid = {TARGET_OUT_OF_RANGE: considered & ~in_range}
  valid = considered & in_range
  score_shape = target.shape + (() if num_classes is None else (num_classes,))
  if preds.shape == target.shape and not scores_only:
    if not jnp.issubdtype(preds.dtype, jnp.integer):
      raise ValueError(
        f"task='multiclass': preds of target's shape must be int class ids; got dtype "
        f"{preds.dtype}. Pass scores [..., {num_classes}], or use task='binary' for "
        "probabilities of one class"
      )
    ids = preds.astype(jnp.int32)
    ids_ok = ids >= 0 if num_classes is None else (ids >= 0) & (ids < num_classes)
    invalid[PRED_ID_OUT_OF_RANGE] = considered & ~ids_ok
    return ClassElements(labels, valid, None, jnp.where(ids_ok, ids, -1), invalid)
  if num_classes is None or preds.shape != score_shape:
    expected = f"{score_shape} (scores for num_classes={num_classes})"
    if not scores_only:
      expected = f"{target.shape} (class ids) or {expected}"
    raise ValueError(
      f"task='multiclass': preds has shape {preds.shape} and target {target.shape}; "
      f"expected preds {expected}"
    )
  scores = upcast(preds)
  invalid[NAN_SCORE] = considered & jnp.any(jnp.isnan(scores), axis=-1)
  if probability_scores:
    out_of_range = jnp.any(_probability_out_of_range(scores), axis=-1)
    invalid[PROBABILITY_OUT_OF_RANGE] = considered & out_of_range
  if logit_scores:
    invalid[PROBABILITIES_AS_LOGITS] = considered & looks_like_probabilities(scores)
  return ClassElements(labels, valid, scores, None, invalid)


def weighed_invalid(invalid: dict, weights) -> dict:
  """``invalid`` without the elements of weight 0: a weight-0 element changes nothing, so it
  is counted under no kind (as the weighted sums leave it out).

  Args:
    invalid: ``{kind: bool array}`` of invalid real elements.
    weights: None (every element counts) or the update's weights, a prefix of each array's
      shape (NaN or negative weights are not 0: their elements are counted).

  Raises:
    ValueError: ``weights`` whose shape is not a prefix of the arrays'.
  """
  if weights is None:
    return invalid
  nonzero = jnp.asarray(weights) != 0
  return {
    kind: flags & broadcast_prefix(nonzero, flags.shape, "weights", "target")
    for kind, flags in invalid.items()
  }


def format_inputs(
  preds,
  target,
  mask,
  *,
  task,
  num_classes,
  from_logits=False,
  ignore_index=None,
  scores_only=False,
  weights=None,
):
  """The one entry point: :class:`LabelElements` (binary, multilabel) or
  :class:`ClassElements` (multiclass) of ``preds`` / ``target`` / ``mask``.

  ``scores_only`` (curves, calibration) refuses multiclass class ids and reads
  multiclass scores as probabilities unless ``from_logits``. ``weights`` (None or the
  update's sample weights): the elements of weight 0 are counted under no invalid kind
  (:func:`weighed_invalid`); the elements themselves are returned as they are. See
  :func:`label_elements` and :func:`class_elements` for the other arguments.
  """
  if task == "multiclass":
    elements = class_elements(
      preds,
      target,
      mask,
      num_classes=num_classes,
      ignore_index=ignore_index,
      scores_only=scores_only,
      probability_scores=scores_only and not from_logits,
      logit_scores=scores_only and from_logits,
    )
  else:
    elements = label_elements(
      preds,
      target,
      mask,
      task=task,
      num_classes=num_classes,
      from_logits=from_logits,
      ignore_index=ignore_index,
    )
  return elements._replace(invalid=weighed_invalid(elements.invalid, weights))


def looks_like_probabilities(scores: jax.Array, axis: int = -1) -> jax.Array:
  """Whether each row of ``scores`` along ``axis`` looks like a probability distribution (every
  value in ``[0, 1]``, the row summing to 1 within 1e-3): softmax outputs passed where logits
  are expected. Logits almost never do. Returns a bool array without ``axis``.
  """
  scores = upcast(jnp.asarray(scores))
  in_unit = jnp.all((scores >= 0) & (scores <= 1), axis=axis)
  return in_unit & (jnp.abs(jnp.sum(scores, axis=axis) - 1) <= 1e-3)
