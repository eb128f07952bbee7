"""What a tf.data pipeline does to its rows, read through tf.data's private lineage (``_inputs()``,
``_input_dataset``, a batch op's ``_batch_size`` and ``_drop_remainder``): whether its elements are
batches, whether it reads every row once, and how many padded batches it will give (an estimate).

TensorFlow is imported only inside these functions, once a dataset has been passed (see `tf_data`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from padded_eval.data._tree import path_name

__all__ = [
  "batches_hint",
  "cardinality",
  "check_fixed_order",
  "check_rows_read_once",
  "infer_batched",
  "inner_batches",
  "nearest_batch_size",
  "pipeline",
  "rows_dropped",
]

MAX_PIPELINE_DEPTH = 256


def cardinality(dataset: Any) -> int:
  """``dataset.cardinality()``, or ``tf.data.UNKNOWN_CARDINALITY`` (-2) where tf.data's count may be
  wrong: it counts a ``.repeat()`` of an input of unknown cardinality (after a ``filter``) as
  infinite, and a later ``.take(n)`` as n elements, though an input that yields nothing repeats
  into nothing. Nothing is read."""
  count = int(dataset.cardinality())
  if count < 0:
    return count
  for node in pipeline(dataset):
    if "Repeat" in type(node).__name__ and int(getattr(node, "_count", 1)) < 0:
      parent = getattr(node, "_input_dataset", None)  # tf.data keeps the repeat's parts private
      if parent is None or int(parent.cardinality()) == -2:
        return -2
  return count


def batches_hint(dataset: Any, batched: bool, batch_size: int) -> int | None:
  """A batched pipeline of known cardinality whose batch size is not static (``ds.batch(n)``): the rows
  its nearest batch op reads (that op's input cardinality, times k after a ``repeat(k)``, else
  ``cardinality * n``, e.g. after a ``take``) over `batch_size`,
  an estimate (a map may change a batch's rows); else None. Nothing is read."""
  count = cardinality(dataset)
  if not batched or count < 0:
    return None
  for node in pipeline(dataset):
    size = getattr(node, "_batch_size", None)  # tf.data keeps the batch op's parts private
    if "batch" not in type(node).__name__.lower() or size is None:
      continue
    parent = getattr(node, "_input_dataset", None)
    rows = -1 if parent is None else int(parent.cardinality())
    batches = int(node.cardinality())
    if rows >= 0 and batches != count:  # a later repeat(k) (k times the batch op's rows) or take
      rows = rows * (count // batches) if batches > 0 and count % batches == 0 else -1
    rows = rows if rows >= 0 else count * int(size)
    return -(-rows // batch_size)
  return None


def nearest_batch_size(dataset: Any) -> int | None:
  """The size of the batch op nearest the pipeline's end (``ds.batch(n)``, ``padded_batch(n)``):
  its batches have ``n`` rows but the last, unless a later map changes their rows. None when no
  such op is found (none, or a ``rebatch``). Nothing is read."""
  for node in pipeline(dataset):
    size = getattr(node, "_batch_size", None)  # tf.data keeps the batch op's parts private
    if "batch" in type(node).__name__.lower() and size is not None:
      return int(size)
  return None


def infer_batched(dataset: Any, specs: dict) -> bool:
  """Whether elements are batches: a scalar leaf says no, an unknown leading size says yes, else a batch op does."""
  ranks = [spec.shape.rank for spec in specs.values()]
  if None in ranks:
    raise ValueError(
      f"key {path_name(next(p for p, s in specs.items() if s.shape.rank is None))} has unknown rank; "
      "pass batched=True or batched=False"
    )
  if 0 in ranks:
    return False
  leading = [spec.shape[0] for spec in specs.values()]
  if None in leading:
    return True
  if len(set(leading)) > 1:
    return False
  node = dataset
  for _ in range(MAX_PIPELINE_DEPTH):
    name = type(node).__name__.lower()
    if "unbatch" in name:
      return False
    if "batch" in name:
      return True
    inner = inner_batches(node)
    if inner is not None:  # flat_map, interleave, group_by_window: its function makes the elements
      return bool(inner)
    node = getattr(
      node, "_input_dataset", None
    )  # tf.data keeps no public handle on a dataset's input
    if node is None:
      return False
  return False


def check_rows_read_once(dataset: Any) -> None:
  """Refuses a pipeline that never ends, repeats its rows or drops some (``drop_remainder=True``).

  A repeat other than ``.repeat(1)`` anywhere in the pipeline is refused, whatever its cardinality:
  ``ds.repeat(2)`` of 1,797 rows counted every row twice (``num_examples`` 3,594), and a
  ``ds.repeat().take(n)`` counts the rows it wraps around to twice (issue 65). A fixed number of steps
  per host is ``pad_batches(..., num_batches=...)``.
  """
  import tensorflow as tf

  cardinality = int(dataset.cardinality())
  if cardinality == tf.data.INFINITE_CARDINALITY:
    raise ValueError(
      "the tf.data.Dataset is infinite (its cardinality is tf.data.INFINITE_CARDINALITY, e.g. after "
      ".repeat()), so the evaluation would never end; evaluate a pipeline that ends: without .repeat(), "
      "or bounded by .take(n)"
    )
  for node in pipeline(dataset):
    name = type(node).__name__
    if "Repeat" in name and hasattr(node, "_count"):
      count = int(node._count)
      if count != 1:
        times = "forever (.repeat())" if count < 0 else f"{count} times (.repeat({count}))"
        bounded = " and a take bounds it" if count < 0 else ""
        raise ValueError(
          f"the tf.data.Dataset repeats its rows {times}{bounded}, so rows would not count exactly "
          "once (num_examples and every metric would count the repeated rows again); evaluate the "
          "pipeline without .repeat() (or with .repeat(1)); for the same number of steps on every "
          "host pass pe.pad_batches(..., num_batches=...)"
        )
    if any(drop_remainder for _, drop_remainder in inner_batches(node) or ()):
      raise ValueError(
        f"the tf.data.Dataset batches with drop_remainder=True inside the function of its "
        f"{name.strip('_')} (bucket_by_sequence_length, group_by_window, flat_map or interleave), "
        "which drops the rows of each group's short last batch; batch there with "
        "drop_remainder=False (pad_batches pads the short batches and masks their padding)"
      )
    if "batch" in name.lower() and bool(getattr(node, "_drop_remainder", False)):
      lost = rows_dropped(node)
      if lost:
        raise ValueError(
          f"the tf.data.Dataset is batched with drop_remainder=True, which drops the last rows{lost}; "
          "batch with drop_remainder=False (pad_batches pads the short last batch and masks its padding)"
        )


def check_fixed_order(dataset: Any, index_key: str) -> None:
  """Refuses a pipeline whose rows come in another order on every pass, where row ids are used.

  Row ids are positions in the pipeline's output (``pad_batches(..., index_key=...)``): with
  ``shuffle(reshuffle_each_iteration=True)`` (tf.data's default) id 7 names another row in the next
  pass, and a ``shuffle`` without a seed (none given, no ``tf.random.set_seed``) in the next process, so
  `compare` of a model with itself gave an interval around a nonzero difference while the id checksums
  agreed (issue 65). Nothing is read.
  """
  for node in pipeline(dataset):
    if "Shuffle" not in type(node).__name__ or not hasattr(node, "_reshuffle_each_iteration"):
      continue
    seeds = [getattr(node, attr, None) for attr in ("_seed", "_seed2")]
    unseeded = all(seed is not None and int(seed) == 0 for seed in seeds)
    if bool(node._reshuffle_each_iteration):
      why = "shuffles with reshuffle_each_iteration=True (tf.data's default), so every pass"
    elif unseeded:
      why = "shuffles without a seed, so every process"
    else:
      continue
    raise ValueError(
      f"pad_batches(..., index_key={index_key!r}): the tf.data.Dataset {why} reads its rows in "
      "another order, and a row id would name another row in the next run (compare(), resumed "
      "checkpoints and outputs joined by id would mix rows); shuffle in one fixed order: "
      ".shuffle(n, seed=0, reshuffle_each_iteration=False), or shuffle once before evaluating "
      "(or not at all)"
    )


def rows_dropped(batch_node: Any) -> str:
  """How many rows a ``drop_remainder=True`` batch drops, in words ("" when its input fills every batch)."""
  size = getattr(batch_node, "_batch_size", None)
  parent = getattr(batch_node, "_input_dataset", None)
  if size is None:  # a rebatch: its input's rows are not counted here
    return " (the rows of the short last batch)"
  size = int(size)
  rows = -2 if parent is None else int(parent.cardinality())
  if (
    rows == -1
  ):  # tf.data.INFINITE_CARDINALITY: every batch is full (a later take bounds the pipeline)
    return ""
  if rows < 0:
    return f" (up to {size - 1} rows of batches of {size}; the input's row count is unknown)"
  if rows % size == 0:
    return ""
  return f": {rows % size} of {rows} rows in batches of {size} would never be evaluated"


def inner_batches(node: Any) -> list[tuple[str, bool]] | None:
  """The batch ops in the functions of a dataset that builds its elements from datasets of its own
  (``flat_map``, ``interleave``, ``group_by_window``, ``bucket_by_sequence_length``): ``(op type,
  drop_remainder)`` each (True where it is not a constant); None for a dataset without such a
  function. A function's own nested functions are not searched."""
  import tensorflow as tf

  graphs = [
    value.function.graph
    for value in vars(node).values()
    if hasattr(getattr(value, "function", None), "graph")
  ]
  found, makes_datasets = [], False
  for graph in graphs:
    for op in graph.get_operations():
      if not op.type.endswith("Dataset") and "DatasetV" not in op.type:
        continue
      makes_datasets = True
      arguments = [arg.name for arg in op.op_def.input_arg]
      if "Batch" in op.type and "drop_remainder" in arguments:  # always the last input
        drop = tf.get_static_value(op.inputs[-1])
        found.append((op.type, True if drop is None else bool(drop)))
  return found if makes_datasets else None


def pipeline(dataset: Any) -> Iterator[Any]:
  """The dataset and the datasets it reads from (tf.data keeps no public handle on a dataset's inputs)."""
  pending, seen = [dataset], set()
  while pending and len(seen) < MAX_PIPELINE_DEPTH:
    node = pending.pop()
    if id(node) in seen:
      continue
    seen.add(id(node))
    yield node
    try:
      pending.extend(node._inputs())
    except (
      AttributeError,
      RuntimeError,
      TypeError,
    ):  # RuntimeError: datasets that hide their inputs
      continue
