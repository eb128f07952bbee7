"""One process of a multi-host test: runs masked_eval scenarios over jax.distributed on 127.0.0.1.

Usage: ``python tests/multihost/_multihost_worker.py PORT NUM_PROCESSES PROCESS_ID SCENARIO[,SCENARIO...]``.
Each process holds 2 CPU devices and uses gloo collectives. Every scenario prints one JSON line
``{"scenario", "process", "result" | "error", "message", "elapsed"}``; the test computes the float64 / scikit-learn
references itself from `make_data` (the union of all processes' rows) and compares.

Scenarios are named ``KIND:BACKEND:SIZES`` with SIZES like ``600-437`` (rows per process):

* ``known`` -- each process passes a whole-dataset Mapping (len known): agreed step count.
* ``gen`` -- each process passes a generator of ragged chunks (len unknown): run-time has-data flag.
* ``mixed`` -- process 0 a Mapping, the others generators.
* ``mismatch`` -- the last process's feature has another width: ValueError expected everywhere.
* ``fail`` -- the last process's data raises before its first batch: the others raise at once.
* ``absent`` -- the last process skips the call: the others' pre-flight times out.
* ``kill`` -- the last process SIGKILLs itself in its data loop: the others raise (final scenario).
* ``stall`` -- the last process hangs in its data loop: the others time out (final scenario).
* ``tfds`` -- each process reads its ``tfds.split_for_jax_process("train")`` share of the digits dataset.
* ``outputs`` -- ``masked_eval(..., outputs=True)`` with row ids offset by the process's first row: each process
  gets its own rows back, then gathers everyone's with `gather_rows` (the recipe of HOWTO.md).
* ``killresume`` -- ``checkpoint_dir=$MULTIHOST_TMP/resume``, generators; the last process SIGKILLs itself
  mid-run (final scenario).
* ``resume`` -- the same call in a new session: resumes from the step every process saved, skipping what each
  consumed (reports the steps it found saved); ``resumedone`` -- once more: the stored result, and a source
  that raises if read past the first batches (those that show the question).
* ``bench`` -- prints seconds per step with and without the has-data flag (not used by tests).
"""

import json
import os
import signal
import sys
import time
import traceback

import _launch
import numpy as np

NUM_FEATURES, NUM_CLASSES, BATCH = 3, 5, 16
TIMEOUT_S = 60.0  # generous for loaded CI machines; failure scenarios pass their own, short ones


def make_data(total, seed=0):
  """The union dataset; process p holds rows [offset_p, offset_p + size_p)."""
  rng = np.random.default_rng(seed)
  return {
    "x": rng.integers(-4, 5, (total, NUM_FEATURES)).astype(np.float32),
    "label": rng.integers(0, NUM_CLASSES, total).astype(np.int32),
    "y": rng.normal(size=total).astype(np.float32),
  }


def make_params(seed=1):
  """Small-integer weights with class biases k/8: float32 logits are exact and never tied."""
  rng = np.random.default_rng(seed)
  return {
    "w": rng.integers(-3, 4, (NUM_FEATURES, NUM_CLASSES)).astype(np.float32),
    "b": (np.arange(NUM_CLASSES) / 8).astype(np.float32),
    "v": rng.normal(size=(NUM_FEATURES,)).astype(np.float32),
  }


def parse(scenario):
  kind, backend, sizes = scenario.split(":")
  return kind, backend, [int(s) for s in sizes.split("-")]


def local_rows(sizes, process):
  data = make_data(sum(sizes))
  start = sum(sizes[:process])
  return {k: v[start : start + sizes[process]] for k, v in data.items()}


def chunks(rows, seed, hook=None):
  """A generator of ragged chunks (sizes 1..23) of `rows`; `hook(index)` runs before each."""
  rng = np.random.default_rng(seed)
  n, start, index = len(rows["x"]), 0, 0
  while start < n:
    if hook:
      hook(index)
    stop = min(n, start + int(rng.integers(1, 24)))
    yield {k: v[start:stop] for k, v in rows.items()}
    start, index = stop, index + 1


def chunks_covering(num_rows, seed):
  """How many chunks `chunks(rows, seed)` yields before it has yielded ``num_rows`` rows."""
  rng = np.random.default_rng(seed)
  count = rows = 0
  while rows < num_rows:
    rows, count = rows + int(rng.integers(1, 24)), count + 1
  return count


def garbage_pad():
  """Padded rows full of NaN and out-of-range labels: a leak would show."""
  return {"x": np.nan, "label": -7, "y": np.nan}


