"""A source that raises stops `masked_eval` with that error, and nothing is left running or
holding device memory (issue 64, "Accelerators first").

For every backend, with a packed and a tree state, with per-row outputs and with a checkpoint:
the source raises after ``k`` batches (0: before the first). The very exception object the
source raised reaches the caller (not wrapped); once `masked_eval` has raised, no thread of the
call is left (``threading.enumerate``), and while the caller still holds the exception (its
traceback, as a notebook keeps ``sys.last_traceback``), ``jax.live_arrays()`` is back to what it
was before the call, after ``gc.collect()`` and `pe.clear_caches()` on both sides.
"""

import functools
import gc
import threading

import jax
import numpy as np
import pytest

import padded_eval as pe
from padded_eval.eval import placement


class SourceError(Exception):
  pass


def step(params, batch, scale, outputs):
  logits = batch["x"] * params
  metric = pe.metrics.Mean().batch_updates(values=scale * logits.sum(-1), mask=batch["mask"])
  return (metric, {"logits": logits}) if outputs else metric


def failing(batches, k, error):
  """``batches``, raising ``error`` instead of batch ``k``."""
  for i, batch in enumerate(batches):
    if i == k:
      raise error
    yield batch


def _live():
  gc.collect()
  return len(jax.live_arrays())


_CASES = [
  ("packed", "plain"),
  ("tree", "plain"),
  ("packed", "outputs"),
  ("packed", "checkpoint"),
  ("tree", "checkpoint"),
]


@pytest.mark.parametrize("carried, extra", _CASES)
@pytest.mark.parametrize("k", [0, 3])
def test_a_raising_source_stops_the_run_with_its_error_and_leaves_nothing(
  backend, carried, extra, k, monkeypatch, tmp_path
):
  if carried == "tree":
    monkeypatch.setattr(placement, "SMALL_STATE_BYTES", 0)
  data = {"x": np.random.default_rng(k).normal(size=(203, 3)).astype(np.float32)}
  scale = 1.0 + k + 10 * _CASES.index((carried, extra))  # a new step: compiles afresh
  fresh = functools.partial(step, scale=scale, outputs=extra == "outputs")
  options = dict(backend=backend, outputs=extra == "outputs")
  if extra == "checkpoint":
    options.update(checkpoint_dir=tmp_path / "ckpt", checkpoint_every=1)
  pe.clear_caches()
  threads, live = set(threading.enumerate()), _live()
  error = SourceError(f"source failed after {k} batches")
  with pytest.raises(SourceError) as caught:
    pe.masked_eval(fresh, np.float32(2.0), failing(pe.pad_batches(data, 16), k, error), **options)
  assert caught.value is error  # the source's own exception, not wrapped
  assert set(threading.enumerate()) <= threads, threading.enumerate()
  pe.clear_caches()
  assert _live() == live, [(x.shape, x.dtype) for x in jax.live_arrays()]
