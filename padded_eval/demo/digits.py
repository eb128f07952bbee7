"""``python -m padded_eval demo``: the usual eval loop, its failures, and the fix, in one table.

On the digits data set bundled with scikit-learn (built offline into a real tfds
data set and cached), a small Flax MLP is trained for a few seconds, then its test
split is evaluated on N virtual CPU devices:

(a) the loop of the Flax issue: per-device metrics, ``pmean``, mean over batches,
    the short last batch dropped (``drop_remainder=True``);
(b) the same loop keeping the last batch: it crashes when the last batch does not
    split over the devices, and recompiles the step for the new shape when it does;
(c) ``pe.masked_eval`` over ``pe.pad_batches``: padded batches, a mask, exact
    statistics; one compilation, every example counted once.

Each row is compared with scikit-learn on the whole split in float64. With
``--plots DIR`` it also draws, from one more ``pe.masked_eval`` result (its ``.metric``
holds the exact states of the whole test split), the confusion matrix, the ROC and PR curves (one per digit) and the reliability diagram
(``pe.plot``), as PNGs in DIR.

Nothing here initialises JAX at import time: ``__main__`` sets the device count
first. The heavy imports (JAX, Flax, TensorFlow) happen inside :func:`run`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
import traceback
from typing import Any

import numpy as np

NUM_CLASSES = 10
METRIC_KEYS = ("accuracy", "precision", "recall", "f1", "crossentropy")
# Cross-entropy is a float32 sum of logs; the class-count metrics must be exact.
BOOTSTRAP_REPLICAS = 1000  # the accuracy's 95% interval (pe.metrics.Bootstrap)
TOLERANCE = {"accuracy": 1e-6, "precision": 1e-6, "recall": 1e-6, "f1": 1e-6, "crossentropy": 1e-5}

DESCRIPTION = """\
Trains a small Flax MLP on scikit-learn's bundled digits (built into a tfds data set
offline, cached in --data-dir), then evaluates the test split on --devices virtual CPU
devices three ways:

  (a) the Flax issue's loop: per-batch metrics, pmean, mean over batches; the short
      last batch is dropped;
  (b) the same loop keeping the last batch: it crashes when the last batch does not
      split over the devices, or recompiles for its new shape;
  (c) pe.masked_eval over pe.pad_batches: one compilation, every example counted once.

It prints one table (accuracy, macro precision / recall / F1, cross-entropy, examples
counted, traces of the eval step) next to scikit-learn on the whole split, and exits
0 when masked_eval matches scikit-learn (1 if not). With --plots DIR it also writes
the confusion matrix, ROC and PR curves and reliability diagram of the model (PNGs;
needs matplotlib, the `plot` extra).
"""

# What the demo imports beyond the package: the modules of the `tf` and `demo` extras.
EXTRA_MODULES = ("tensorflow", "tensorflow_datasets", "flax", "optax", "sklearn")

PLOT_FILES = ("confusion_matrix.png", "roc_curve.png", "pr_curve.png", "reliability_diagram.png")


def add_arguments(parser: argparse.ArgumentParser) -> None:
  """Adds the demo's options to ``parser``."""
  parser.add_argument(
    "--devices",
    type=int,
    default=8,
    help="number of virtual CPU devices (sets XLA_FLAGS before JAX starts; default 8)",
  )
  parser.add_argument(
    "--batch-size",
    type=int,
    default=128,
    help="global eval batch size; must be divisible by --devices. The default 128 does not "
    "divide the 360 test examples, so the naive loop has a short last batch (default 128). "
    "With --devices 7 --batch-size 98 the last batch (66 rows) does not split over the "
    "devices and the naive pmap loop crashes",
  )
  parser.add_argument(
    "--data-dir",
    default=os.path.join(os.path.expanduser("~"), ".cache", "padded_eval", "tfds"),
    help="where the digits tfds data set is built on the first run and read afterwards "
    "(default ~/.cache/padded_eval/tfds)",
  )
  parser.add_argument(
    "--train-steps",
    type=int,
    default=300,
    help="full-batch Adam steps on the train split (default 300, about a second)",
  )
  parser.add_argument(
    "--backends",
    default="pmap,shard_map,jit",
    help="comma-separated masked_eval backends to run, of pmap, shard_map, jit (default all three)",
  )
  parser.add_argument("--seed", type=int, default=0, help="model initialisation seed (default 0)")
  parser.add_argument(
    "--json", action="store_true", help="print the rows as JSON instead of the table"
  )
  parser.add_argument(
    "--plots",
    metavar="DIR",
    default=None,
    help="also write the confusion matrix, ROC and PR curves and reliability diagram of "
    "the model on the test split as PNGs in DIR (needs matplotlib: the `plot` extra)",
  )


