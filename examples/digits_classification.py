"""MNIST-style image classification, evaluated exactly with padded_eval (runs offline).

The Flax ``mnist`` example, shrunk to scikit-learn's bundled 8x8 digits so it runs
in seconds without a download: a small Flax NNX MLP is trained on the train split,
then the test split (360 examples, not a multiple of the batch size) is evaluated
with ``pe.masked_eval`` on 8 virtual CPU devices. Accuracy, macro precision /
recall / F1, the confusion matrix and the cross-entropy are checked against
scikit-learn in float64, and the script fails if they disagree.

Run: ``python examples/digits_classification.py [--backend pmap|shard_map|jit]``.
"""

from __future__ import annotations

import argparse
import os

if __name__ == "__main__":  # virtual devices must be set before JAX starts a backend
  os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
import optax
from flax import nnx
from sklearn import datasets as skdatasets
from sklearn import metrics as skm

import padded_eval as pe
from padded_eval.demo.datasets import digits_split_indices

NUM_CLASSES = 10


class MLP(nnx.Module):
  """64 -> 128 -> 10 classifier of flattened 8x8 images."""

  def __init__(self, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(64, 128, rngs=rngs)
    self.out = nnx.Linear(128, NUM_CLASSES, rngs=rngs)

  def __call__(self, images):
    return self.out(nnx.relu(self.hidden(images)))


def load_split(split: str) -> dict[str, np.ndarray]:
  """``{"image": float32 [N, 64] in [0, 1], "label": int32 [N]}`` of the digits split."""
  digits = skdatasets.load_digits()
  rows = digits_split_indices(split)
  return {
    "image": (digits.data[rows] / 16.0).astype(np.float32),
    "label": digits.target[rows].astype(np.int32),
  }


def train(data: dict[str, np.ndarray], steps: int = 200, seed: int = 0):
  """Full-batch Adam on the train split; returns ``(graphdef, params)``."""
  graphdef, params = nnx.split(MLP(nnx.Rngs(seed)))
  optimizer = optax.adam(1e-2)

  @jax.jit
  def train_step(params, opt_state):
    def loss_fn(params):
      logits = nnx.merge(graphdef, params)(data["image"])
      return optax.softmax_cross_entropy_with_integer_labels(logits, data["label"]).mean()

    updates, opt_state = optimizer.update(jax.grad(loss_fn)(params), opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  opt_state = optimizer.init(params)
  for _ in range(steps):
    params, opt_state = train_step(params, opt_state)
  return graphdef, params


def evaluate(graphdef, params, test: dict[str, np.ndarray], batch_size: int, backend: str):
  """The exact eval loop: padded batches, a masked step, ``masked_eval``."""
  per_class = {"task": "multiclass", "num_classes": NUM_CLASSES, "average": "macro"}
  metrics = pe.LossesAndMetrics(
    metrics=pe.Metrics(
      [
        pe.metrics.Accuracy(),
        pe.metrics.Precision(**per_class),
        pe.metrics.Recall(**per_class),
        pe.metrics.F1Score(name="f1", **per_class),
        pe.metrics.ConfusionMatrix(num_classes=NUM_CLASSES),
      ]
    ),
    losses=pe.Losses([pe.losses.Crossentropy()]),
  )

  def eval_step(params, batch):  # batch["mask"] marks the real rows
    logits = nnx.merge(graphdef, params)(batch["image"])
    return metrics.batch_updates(preds=logits, target=batch["label"], mask=batch["mask"])

  return pe.masked_eval(eval_step, params, pe.pad_batches(test, batch_size), backend=backend)


def reference(graphdef, params, test: dict[str, np.ndarray]) -> dict[str, object]:
  """scikit-learn on the whole split, float64."""
  logits = np.asarray(
    jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))(params, test["image"]), np.float64
  )
  labels, predicted = test["label"], logits.argmax(-1)
  classes = list(range(NUM_CLASSES))
  precision, recall, f1, _ = skm.precision_recall_fscore_support(
    labels, predicted, labels=classes, average="macro", zero_division=0
  )
  shifted = logits - logits.max(-1, keepdims=True)
  probabilities = np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True)
  return {
    "accuracy": skm.accuracy_score(labels, predicted),
    "precision": precision,
    "recall": recall,
    "f1": f1,
    "confusionmatrix": skm.confusion_matrix(labels, predicted, labels=classes),
    "crossentropy": skm.log_loss(labels, probabilities, labels=classes),
    "num_examples": len(labels),
  }


def main(argv: list[str] | None = None) -> dict[str, object]:
  """Trains, evaluates, checks against scikit-learn; returns the results."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--backend", default="pmap", choices=["pmap", "shard_map", "jit"])
  parser.add_argument("--batch-size", type=int, default=64)
  parser.add_argument("--train-steps", type=int, default=200)
  args = parser.parse_args(argv)

  graphdef, params = train(load_split("train"), args.train_steps)
  test = load_split("test")
  results = evaluate(graphdef, params, test, args.batch_size, args.backend)
  expected = reference(graphdef, params, test)

  assert results["num_examples"] == expected["num_examples"], results["num_examples"]
  np.testing.assert_array_equal(results["confusionmatrix"], expected["confusionmatrix"])
  for key in ("accuracy", "precision", "recall", "f1"):
    np.testing.assert_allclose(results[key], expected[key], rtol=1e-6, err_msg=key)
  np.testing.assert_allclose(results["crossentropy"], expected["crossentropy"], rtol=1e-5)
  for key in ("accuracy", "precision", "recall", "f1", "crossentropy"):
    print(f"{key:>12}: {results[key]:.6f}   scikit-learn {expected[key]:.6f}")
  print(
    f"{int(results['num_examples'])} of {len(test['label'])} examples counted, "
    f"backend={args.backend}, {jax.local_device_count()} devices: matches scikit-learn"
  )
  return results


if __name__ == "__main__":
  main()
