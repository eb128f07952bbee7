"""One process of the 2-process Sliced / compare test, over jax.distributed.

Usage: ``python tests/multihost/_sliced_worker.py PORT NUM_PROCESSES PROCESS_ID``. Each process
holds 2 CPU devices (gloo collectives) and its share of the rows of `make_data` (`SHARES`), with
global row ids (``index_offset``). For each backend it evaluates models A and B with a sliced
Bootstrap and prints one JSON line: ``{"backend", "process", "logs", "compare"}``.
"""

import _launch
import numpy as np

SHARES = (71, 46)  # rows per process
NUM_CLASSES, NUM_SLICES, NUM_REPLICAS, BATCH = 3, 4, 32, 16


def make_data(total=sum(SHARES), seed=0):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, NUM_CLASSES, total).astype(np.int32)
  a = rng.normal(size=(total, NUM_CLASSES)).astype(np.float32)
  b = a.copy()
  b[np.arange(total), y] += 0.7  # model B is better
  slices = rng.choice([0, 1, 3], size=total).astype(np.int32)  # slice 2 is empty
  return {"a": a, "b": b, "y": y, "slice": slices}


def make_metric():
  import padded_eval as pe

  boot = pe.metrics.Bootstrap(pe.metrics.Accuracy(), NUM_REPLICAS, seed=9)
  return pe.metrics.Sliced(boot, NUM_SLICES)


def jsonable(tree):
  if isinstance(tree, dict):
    return {k: jsonable(v) for k, v in tree.items()}
  return np.asarray(tree, np.float64).tolist()


def lines(process):
  """Its JSON lines, one per backend, in a process of a joined session."""
  import padded_eval as pe

  offset = sum(SHARES[:process])
  rows = {k: v[offset : offset + SHARES[process]] for k, v in make_data().items()}
  metric = make_metric()

  def step(params, batch):  # one step (one compiled program per backend) for both models
    return metric.batch_updates(
      preds=batch["preds"],
      target=batch["y"],
      slice=batch["slice"],
      mask=batch["mask"],
      index=batch["index"],
    )

  for backend in ("pmap", "jit"):
    results = {}
    for model, pad in (("a", np.nan), ("b", np.inf)):
      batches = pe.pad_batches(
        {"preds": rows[model], "y": rows["y"], "slice": rows["slice"]},
        BATCH,
        num_devices=2,
        pad_value={"preds": pad, "y": -3, "slice": 77},
        index_key="index",
        index_offset=offset,
      )
      results[model] = pe.masked_eval(step, None, batches, backend=backend)
    line = {
      "backend": backend,
      "process": process,
      "logs": jsonable(dict(results["b"])),
      "compare": jsonable(pe.metrics.compare(results["a"].metric, results["b"].metric)),
    }
    yield line


if __name__ == "__main__":
  _launch.serve(lines)