def step_fn(params, batch):
  """Accuracy, macro F1 (confusion counts), MSE and Std (Chan merge) of a tiny linear model."""
  import jax.numpy as jnp

  import padded_eval as pe

  mask = batch["mask"]
  logits = batch["x"] @ params["w"] + params["b"][None, :]  # explicit: rank promotion raises
  preds = batch["x"] @ params["v"]
  metrics = {
    "accuracy": pe.metrics.Accuracy(),
    "f1": pe.metrics.F1Score(task="multiclass", num_classes=NUM_CLASSES, average="macro"),
    "mse": pe.metrics.MSE(),
    "std": pe.metrics.Std(),
  }
  labels = jnp.where(mask, batch["label"], 0)
  return pe.Metrics(metrics).replace_state(
    children={
      "accuracy": metrics["accuracy"].batch_updates(preds=logits, target=labels, mask=mask),
      "f1": metrics["f1"].batch_updates(preds=logits, target=labels, mask=mask),
      "mse": metrics["mse"].batch_updates(preds=preds, target=batch["y"], mask=mask),
      "std": metrics["std"].batch_updates(values=preds, mask=mask),
    }
  )


def output_step(params, batch):
  """`step_fn` plus per-row outputs: the logits and the row ids. Also counts, over EVERY row
  (no mask), the rows whose id is not -1 exactly when the row is padding: the all-padding
  batches of the multi-host lockstep must carry -1 ids too. The count is one scalar per
  batch (a metric fed only scalars counts no rows, so masked_eval's check that no metric
  counted padded rows does not apply to it; ``per_batch=True`` tells its check of batch-level
  scalars that one value per batch is meant)."""
  import padded_eval as pe

  metrics = step_fn(params, batch)
  misplaced = (batch["index"] == -1) == batch["mask"]
  counter = pe.metrics.Mean("misplaced_ids", per_batch=True).batch_updates(  # one value per batch
    misplaced_ids=misplaced.astype("float32").sum()
  )
  merged = pe.Metrics({**metrics.children, "misplaced_ids": counter})
  return merged.replace_state(children={**metrics.children, "misplaced_ids": counter}), {
    "logits": batch["x"] @ params["w"] + params["b"][None, :],
    "index": batch["index"],
  }


def gather_rows(per_row, ids):
  """Every process's rows, ordered by global id (the HOWTO recipe): pad to the largest share, all-gather,
  drop the padding (id -1) and sort by id."""
  from jax.experimental import multihost_utils

  counts = multihost_utils.process_allgather(np.array([len(ids)]))
  most = int(np.max(counts))

  def pad(leaf, fill):
    return np.concatenate([leaf, np.full((most - len(leaf), *leaf.shape[1:]), fill, leaf.dtype)])

  rows = {k: pad(v, 0) for k, v in per_row.items()}
  everyone = multihost_utils.process_allgather({"rows": rows, "ids": pad(ids, -1)})
  all_ids = np.reshape(everyone["ids"], -1)
  real = all_ids >= 0
  order = np.argsort(all_ids[real], kind="stable")
  flat = {k: np.reshape(v, (-1, *v.shape[2:]))[real][order] for k, v in everyone["rows"].items()}
  return flat, all_ids[real][order]


def run_outputs(backend, sizes, process):
  """Per-row outputs: this process's rows (ids offset by its first row), then everyone's, gathered."""
  import padded_eval as pe

  rows, offset = local_rows(sizes, process), sum(sizes[:process])
  batches = pe.pad_batches(
    rows, BATCH, num_devices=2, pad_value=garbage_pad(), index_key="index", index_offset=offset
  )
  result, per_row = pe.masked_eval(
    output_step, make_params(), batches, backend=backend, timeout=TIMEOUT_S, outputs=True
  )
  gathered, gathered_ids = gather_rows(per_row, per_row["index"])
  return dict(
    result,
    local_logits=per_row["logits"],
    local_shape=list(per_row["logits"].shape),
    local_index=per_row["index"],
    gathered_logits=gathered["logits"],
    gathered_index=gathered_ids,
  )


def digits_features(image, index, label):
  """The model's features from a digits example: 3 pixels, the label mod 5, y = index / 100 (float32)."""
  return image[..., 0, :3], label % NUM_CLASSES, index / 100


def tfds_share(process):
  """This process's share of the digits "train" split (1437 rows: 719 + 718) via tfds.split_for_jax_process.

  Returns the tf.data pipeline of model features and the digits row indices of the share.
  """
  import tensorflow as tf
  import tensorflow_datasets as tfds

  from padded_eval.demo.datasets import load_digits_tfds

  data_dir = os.path.join(
    os.environ["MULTIHOST_TMP"], f"digits{process}"
  )  # one build per process: no race
  dataset = load_digits_tfds(data_dir, tfds.split_for_jax_process("train"))

  def features(example):
    x, label, y = digits_features(example["image"], example["index"], example["label"])
    return {
      "x": tf.cast(x, tf.float32),
      "label": tf.cast(label, tf.int32),
      "y": tf.cast(y, tf.float32),
    }

  return dataset.map(features), [int(e["index"]) for e in dataset.as_numpy_iterator()]