# --- data ------------------------------------------------------------------------------


def load_digits_splits(data_dir: str):
  """``(train, test, test_dataset)``: numpy dicts of the splits and the test tf.data.Dataset.

  Features are ``image`` ``[N, 64] float32`` scaled to [0, 1] and ``label`` ``[N] int32``.
  """
  import tensorflow as tf
  import tensorflow_datasets as tfds

  from padded_eval.demo.datasets import load_digits_tfds

  tfds.disable_progress_bar()  # the first run builds the data set; keep the output to the table

  def features(example):
    image = tf.cast(tf.reshape(example["image"], [-1]), tf.float32) / 16.0
    return {"image": image, "label": tf.cast(example["label"], tf.int32)}

  def as_numpy(dataset):
    rows = list(dataset.batch(4096).as_numpy_iterator())
    return {key: np.concatenate([row[key] for row in rows]) for key in rows[0]}

  train = as_numpy(load_digits_tfds(data_dir, "train").map(features))
  test_dataset = load_digits_tfds(data_dir, "test").map(features)
  return train, as_numpy(test_dataset), test_dataset


# --- model -----------------------------------------------------------------------------


def train_model(train: dict[str, np.ndarray], steps: int, seed: int):
  """Trains a 64-128-10 Flax NNX MLP with full-batch Adam; returns ``(apply_fn, params)``.

  ``apply_fn(params, images [B, 64]) -> logits [B, 10]`` is a pure function, so it
  works under ``pmap``, ``shard_map`` and ``jit`` alike.
  """
  import jax
  import optax
  from flax import nnx

  class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
      self.hidden = nnx.Linear(64, 128, rngs=rngs)
      self.out = nnx.Linear(128, NUM_CLASSES, rngs=rngs)

    def __call__(self, images):
      return self.out(nnx.relu(self.hidden(images)))

  graphdef, params = nnx.split(MLP(nnx.Rngs(seed)))

  def apply_fn(params, images):
    return nnx.merge(graphdef, params)(images)

  optimizer = optax.adam(1e-2)

  @jax.jit
  def train_step(params, opt_state, images, labels):
    def loss_fn(params):
      logits = apply_fn(params, images)
      return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    grads = jax.grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  opt_state = optimizer.init(params)
  for _ in range(steps):
    params, opt_state = train_step(params, opt_state, train["image"], train["label"])
  return apply_fn, params


# --- the naive loops of the Flax issue ------------------------------------------------


def naive_batch_metrics(logits, labels, axis_name=None):
  """The Flax issue's ``compute_metrics``: means over this batch, then ``pmean``.

  Precision, recall and F1 are macro averages over the batch's own confusion counts
  (absent classes count 0): exactly what cannot be averaged per batch.
  """
  import jax
  import jax.numpy as jnp
  import optax

  predicted = jax.nn.one_hot(jnp.argmax(logits, -1), NUM_CLASSES)
  true = jax.nn.one_hot(labels, NUM_CLASSES)
  hits, num_predicted, num_true = (predicted * true).sum(0), predicted.sum(0), true.sum(0)
  precision = jnp.where(num_predicted > 0, hits / jnp.maximum(num_predicted, 1), 0.0)
  recall = jnp.where(num_true > 0, hits / jnp.maximum(num_true, 1), 0.0)
  f1 = jnp.where(precision + recall > 0, 2 * precision * recall / (precision + recall), 0.0)
  metrics = {
    "accuracy": jnp.mean(jnp.argmax(logits, -1) == labels),
    "precision": precision.mean(),
    "recall": recall.mean(),
    "f1": f1.mean(),
    "crossentropy": optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(),
  }
  return jax.lax.pmean(metrics, axis_name) if axis_name else metrics


def shard_like_flax(batch: dict[str, np.ndarray], num_devices: int) -> dict[str, np.ndarray]:
  """``flax.training.common_utils.shard``: ``[B, ...] -> [devices, B // devices, ...]``."""
  return {k: v.reshape((num_devices, -1) + v.shape[1:]) for k, v in batch.items()}


