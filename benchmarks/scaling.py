"""Scaling: time per example as the dataset grows, and the host cost of padding a batch.

``pe.masked_eval`` compiles once and then runs one step per batch, so its time per example should
stay flat from 10**3 to 10**6 rows; the bare pmap loop is timed beside it, in the same run, and
masked_eval runs on each backend (pmap, shard_map, jit). Every size is timed warm (the compiled
step is reused from the warm-up at the smallest size).
"""

from __future__ import annotations

import padded_eval as pe
from benchmarks import anchors, speed
from benchmarks.common import interleaved, markdown_table, shard_rows, split_rows, time_call

BATCH = 1000
SIZES = speed.Sizes(features=32, hidden=64, classes=10)
BACKENDS = ("pmap", "shard_map", "jit")


def _sizes(quick: bool) -> list[int]:
  return [10**3, 10**4, 10**5] if quick else [10**3, 10**4, 10**5, 10**6]


def _rounds(n: int) -> int:
  return 21 if n <= 10**3 else 7 if n <= 10**4 else 5 if n <= 10**5 else 3


def _padding_overhead(data: dict, batch: int, repeats: int) -> tuple[float, float]:
  """Seconds per batch to produce padded batches: (aligned full batches, one short final batch)."""
  full = time_call(lambda: list(pe.pad_batches(data, batch)), repeats) / (len(data["y"]) // batch)
  short = {k: v[: batch // 2 + 1] for k, v in data.items()}
  final = time_call(lambda: list(pe.pad_batches(short, batch)), repeats * 20)
  return full, final


def run(quick: bool, log=print) -> tuple[str, dict]:
  """Returns (Markdown, {"per_example": {approach: {N: seconds}}, "padding": ...})."""
  params = speed.mlp_init(5, (SIZES.features, SIZES.hidden, SIZES.classes))
  ns = _sizes(quick)
  names = [f"pe.masked_eval ({backend})" for backend in BACKENDS]
  per_example = {name: {} for name in [*names, "bare pmap loop", "step time"]}
  for n in ns:
    log(f"scaling: N={n}")
    data = speed._data(SIZES, n, seed=n)  # noqa: SLF001 - shared data maker
    sharded = [shard_rows(b) for b in split_rows(data, BATCH)]
    fns = {"bare pmap loop": lambda: speed._bare_loop(params, sharded, True)}  # noqa: SLF001
    for name, backend in zip(names, BACKENDS):
      fns[name] = lambda backend=backend: pe.masked_eval(
        speed._accuracy_step,  # noqa: SLF001
        params,
        pe.pad_batches(data, BATCH),
        backend=backend,
      )
    best = {k: min(v) for k, v in interleaved(fns, rounds=_rounds(n)).items()}
    for name, seconds in best.items():
      per_example[name][n] = seconds / n
    per_example["step time"][n] = best[names[0]] / (n // BATCH)
  data = speed._data(SIZES, 10**5 if not quick else 10**4, seed=1)  # noqa: SLF001
  full_batch, final_batch = _padding_overhead(data, BATCH, repeats=3)
  step = per_example["step time"][ns[-1]]
  bare = per_example["bare pmap loop"]
  rows = [
    [
      f"{n:,}",
      *(f"{per_example[name][n] * 1e6:.2f} us" for name in names),
      f"{bare[n] * 1e6:.2f} us",
    ]
    + [f"{per_example[name][n] / bare[n]:.2f}x" for name in names]
    for n in ns
  ]
  table = markdown_table(
    ["N", *(f"{name}, incl. pad_batches" for name in names), "bare pmap loop"]
    + [f"ratio {backend}" for backend in BACKENDS],
    rows,
  )
  padding = markdown_table(
    ["host padding (pe.pad_batches, batch 1000, 32 features)", "per batch", "share of a step"],
    [
      ["full aligned batch", f"{full_batch * 1e6:.0f} us", f"{full_batch / step:.1%}"],
      [
        "short final batch (501 real rows)",
        f"{final_batch * 1e6:.0f} us",
        f"{final_batch / step:.1%}",
      ],
    ],
  )
  note = (
    f"\nMLP {SIZES.features}-{SIZES.hidden}-{SIZES.classes}, batch {BATCH}; warm timings, "
    "best of interleaved rounds (21 at 10**3 rows, 7 at 10**4, 5 at 10**5, 3 at 10**6; one "
    "warm-up round first). masked_eval's time includes pe.pad_batches; the bare loop gets "
    "batches already sharded on the host. A masked_eval (pmap) step takes "
    f"{step * 1e3:.2f} ms at N={ns[-1]:,}.\n"
  )
  return table + "\n\n" + padding + "\n" + note, {
    "per_example": per_example,
    "padding": (full_batch, final_batch),
  }


def plot(per_example: dict, path: str) -> bool:
  """Time per example against N (log-log), one line per approach, written as a PNG.

  Returns:
    Whether the plot was written (False without matplotlib).
  """
  plt = anchors.matplotlib_pyplot()
  if plt is None:
    return False
  fig, ax = plt.subplots(figsize=(6, 4))
  for name in [*(f"pe.masked_eval ({backend})" for backend in BACKENDS), "bare pmap loop"]:
    ns = sorted(per_example[name])
    ax.plot(ns, [per_example[name][n] * 1e6 for n in ns], marker="o", label=name)
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("examples N")
  ax.set_ylabel("time per example (us)")
  ax.set_title("Eval time per example (8 virtual CPU devices, batch 1000)")
  ax.grid(True, which="both", alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True
