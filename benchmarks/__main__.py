"""``python -m benchmarks [--quick] [--out DIR]``, or ``python -m benchmarks NAME [ARGS]``.

Without a NAME: exactness, speed and scaling against the anchors. The full run writes
``benchmarks/RESULTS.md`` and ``benchmarks/scaling.png``; ``--quick`` (small sizes, a smoke test)
writes to ``--out`` (default: a temporary directory), never over the committed results. The
anchors (flax, clu, metrax) are optional: missing ones show as "not installed".

``python -m benchmarks quick NAME...`` runs the named ones in their quick modes in one process.

With a NAME from `BENCHMARKS` (``python -m benchmarks list`` prints them with what each
measures): that benchmark alone, with its own arguments, e.g. ``python -m benchmarks accelerator
--json out.json``. Each sets its own devices: the accelerator benchmark takes whatever JAX finds,
the others the CPU devices they need (most, 8 virtual ones).
"""

import os
import runpy
import sys

from benchmarks import BENCHMARKS  # the registry: imports nothing else


def run_named(name: str, args: list[str]) -> None:
  """Runs benchmark ``name`` as ``python -m benchmarks.<module> ARGS`` would, in this process."""
  module = BENCHMARKS[name][0]
  sys.argv = [f"python -m benchmarks {name}", *args]
  runpy.run_module(f"benchmarks.{module}", run_name="__main__", alter_sys=True)


if __name__ == "__main__" and sys.argv[1:2] == ["list"]:
  for name, (module, what, _) in BENCHMARKS.items():
    print(f"{name:12s} benchmarks/{module}.py: {what}")
  sys.exit(0)
if __name__ == "__main__" and sys.argv[1:2] and sys.argv[1] in BENCHMARKS:
  run_named(sys.argv[1], sys.argv[2:])
  sys.exit(0)
if __name__ == "__main__" and sys.argv[1:2] == ["quick"]:
  # `python -m benchmarks quick NAME...`: the named benchmarks in their quick modes, one after the
  # other in this process, each between the lines `<<< NAME` and `>>> NAME` (the tests' smoke run:
  # one start of Python and JAX for several). The first one sets the devices for all: name ones
  # that want the same.
  for name in sys.argv[2:]:
    print(f"<<< {name}", flush=True)
    run_named(name, list(BENCHMARKS[name][2]))
    print(f">>> {name}", flush=True)
  sys.exit(0)

# The full run: 8 virtual CPU devices, set before JAX initialises its backend.
# Steps in flight are bounded everywhere; the longer collective timeout only keeps a heavily
# loaded shared machine from aborting a slow (not stuck) CPU rendezvous after the default 40 s.
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "")
  + " --xla_force_host_platform_device_count=8"
  + " --xla_cpu_collective_timeout_seconds=300"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import datetime  # noqa: E402
import pathlib  # noqa: E402
import platform  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import jax  # noqa: E402

from benchmarks import (  # noqa: E402
  anchors,
  bench_overhead,
  bench_sharded,
  bench_sources,
  exactness,
  per_row_outputs,
  scaling,
  speed,
)

HERE = pathlib.Path(__file__).resolve().parent


def machine_description() -> str:
  """nproc, CPU model, jax and anchor versions, device count, load: as Markdown bullets."""
  model = "unknown"
  try:
    with open("/proc/cpuinfo") as cpuinfo:
      model = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), model
      )
  except OSError:
    pass
  try:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
  except OSError:
    load = "unknown"
  found = ", ".join(f"{k} {v}" for k, v in anchors.versions().items())
  return "\n".join(
    [
      f"- CPUs: `nproc` = {os.cpu_count()}, model: {model}",
      f"- JAX devices: {jax.device_count()} x {jax.devices()[0].platform} "
      "(virtual: `--xla_force_host_platform_device_count=8`)",
      f"- Python {platform.python_version()}; {found}",
      f"- load average (1, 5, 15 min) at the start: {load}",
    ]
  )


