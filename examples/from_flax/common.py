"""What the Flax example conversions share: offline data, trace counters, float64 references.

Each module of this folder converts the eval loop of one of Flax's examples (google/flax,
``examples/``) to padded_eval. Each has a tiny model, small offline data whose size divides
neither the batch size nor 8, ``original_eval`` (the structure of today's Flax loop, with its
wrong number), ``converted_eval`` (the same pipeline and model, evaluated with padded_eval) and
``reference`` (numpy float64 over every row). ``python -m examples.from_flax.report`` prints them
side by side; ``tests/test_flax_examples.py`` checks them.
"""

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

NUM_ROWS = 1003  # divides neither a batch size (32, 64, 128) nor 8 devices


@dataclasses.dataclass
class TraceCounter:
  """Counts the traces of a function: its Python body runs once per trace under jit/pmap.

  Attributes:
    count: how many times a wrapped function's body ran so far.
  """

  count: int = 0

  def __call__(self, fn: Callable) -> Callable:
    """Wraps ``fn`` so that each call (each trace, under a transformation) counts one."""

    @functools.wraps(fn)
    def counted(*args, **kwargs):
      self.count += 1
      return fn(*args, **kwargs)

    return counted


@dataclasses.dataclass
class EvalRun:
  """One evaluation: what it reported, over how many rows, how many traces and seconds.

  Attributes:
    metrics: ``{name: float}`` as the loop reports it (``num_examples`` not included).
    rows: the number of dataset rows the metrics cover.
    traces: how many times the eval step was traced during the run.
    seconds: wall time of the run, compilation included.
  """

  metrics: dict[str, float]
  rows: int
  traces: int
  seconds: float


def run_counted(counter: TraceCounter, evaluate: Callable[..., tuple[dict, int]], *args, **kw):
  """Runs ``evaluate(*args, **kw) -> (metrics, rows)`` and returns an `EvalRun`.

  Args:
    counter: the `TraceCounter` that wraps the eval step ``evaluate`` uses.
    evaluate: an ``original_eval`` or ``converted_eval``.
    *args: its positional arguments.
    **kw: its keyword arguments.

  Returns:
    An `EvalRun` with the metrics as floats and the traces counted during this call.
  """
  traces_before = counter.count
  start = time.perf_counter()
  metrics, rows = evaluate(*args, **kw)
  seconds = time.perf_counter() - start
  floats = {name: float(value) for name, value in metrics.items()}
  return EvalRun(floats, int(rows), counter.count - traces_before, seconds)


def log_softmax64(logits: Any) -> np.ndarray:
  """float64 log-probabilities over the last axis.

  Args:
    logits: ``[..., C]`` float scores.

  Returns:
    ``[..., C]`` float64 log-probabilities.
  """
  logits = np.asarray(logits, np.float64)
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def token_statistics64(logits: Any, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per-element cross entropy and hits of float64 logits.

  Args:
    logits: ``[..., C]`` float scores.
    targets: ``[...]`` int class ids.

  Returns:
    ``(nll, hit)``: ``[...]`` float64 negative log-likelihoods and bool argmax hits.
  """
  log_probs = log_softmax64(logits)
  nll = -np.take_along_axis(log_probs, targets[..., None].astype(np.int64), -1)[..., 0]
  return nll, log_probs.argmax(-1) == targets


def variable_length_rows(
  rng: np.random.Generator, num_rows: int, shortest: int, longest: int, vocab: int
) -> list[np.ndarray]:
  """Token sequences of random lengths: ids in ``[3, vocab)`` (0 pads, 1 and 2 are free).

  Args:
    rng: the random generator.
    num_rows: how many sequences.
    shortest: the fewest tokens in a sequence.
    longest: the most tokens in a sequence.
    vocab: the vocabulary size.

  Returns:
    ``num_rows`` int32 arrays of lengths in ``[shortest, longest]``.
  """
  lengths = rng.integers(shortest, longest + 1, size=num_rows)
  return [rng.integers(3, vocab, size=int(n)).astype(np.int32) for n in lengths]


def tf_sequences(rows: Sequence[dict[str, np.ndarray]]):
  """A tf.data.Dataset of dict rows whose arrays may have different lengths (like tfds text).

  Args:
    rows: dicts of numpy scalars or 1-D arrays, the same keys and dtypes in every row.

  Returns:
    An unbatched `tf.data.Dataset` reading ``rows`` in order.
  """
  import tensorflow as tf

  signature = {
    key: tf.TensorSpec([None] * np.ndim(value), tf.as_dtype(np.asarray(value).dtype))
    for key, value in rows[0].items()
  }
  return tf.data.Dataset.from_generator(lambda: iter(rows), output_signature=signature)
