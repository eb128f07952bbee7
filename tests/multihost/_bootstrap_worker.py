"""One process of the 2-process Bootstrap test: masked_eval of a bootstrapped F1 over jax.distributed.

Usage: ``python tests/multihost/_bootstrap_worker.py PORT NUM_PROCESSES PROCESS_ID``. Each process holds 2 CPU devices (gloo
collectives) and its own share of the rows of `make_data` (`SHARES`), with global row ids
(``index_offset``). Prints one JSON line per backend: ``{"backend", "process", "logs"}``.
"""

import _launch
import numpy as np

SHARES = (83, 58)  # rows per process
NUM_CLASSES, NUM_REPLICAS, BATCH = 3, 16, 16


def make_data(total=sum(SHARES), seed=0):
  rng = np.random.default_rng(seed)
  return {
    "x": rng.normal(size=(total, NUM_CLASSES)).astype(np.float32),
    "y": rng.integers(0, NUM_CLASSES, total).astype(np.int32),
  }


def make_metric():
  import padded_eval as pe

  return pe.metrics.Bootstrap(pe.metrics.F1Score(num_classes=NUM_CLASSES), NUM_REPLICAS, seed=5)


def lines(process):
  """Its JSON lines, one per backend, in a process of a joined session."""
  import padded_eval as pe

  offset = sum(SHARES[:process])
  rows = {k: v[offset : offset + SHARES[process]] for k, v in make_data().items()}
  metric = make_metric()

  def step(params, batch):
    return metric.batch_updates(
      preds=batch["x"], target=batch["y"], mask=batch["mask"], index=batch["index"]
    )

  for backend in ("pmap", "jit"):
    batches = pe.pad_batches(
      rows,
      BATCH,
      num_devices=2,
      pad_value={"x": np.nan, "y": -3},
      index_key="index",
      index_offset=offset,
    )
    logs = pe.masked_eval(step, None, batches, backend=backend)
    logs = {k: np.asarray(v).tolist() for k, v in logs.items()}
    yield {"backend": backend, "process": process, "logs": logs}


if __name__ == "__main__":
  _launch.serve(lines)
