"""bench_overhead and scaling (quick) on two source trees, interleaved, in one run: a before/after table.

Usage: ``python -m benchmarks.compare_trees BEFORE_TREE [AFTER_TREE] [--rounds R]`` (AFTER_TREE defaults
to this checkout). Each round runs ``bench_overhead`` and ``scaling`` (both ``--quick``) once per tree,
in a fresh subprocess with that tree first on ``PYTHONPATH``, alternating which tree goes first, so the
load of other jobs falls on both alike. Reported per cell: the median over rounds of each tree's own
ratio (masked_eval against the bare loop timed in the same process), never a raw time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import json, sys
from benchmarks import bench_overhead, scaling
_, overhead = bench_overhead.run(True, log=lambda *a: None)
_, scaled = scaling.run(True, log=lambda *a: None)
per = scaled["per_example"]
out = {"overhead": {f"{n}/{b}": v for n, by in overhead.items() for b, v in by.items()},
       "scaling": {f"{n}/{name}": per[name][n] / per["bare pmap loop"][n]
                   for name in per if name.startswith("pe.masked_eval") for n in per[name]}}
print("RESULT " + json.dumps(out))
"""


def one_run(tree: str) -> dict:
  env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.pop("XLA_FLAGS", None)
  done = subprocess.run(
    [sys.executable, "-c", _CHILD], cwd=tree, env=env, capture_output=True, text=True, timeout=1800
  )
  if done.returncode:
    raise RuntimeError(done.stderr[-3000:])
  line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
  return json.loads(line[len("RESULT ") :])


def main(argv: list[str]) -> str:
  rounds = int(argv[argv.index("--rounds") + 1]) if "--rounds" in argv else 2
  trees = [a for i, a in enumerate(argv) if not a.startswith("--") and argv[i - 1] != "--rounds"]
  before, after = trees[0], trees[1] if len(trees) > 1 else os.getcwd()
  runs: dict[str, list[dict]] = {"before": [], "after": []}
  for r in range(rounds):
    order = [("before", before), ("after", after)]
    for label, tree in order if r % 2 == 0 else order[::-1]:
      runs[label].append(one_run(tree))
  rows = [
    "| benchmark | case | before | after | after / before |",
    "| --- | --- | --- | --- | --- |",
  ]
  for bench, index, what in (
    ("overhead", 0, "/ bare pmap"),
    ("overhead", 1, "/ bare jit"),
    ("scaling", None, "/ bare pmap"),
  ):
    for case in runs["before"][0][bench]:
      pick = (lambda v: v[index]) if index is not None else (lambda v: v)
      b = statistics.median(pick(run[bench][case]) for run in runs["before"])
      a = statistics.median(pick(run[bench][case]) for run in runs["after"])
      rows.append(f"| {bench} | N={case} {what} | {b:.2f}x | {a:.2f}x | {a / b:.2f} |")
  return (
    "\n".join(rows)
    + f"\n\nMedian of {rounds} interleaved rounds per tree (each round a fresh process).\n"
  )


if __name__ == "__main__":
  print(main(sys.argv[1:]))