def summary(exact_values: dict, speed_values: dict, scaled: dict) -> str:
  """A few measured headline lines, derived from the tables' own numbers."""
  errors = []
  for (_case, column), (cell, reference) in exact_values.items():
    if column == "padded_eval" and not isinstance(cell, str):
      errors.append(abs(float(cell) - reference) / abs(reference))
  ratios = speed_values["seconds"]["ratios"]
  backends = ", ".join(
    f"{k.split('=')[1]} {v[0]:.2f}x"
    for k, v in ratios.items()
    if k.startswith("pe.masked_eval, backend=")
  )
  psu = [v[0] for k, v in ratios.items() if k.startswith("flax pad_shard_unpad")]
  clu = [v[0] for k, v in ratios.items() if k.startswith("clu ")]
  traces = {v for (name, _), v in speed_values["traces"].items() if name.startswith("pe.")}
  trace_text = ", ".join(sorted(map(str, traces)))
  per_example = scaled["per_example"]["pe.masked_eval (pmap)"]
  ns = sorted(per_example)
  lines = [
    f"- padded_eval computed {len(errors)} of {len(exact_values) // 5} exactness cases; largest "
    f"relative error {max(errors):.1e}."
    if errors
    else "- padded_eval: no exactness case ran.",
    f"- masked_eval time / faster bare pmap loop (best times): {backends}"
    + (f"; flax pad_shard_unpad + host metrics {psu[0]:.2f}x" if psu else "")
    + (f"; clu gather_from_model_output {clu[0]:.2f}x" if clu else "")
    + ".",
    f"- masked_eval traces per call for N in {speed.TRACE_ROWS}: {trace_text}.",
    f"- masked_eval time per example: {per_example[ns[0]] * 1e6:.1f} us at N={ns[0]:,}, "
    f"{per_example[ns[-1]] * 1e6:.1f} us at N={ns[-1]:,}.",
  ]
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
  parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test, < 2 min)")
  parser.add_argument(
    "--out",
    type=pathlib.Path,
    default=None,
    help="output directory (default: benchmarks/ for a full run, a temporary "
    "directory for --quick)",
  )
  args = parser.parse_args(argv)
  out = args.out or (pathlib.Path(tempfile.mkdtemp(prefix="pe_bench_")) if args.quick else HERE)
  out.mkdir(parents=True, exist_ok=True)
  warnings.filterwarnings("ignore")

  def log(message):
    print(f"[{time.perf_counter() - start:6.1f}s] {message}", file=sys.stderr, flush=True)

  start = time.perf_counter()
  machine = machine_description()
  exact_md, exact_values = exactness.run(args.quick, log)
  speed_md, speed_values = speed.run(args.quick, log)
  scaling_md, scaled = scaling.run(args.quick, log)
  sources_md, _ = bench_sources.run(args.quick, log)
  outputs_md, outputs_values = per_row_outputs.run(args.quick, log)
  overhead_md, _ = bench_overhead.run(args.quick, log)
  sharded_md, _ = bench_sharded.run(args.quick, log)
  plot_path = out / "scaling.png"
  plotted = scaling.plot(scaled["per_example"], str(plot_path))
  figure = (
    "![time per example](scaling.png)" if plotted else "(plot skipped: matplotlib not installed)"
  )
  elapsed = time.perf_counter() - start
  mode = "quick (smoke test sizes; not for comparison)" if args.quick else "full"
  report = f"""# padded_eval benchmarks against the anchors

Generated by `python -m benchmarks{" --quick" if args.quick else ""}` ({mode}) on
{datetime.date.today().isoformat()} in {elapsed:.0f} s. Every number below was measured in this
one process run; every ratio is against a baseline timed in the same run. No number is estimated.

## Summary (computed from the tables below)

{summary(exact_values, speed_values, scaled)}
{per_row_outputs.summary(outputs_values)}

## Machine

{machine}
- The 2 cores are shared with other engineers' jobs (tests, builds), so timings carry noise of
  several percent; compare ratios within a table, not absolute times across runs.

## Exactness (relative error against a float64 reference on the same float32 inputs)

{exact_md}
## Speed

{speed_md}
## Scaling

{figure}

{scaling_md}
## Sources (host overhead of pad_batches per source kind)

{sources_md}

## Per-example outputs (`masked_eval(..., outputs=True)`)

{outputs_md}
## Fixed cost per call (small N, every backend)

{overhead_md}
## Sharded models (FSDP params, jit)

{sharded_md}"""
  (out / "RESULTS.md").write_text(report)
  log(f"wrote {out / 'RESULTS.md'}" + (f" and {plot_path}" if plotted else ""))
  print(report)
  return 0


if __name__ == "__main__":
  sys.exit(main())