def run_resume(kind, backend, sizes, process, count):
  """The ``killresume`` / ``resume`` / ``resumedone`` scenarios (one checkpoint directory for all)."""
  import padded_eval as pe

  directory = os.path.join(os.environ["MULTIHOST_TMP"], "resume")
  hook = None
  if kind == "killresume" and process == count - 1:

    def hook(index):
      if index == 25:
        os.kill(os.getpid(), signal.SIGKILL)

  if kind == "resumedone":  # the stored result: only the batches the pre-flight reads ahead
    from padded_eval.multihost.distributed import Lockstep

    readable = chunks_covering((1 + Lockstep.LOOKAHEAD) * BATCH, 100 + process)

    def hook(index):
      if index > readable:
        raise AssertionError("a finished evaluation read its source past its first batches")

  mine = os.path.join(directory, f"process_{process}")
  saved = sorted(os.listdir(mine)) if os.path.isdir(mine) else []
  rows = local_rows(sizes, process)
  batches = pe.pad_batches(
    chunks(rows, 100 + process, hook), BATCH, num_devices=2, pad_value=garbage_pad()
  )
  result = pe.masked_eval(
    step_fn,
    make_params(),
    batches,
    backend=backend,
    timeout=5.0 if kind == "killresume" else TIMEOUT_S,
    checkpoint_dir=directory,
    checkpoint_every=3,
  )
  return dict(result, saved=saved)


def run(scenario, process, count):
  import padded_eval as pe

  kind, backend, sizes = parse(scenario)
  if kind == "outputs":
    return run_outputs(backend, sizes, process)
  if kind in ("killresume", "resume", "resumedone"):
    return run_resume(kind, backend, sizes, process, count)
  last = process == count - 1
  rows = local_rows(sizes, process) if kind != "tfds" else None
  timeout = TIMEOUT_S
  hook = None
  if kind == "mismatch" and last:
    rows = dict(rows, x=np.concatenate([rows["x"], rows["x"][:, :1]], axis=1))
  if kind == "absent":
    if last:
      from padded_eval.multihost import distributed

      distributed.next_call_number()  # keep this process's call numbers aligned with the others'
      return {"skipped": True}
    timeout = 2.0
  if kind == "fail" and last:

    def hook(index):
      raise OSError("disk on fire")  # this process's data fails before its first batch

  if kind in ("kill", "stall"):
    timeout = 5.0
    if last:

      def hook(index):
        if index == 6:
          if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
          time.sleep(3600)

  if kind in ("known", "progress") or (kind in ("mixed", "mismatch", "absent") and process == 0):
    source = rows
  else:
    source = chunks(rows, seed=100 + process, hook=hook)
  share = None
  if kind == "tfds":
    source, share = tfds_share(process)
  batches = pe.pad_batches(source, BATCH, num_devices=2, pad_value=garbage_pad())
  progress = kind == "progress"  # a tqdm bar: process 0's stderr only
  result = pe.masked_eval(
    step_fn, make_params(), batches, backend=backend, timeout=timeout, progress=progress
  )
  return result if share is None else dict(result, share=share)


def bench(process, count, steps=300):
  """Seconds per step: known lengths (no flag) vs generators (has-data flag), same data; the first round
  includes compilation."""
  import padded_eval as pe

  rows = local_rows([steps * BATCH] * count, process)
  times = {}
  for _ in range(2):
    for kind in ("known", "flagged"):
      source = rows  # a Mapping: len known, no flag
      if kind == "flagged":  # the same batches from a generator: len unknown, has-data flag
        source = (
          {k: v[i : i + BATCH] for k, v in rows.items()} for i in range(0, steps * BATCH, BATCH)
        )
      batches = pe.pad_batches(source, BATCH, num_devices=2)
      start = time.perf_counter()
      pe.masked_eval(step_fn, make_params(), batches, backend="pmap", timeout=TIMEOUT_S)
      times[kind] = (time.perf_counter() - start) / steps
  return times


def main():
  jax, count, process = _launch.join(
    config=[("jax_enable_preemption_service", False)],  # let SIGTERM stop a stuck worker
    heartbeat_timeout_seconds=30,
    shutdown_timeout_seconds=30,
  )
  scenarios = sys.argv[4].split(",")
  for scenario in scenarios:
    start = time.monotonic()
    line = {"scenario": scenario, "process": process}
    try:
      if scenario == "bench":
        line["result"] = bench(process, count)
      else:
        line["result"] = _jsonable(run(scenario, process, count))
    except Exception as err:  # reported to the test, which checks the type and text
      line.update(error=type(err).__name__, message=str(err), where=traceback.format_exc()[-2000:])
    line["elapsed"] = time.monotonic() - start
    print(json.dumps(line), flush=True)
    if scenario.startswith(("kill", "stall")):  # jax.distributed cannot shut down with a dead peer
      os._exit(0)
  jax.distributed.shutdown()


def _jsonable(result):
  return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in result.items()}


if __name__ == "__main__":
  main()