def naive_loop(
  apply_fn: Any,
  params: Any,
  test: dict[str, Any],
  batch_size: int,
  *,
  backend: str,
  drop_last: bool,
) -> dict[str, Any]:
  """Runs the Flax issue's eval loop; returns a result row (``error`` set if it crashed)."""
  import jax

  num_devices = jax.local_device_count()
  traces = [0]

  def eval_step(params, batch):
    traces[0] += 1  # runs once per trace (compilation), not per call
    logits = apply_fn(params, batch["image"])
    return naive_batch_metrics(logits, batch["label"], "batch" if backend == "pmap" else None)

  if backend == "pmap":
    step = jax.pmap(eval_step, axis_name="batch", in_axes=(None, 0))
  else:
    step = jax.jit(eval_step)
  size = len(test["label"])
  stop = size - size % batch_size if drop_last else size
  per_batch, counted = [], 0
  row: dict[str, Any] = {"traces": 0, "error": None}
  for start in range(0, stop, batch_size):
    batch = {k: v[start : start + batch_size] for k, v in test.items()}
    try:
      inputs = shard_like_flax(batch, num_devices) if backend == "pmap" else batch
      metrics = step(params, inputs)
    except Exception as error:  # the demo shows the crash instead of dying of it
      row["error"] = (
        f"batch of {len(batch['label'])} rows at example {start}: "
        f"{type(error).__name__}: {str(error).splitlines()[0]}"
      )
      break
    per_batch.append(jax.device_get(metrics))
    counted += len(batch["label"])
  row["traces"] = traces[0]
  if row["error"] is None:
    # flax.training.common_utils.get_metrics + tree_map(mean): every batch weighs the same.
    for key in METRIC_KEYS:
      row[key] = float(np.mean([np.mean(m[key]) for m in per_batch]))
    row["num_examples"] = counted
  return row


# --- masked_eval -----------------------------------------------------------------------


def masked_eval_row(
  apply_fn: Any, params: Any, test_dataset: Any, batch_size: int, backend: str
) -> dict[str, Any]:
  """Evaluates with ``pe.masked_eval`` over ``pe.pad_batches``; returns a result row."""
  import padded_eval as pe
  from padded_eval.metrics import F1Score, Precision, Recall

  counted = {"task": "multiclass", "num_classes": NUM_CLASSES, "average": "macro"}
  metrics = pe.LossesAndMetrics(
    metrics=pe.Metrics(
      [
        pe.metrics.Bootstrap(pe.metrics.Accuracy(), num_replicas=BOOTSTRAP_REPLICAS),
        Precision(**counted),
        Recall(**counted),
        F1Score(name="f1", **counted),
      ]
    ),
    losses=pe.Losses([pe.losses.Crossentropy()]),
  )
  traces = [0]

  def step_fn(params, batch):
    traces[0] += 1
    logits = apply_fn(params, batch["image"])
    return metrics.batch_updates(
      preds=logits, target=batch["label"], mask=batch["mask"], index=batch["index"]
    )

  batches = pe.pad_batches(test_dataset, batch_size, index_key="index")  # ids for the bootstrap
  results = pe.masked_eval(step_fn, params, batches, backend=backend)
  row: dict[str, Any] = {
    key: float(results[key]) for key in METRIC_KEYS + ("accuracy_low", "accuracy_high")
  }
  row.update(num_examples=int(results["num_examples"]), traces=traces[0], error=None)
  return row


# --- the plots -------------------------------------------------------------------------


def plot_results(apply_fn, params, test_dataset, batch_size: int, backend: str):
  """``pe.masked_eval`` of the four plotted metrics over ``pe.pad_batches`` of the test split.

  Returns the result, whose ``.metric`` (the exact, reduced states) ``pe.plot`` draws.
  """
  import padded_eval as pe

  scores = {"task": "multiclass", "num_classes": NUM_CLASSES, "from_logits": True}
  metrics = pe.Metrics(
    {
      "confusion": pe.metrics.ConfusionMatrix(NUM_CLASSES),
      "auroc": pe.metrics.AUROC(**scores),
      "auprc": pe.metrics.AUPRC(**scores),
      "calibration": pe.metrics.CalibrationError(10, **scores),
    }
  )

  def step_fn(params, batch):
    logits = apply_fn(params, batch["image"])
    return metrics.batch_updates(preds=logits, target=batch["label"], mask=batch["mask"])

  return pe.masked_eval(step_fn, params, pe.pad_batches(test_dataset, batch_size), backend=backend)


