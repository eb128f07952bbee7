"""Every benchmark runs end to end in its quick mode (no timing assertions).

`python -m benchmarks --quick` (the full run's tables), and each benchmark of `benchmarks.BENCHMARKS`
that it does not include (`python -m benchmarks quick NAME...`, several in one process). Each runs in a subprocess (a
benchmark sets its own XLA flags); the full run with clu, metrax and matplotlib hidden, as in CI
where only the test extra is installed: their cells must say "not installed".
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks import BENCHMARKS, IN_FULL_RUN

pytestmark = pytest.mark.slow  # demo / example / benchmark: run by CI, not by the fast tier

REPO = pathlib.Path(__file__).resolve().parents[1]


def _run_benchmark(*args: str, **env_vars: str) -> subprocess.CompletedProcess:
  """``python -m <args>`` from the repository root, with its own XLA flags; asserts it succeeded."""
  env = dict(
    os.environ, **env_vars, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")
  )
  env.pop("XLA_FLAGS", None)
  done = subprocess.run(
    [sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
  )
  assert done.returncode == 0, done.stderr[-3000:]
  return done


@pytest.mark.slow
def test_quick_benchmark_writes_both_tables_without_optional_anchors(tmp_path):
  _run_benchmark(
    "benchmarks", "--quick", "--out", str(tmp_path), PADDED_EVAL_BENCH_HIDE="clu,metrax,matplotlib"
  )
  results = (tmp_path / "RESULTS.md").read_text()
  for heading in (
    "## Machine",
    "## Exactness",
    "## Speed",
    "### Whole-dataset evaluation",
    "### Per-step metric update cost",
    "### Traces",
    "## Scaling",
  ):
    assert heading in results
  header = (
    "| case | float64 reference | naive pmean loop | flax nnx metrics | clu.metrics | "
    "metrax | padded_eval |"
  )
  assert header in results
  exact_rows = [
    line
    for line in results.splitlines()
    if line.startswith("| ")
    and "float64 reference" not in line
    and line.count("|") == header.count("|")
  ]
  assert len(exact_rows) >= 7
  cells = [row.split(" | ") for row in exact_rows[:7]]
  assert all(c[4] == "not installed" and c[5] == "not installed" for c in cells)
  assert all(not c[6].startswith(("fails", "not")) for c in cells)  # padded_eval has every case
  assert "plot skipped" in results and not (tmp_path / "scaling.png").exists()
  assert "pe.masked_eval, backend='shard_map'" in results
  assert not (REPO / "benchmarks" / "RESULTS.md").exists() or (
    (REPO / "benchmarks" / "RESULTS.md").read_text() != results
  )


@pytest.mark.slow
def test_converted_flax_examples_benchmark_prints_its_table():
  # cold times in this one process (each fresh process imports TensorFlow and JAX again, about 7 s
  # here); the fresh-process child that the default runs is the next test's
  done = _run_benchmark(
    "benchmarks.bench_from_flax",
    "--only",
    "mnist_nnx",
    "ogbg",
    "--repeats",
    "1",
    "--cold",
    "in-process",
  )
  rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
  assert rows[0].startswith("| example | cold: original s")
  by_name = {row.split(" | ")[0][2:]: row.split(" | ") for row in rows[1:]}
  assert set(by_name) == {"mnist_nnx", "ogbg"}
  for cells in by_name.values():  # name, 6 timings and ratios, all devices, ratio of medians
    assert len(cells) == 9
    assert float(cells[3].split()[0]) > 0 and float(cells[6].split()[0]) > 0
    assert float(cells[8].strip(" |")) > 0
  assert by_name["ogbg"][7] == "same"  # its converted loop passes its own mesh
  assert float(by_name["mnist_nnx"][7]) > 0


@pytest.mark.slow
def test_a_fresh_process_times_one_first_call():
  """What the default (``--cold fresh``) starts per loop and cold repeat: one first call, in seconds."""
  done = _run_benchmark("benchmarks.bench_from_flax", "--cold-child", "mnist_nnx", "converted")
  assert json.loads(done.stdout.splitlines()[-1])["seconds"] > 0


# The registered benchmarks that no other test runs (`from_flax`, `accelerator` and `flax_sst2` have
# tests of their own; the full run's members, the first), in groups that run in one process each
# (`python -m benchmarks quick NAME...`): one start of Python and JAX per group. A group's first
# benchmark sets the devices for all, so each group holds ones that set the same: 8 virtual CPU
# devices, or JAX's default. A benchmark in no group runs in a process of its own.
_OWN_TESTS = IN_FULL_RUN + ("from_flax", "accelerator", "flax_sst2")
_GROUPS = (
  ("eval", "text", "multihost"),
  ("sources", "ogb", "bootstrap", "families", "peers", "lm"),
)
_TO_RUN = [name for name in BENCHMARKS if name not in _OWN_TESTS]
_GROUPED = [tuple(n for n in group if n in _TO_RUN) for group in _GROUPS]
_GROUPED += [(name,) for name in _TO_RUN if not any(name in group for group in _GROUPED)]


@pytest.mark.slow
@pytest.mark.parametrize("names", [g for g in _GROUPED if g], ids="-".join)
def test_registered_benchmarks_run_in_their_quick_modes(names):
  """Each benchmark of the group ran in its quick mode and printed its figures."""
  done = _run_benchmark("benchmarks", "quick", *names)
  for name in names:
    start, end = f"<<< {name}\n", f">>> {name}\n"
    assert start in done.stdout and end in done.stdout, (name, done.stdout[-3000:])
    printed = done.stdout.split(start, 1)[1].split(end, 1)[0]
    assert printed.strip(), f"{name} printed nothing"


@pytest.mark.slow
def test_accelerator_benchmark_prints_every_loop_of_every_model(tmp_path):
  out = tmp_path / "accelerator.json"
  _run_benchmark("benchmarks", "accelerator", "--quick", "--repeats", "1", "--json", str(out))
  rows = json.loads(out.read_text())["rows"]
  assert {row["model"] for row in rows} == {"mlp", "cnn", "transformer", "logits"}
  for model in ("mlp", "cnn", "transformer", "logits"):
    loops = [row for row in rows if row["model"] == model]
    # hand (numpy, tf.data), naive, pad_shard_unpad, masked_eval 2 backends x 3 sources
    assert len(loops) == 10
    assert all(row["warm_s"] > 0 and row["first_s"] > 0 for row in loops)
    tf_loops = [row for row in loops if "tf.data" in row["loop"]]
    assert len(tf_loops) == 3 and all(row["warm_ratio_own"] > 0 for row in tf_loops)
    exact = [row for row in loops if row["loop"].startswith("masked_eval")]
    assert all(row["loss_error"] < 1e-5 and row["accuracy_error"] < 1e-5 for row in exact)


def test_accelerator_probe_times_every_placement_path(tmp_path):
  out = tmp_path / "probe.json"
  _run_benchmark(
    "benchmarks", "accelerator", "--quick", "--probe", "--models", "mlp", "--repeats", "1",
    "--json", str(out),
  )  # fmt: skip
  rows = json.loads(out.read_text())["rows"]
  assert {row["loop"] for row in rows} >= {
    "jit(numpy)",
    "device_put(split) ahead",
    "masked_eval jit tf.data",
  }
  assert all(row["warm_s"] > 0 for row in rows)


def test_flax_sst2_benchmark_without_a_flax_checkout_says_so(tmp_path):
  """It needs google/flax's real files (minutes of CPU with them: run by hand, figures in RESULTS.md)."""
  done = _run_benchmark("benchmarks", "flax_sst2", "--flax", str(tmp_path / "no-flax"))
  assert "no Flax checkout at" in done.stdout
