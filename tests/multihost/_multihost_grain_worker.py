"""One process of the grain multi-host test: masked_eval over this process's share of a grain dataset.

Usage: ``python tests/multihost/_multihost_grain_worker.py PORT NUM_PROCESSES PROCESS_ID SCENARIO[,SCENARIO...]``, scenarios
``KIND:BACKEND:ROWS`` where ROWS is the size of the whole dataset (`_multihost_worker.make_data`) and KIND is

* ``map`` -- ``grain.MapDataset.source(rows)[pe.process_slice(ROWS)].batch(7)`` (len known);
* ``loader`` -- a `grain.DataLoader` over the same slice, with the Batch operation (len unknown);
* ``sharded`` -- a `grain.DataLoader` sharded with ``ShardByJaxProcess``: refused when ROWS leaves a remainder.

Prints one JSON line per scenario, ``{"scenario", "process", "result" | "error", "message"}``; the result holds
the slice of rows this process read (``share``).
"""

import json
import sys

import _launch
import _multihost_worker as worker
import numpy as np


def rows_of(data):
  return [{key: values[i] for key, values in data.items()} for i in range(len(data["y"]))]


def source_for(kind, total):
  import grain

  import padded_eval as pe

  rows = rows_of(worker.make_data(total))
  share = pe.process_slice(total)
  if kind == "map":
    return grain.MapDataset.source(rows)[share].batch(7), share
  sampler_rows = share.stop - share.start if kind == "loader" else total
  options = grain.sharding.ShardByJaxProcess(drop_remainder=False) if kind == "sharded" else None
  loader = grain.DataLoader(
    data_source=grain.MapDataset.source(rows)[share] if kind == "loader" else rows,
    sampler=grain.samplers.IndexSampler(
      sampler_rows, options or grain.sharding.NoSharding(), num_epochs=1
    ),
    operations=[grain.transforms.Batch(5)],
    worker_count=0,
  )
  return loader, share


def run(scenario):
  import padded_eval as pe

  kind, backend, (total,) = worker.parse(scenario)
  source, share = source_for(kind, total)
  batches = pe.pad_batches(source, worker.BATCH, num_devices=2, pad_value=worker.garbage_pad())
  result = pe.masked_eval(
    worker.step_fn, worker.make_params(), batches, backend=backend, timeout=worker.TIMEOUT_S
  )
  result = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in result.items()}
  return dict(result, share=[share.start, share.stop])


def main():
  jax, count, process = _launch.join(heartbeat_timeout_seconds=30)
  for scenario in sys.argv[4].split(","):
    line = {"scenario": scenario, "process": process}
    try:
      line["result"] = run(scenario)
    except Exception as err:  # reported to the test, which checks the type and text
      line.update(error=type(err).__name__, message=str(err))
    print(json.dumps(line), flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