def write_plots(results, directory: str) -> list[str]:
  """Draws a ``plot_results`` result with ``pe.plot`` on Agg figures; returns the PNG paths."""
  from matplotlib.figure import Figure

  import padded_eval as pe

  draws = (
    pe.plot.confusion_matrix,
    pe.plot.roc_curve,
    pe.plot.pr_curve,
    pe.plot.reliability_diagram,
  )
  os.makedirs(directory, exist_ok=True)
  paths = []
  for name, draw in zip(PLOT_FILES, draws):
    figure = Figure(figsize=(6, 5))
    draw(results, ax=figure.subplots())
    paths.append(os.path.join(directory, name))
    figure.savefig(paths[-1], dpi=100, bbox_inches="tight")
  return paths


# --- the reference and the table -------------------------------------------------------


def sklearn_row(apply_fn, params, test) -> dict[str, Any]:
  """scikit-learn on the whole test split, float64 (logits from one forward pass)."""
  import jax
  from sklearn import metrics as skm

  logits = np.asarray(jax.jit(apply_fn)(params, test["image"]), np.float64)
  labels = test["label"]
  predicted = logits.argmax(-1)
  classes = list(range(NUM_CLASSES))
  precision, recall, f1, _ = skm.precision_recall_fscore_support(
    labels, predicted, labels=classes, average="macro", zero_division=0
  )
  log_probs = logits - logits.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  return {
    "accuracy": skm.accuracy_score(labels, predicted),
    "precision": precision,
    "recall": recall,
    "f1": f1,
    "crossentropy": skm.log_loss(labels, np.exp(log_probs), labels=classes),
    "num_examples": len(labels),
    "traces": None,
    "error": None,
  }


def max_difference(row: dict[str, Any], reference: dict[str, Any]) -> float:
  """The largest absolute metric difference from ``reference`` (inf if the row crashed)."""
  if row.get("error"):
    return math.inf
  return max(abs(row[key] - reference[key]) for key in METRIC_KEYS)


def format_table(rows: list[dict[str, Any]]) -> str:
  """The rows as an aligned text table."""
  header = (
    f"{'':44} {'examples':>8} {'accuracy':>9} {'precision':>9} {'recall':>9} "
    f"{'f1':>9} {'x-entropy':>9} {'traces':>6}  max |diff| vs sklearn"
  )
  lines = [header, "-" * len(header)]
  for row in rows:
    traces = "" if row["traces"] is None else str(row["traces"])
    if row["error"]:
      lines.append(f"{row['label']:44} {'crashed':>8} {'':59} {traces:>6}")
      lines.append(f"{'':6}{row['error'][:150]}")
      continue
    values = " ".join(f"{row[key]:9.6f}" for key in METRIC_KEYS)
    difference = "(reference)" if row["traces"] is None else f"{row['max_difference']:.1e}"
    lines.append(f"{row['label']:44} {row['num_examples']:>8} {values} {traces:>6}  {difference}")
  return "\n".join(lines)


def missing_extras() -> list[str]:
  """The modules of the ``tf`` and ``demo`` extras that cannot be imported (none are imported here)."""
  return [name for name in EXTRA_MODULES if importlib.util.find_spec(name) is None]


