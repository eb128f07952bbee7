"""Shared by tests/eval/test_checkpoint.py and its subprocesses: data, step function, batches, and a worker to kill.

Run as ``python _resume_worker.py MODE BACKEND DIR``: evaluates with ``checkpoint_dir=DIR, checkpoint_every=2``
over a slow generator and is SIGKILLed by the test mid-way. MODE ``run``: killed between checkpoints; MODE
``write``: from step 6 on, each checkpoint write stops just before its atomic rename (after writing its data), so
the kill lands in the middle of a checkpoint write.
"""

import os
import sys
import time

import numpy as np

import padded_eval as pe
from padded_eval.metrics.base import Metric, state

ROWS, BATCH, CLASSES = 1500, 64, 4  # 24 batches, the last one short
EVERY = 2


class AccuracyAndMean(Metric):
  """Accuracy of argmax logits, and the mean of a float32 score (its sums depend on the order of merges)."""

  accuracy: pe.metrics.Accuracy = state(lambda self: pe.metrics.Accuracy())
  score: pe.metrics.Mean = state(lambda self: pe.metrics.Mean())

  def _batch_state(self, *, logits, labels, values, mask=None):
    return {
      "accuracy": self.accuracy.batch_updates(preds=logits, target=labels, mask=mask),
      "score": self.score.batch_updates(values=values, mask=mask),
    }

  def compute(self):
    return {"accuracy": self.accuracy.compute(), "score": self.score.compute()}

  def compute_logs(self):
    return self.compute()


def make_data(rows=ROWS, seed=0):
  rng = np.random.default_rng(seed)
  return {
    "x": rng.normal(size=(rows, 3)).astype(np.float32),
    "label": rng.integers(0, CLASSES, rows).astype(np.int32),
  }


def make_params(seed=1):
  return {"w": np.random.default_rng(seed).normal(size=(3, CLASSES)).astype(np.float32)}


def step_fn(params, batch):
  logits = batch["x"] @ params["w"]
  score = logits.max(axis=-1) * 1.37
  return AccuracyAndMean().batch_updates(
    logits=logits, labels=batch["label"], values=score, mask=batch["mask"]
  )


def references(data, params):
  """float64 numpy: (accuracy, mean score) over all rows."""
  logits = data["x"].astype(np.float64) @ params["w"].astype(np.float64)
  accuracy = np.mean(np.argmax(logits, axis=-1) == data["label"])
  return accuracy, np.mean(logits.max(axis=-1) * 1.37)


def batches(data, *, corrupt_before=0, fail_at=None, delay_s=0.0, num_devices=8):
  """A generator of padded batches (padded rows: NaN features, out-of-range labels).

  Args:
    corrupt_before: batches before this index get other data (proves a resume does not re-evaluate them).
    fail_at: raise RuntimeError("preempted") when asked for this batch (a preemption).
    delay_s: sleep before each batch (a slow loader, so a kill lands mid-run).
  """
  padded = pe.pad_batches(
    data, BATCH, num_devices=num_devices, pad_value={"x": np.nan, "label": 99}
  )
  for index, batch in enumerate(padded):
    if index == fail_at:
      raise RuntimeError("preempted")
    time.sleep(delay_s)
    if index < corrupt_before:
      batch = dict(batch, x=batch["x"] * -3.0 + 1.0, label=(batch["label"] + 1) % CLASSES)
    yield batch


def _stop_before_rename(directory):
  """Makes every checkpoint write from step 6 on stop before its rename, after marking ``directory``."""
  replace = os.replace

  def stopping_replace(source, target, *args, **kwargs):
    name = os.path.basename(os.fspath(target))
    if name.startswith("step_") and int(name[5:15]) >= 6:
      open(os.path.join(directory, "writing"), "w").close()
      time.sleep(600)
    return replace(source, target, *args, **kwargs)

  os.replace = stopping_replace


def main(mode, backend, directory):
  if mode == "write":
    _stop_before_rename(directory)
  results = pe.masked_eval(
    step_fn,
    make_params(),
    batches(make_data(), delay_s=0.15),
    backend=backend,
    checkpoint_dir=directory,
    checkpoint_every=EVERY,
  )
  print(results, flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:])