def run(args: argparse.Namespace) -> int:
  """Runs the demo with parsed options; returns the exit status (0: masked_eval exact, 2: usage)."""
  missing = missing_extras()
  if missing:
    print(
      f"the demo needs the tf and demo extras ({', '.join(missing)} not installed): "
      "pip install 'padded_eval[tf,demo]'",
      file=sys.stderr,
    )
    return 2
  import jax

  num_devices = jax.local_device_count()
  if args.batch_size < 1 or args.batch_size % num_devices:
    print(
      f"--batch-size {args.batch_size} must be a positive multiple of the {num_devices} "
      f"devices; use {max(num_devices, args.batch_size // num_devices * num_devices)}"
    )
    return 2
  backends = [b.strip() for b in args.backends.split(",") if b.strip()]
  unknown = sorted(set(backends) - {"pmap", "shard_map", "jit"})
  if unknown or not backends:
    print(f"--backends must name pmap, shard_map or jit; got {args.backends!r}")
    return 2

  started = time.perf_counter()
  train, test, test_dataset = load_digits_splits(args.data_dir)
  apply_fn, params = train_model(train, args.train_steps, args.seed)
  reference = dict(sklearn_row(apply_fn, params, test), label="scikit-learn, whole split (float64)")
  rows: list[dict[str, Any]] = [reference]
  naive_runs = [
    ("(a) naive pmap loop, last batch dropped", "pmap", True),
    ("(b) naive pmap loop, last batch kept", "pmap", False),
    ("(b) naive jit loop, last batch kept", "jit", False),
  ]
  for label, backend, drop_last in naive_runs:
    rows.append(
      dict(
        naive_loop(apply_fn, params, test, args.batch_size, backend=backend, drop_last=drop_last),
        label=label,
      )
    )
  exact = True
  for backend in backends:
    row: dict[str, Any]
    try:
      row = masked_eval_row(apply_fn, params, test_dataset, args.batch_size, backend)
    except Exception as error:  # report, then fail the run
      traceback.print_exc()
      row = {"traces": None, "error": f"{type(error).__name__}: {error}"}
    rows.append(dict(row, label=f"(c) pe.masked_eval, backend={backend!r}"))
    exact &= (
      not row["error"]
      and row["num_examples"] == reference["num_examples"]
      and all(abs(row[k] - reference[k]) <= TOLERANCE[k] for k in METRIC_KEYS)
    )
  for row in rows:
    row["max_difference"] = max_difference(row, reference)
  plots = []
  if args.plots:
    try:
      drawn = plot_results(apply_fn, params, test_dataset, args.batch_size, backends[0])
      plots = write_plots(drawn, args.plots)
    except ImportError as error:  # matplotlib, the optional extra, is missing
      print(f"--plots: {error}")
      return 2

  summary = {
    "devices": num_devices,
    "batch_size": args.batch_size,
    "test_examples": len(test["label"]),
    "train_examples": len(train["label"]),
    "masked_eval_matches_sklearn": bool(exact),
    "seconds": round(time.perf_counter() - started, 1),
    "rows": rows,
    "plots": plots,
  }
  if args.json:
    print(json.dumps(summary, indent=1, default=float))
  else:
    print(_report(summary))
  return 0 if exact else 1


def _report(summary: dict[str, Any]) -> str:
  """The table with a line of explanation per row."""
  size, batch, devices = summary["test_examples"], summary["batch_size"], summary["devices"]
  last = size % batch
  rows = {row["label"][:3] + row["label"][4:14]: row for row in summary["rows"]}
  lines = [
    f"digits test split: {size} examples = {size // batch} batches of {batch} + a last batch "
    f"of {last}, on {devices} devices ({batch // devices} rows each); model trained on "
    f"{summary['train_examples']} examples.",
    "",
    format_table(summary["rows"]),
    "",
    "traces: how many times the eval step was traced (compiled).",
  ]
  dropped = rows.get("(a)naive pmap")
  if dropped and not dropped["error"]:
    lines.append(
      f"(a) counts {dropped['num_examples']} of {size} examples, and averages "
      f"precision/recall/F1 over batches of {batch // devices} rows per device: "
      "not the dataset's values."
    )
  kept = rows.get("(b)naive pmap")
  if kept and kept["error"]:
    lines.append(
      f"(b) pmap crashes: the last batch of {last} rows does not split over {devices} devices."
    )
  elif kept:
    lines.append(
      f"(b) pmap recompiles for the last batch of {last} rows (traces "
      f"{kept['traces']}), and weights it like a full batch."
    )
  if last:
    lines.append(f"(b) jit recompiles for the last batch and weights its {last} rows like {batch}.")
  if summary["masked_eval_matches_sklearn"]:
    lines.append(
      "(c) masked_eval pads the last batch and masks the padding: every example "
      "counted once, one trace, equal to scikit-learn."
    )
  else:
    lines.append("MISMATCH: masked_eval does not match scikit-learn; this is a bug.")
  for row in summary["rows"]:
    if row.get("accuracy_low") is not None and not row["error"]:
      lines.append(
        f"(c) accuracy {row['accuracy']:.4f}, 95% bootstrap interval [{row['accuracy_low']:.4f}, "
        f"{row['accuracy_high']:.4f}] ({BOOTSTRAP_REPLICAS} replicas from the same pass; the same "
        "on every backend, batch size and device count)."
      )
      break
  if summary["plots"]:
    lines.append("plots (exact states of the whole split): " + ", ".join(summary["plots"]))
  lines.append(f"({summary['seconds']} s)")
  return "\n".join(lines)
