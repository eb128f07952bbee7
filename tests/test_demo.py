"""`python -m padded_eval demo`: the naive loop's errors show, masked_eval matches sklearn."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # demo / example / benchmark: run by CI, not by the fast tier

METRICS = ("accuracy", "precision", "recall", "f1", "crossentropy")


def _run_demo(*args, timeout=300):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the demo sets its own devices
  return subprocess.run(
    [sys.executable, "-m", "padded_eval", "demo", *args],
    capture_output=True,
    text=True,
    env=env,
    timeout=timeout,
  )


@pytest.fixture(scope="module")
def demo_json(tmp_path_factory):
  # 7 devices, batch 98: 360 = 3 * 98 + 66 and 66 rows do not split over 7 devices, so the
  # naive loop that keeps the last batch crashes, and the one that drops it loses 66 rows.
  done = _run_demo(
    "--devices",
    "7",
    "--batch-size",
    "98",
    "--train-steps",
    "60",
    "--json",
    "--data-dir",
    str(tmp_path_factory.mktemp("tfds")),
    "--plots",
    str(tmp_path_factory.mktemp("plots")),
  )
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  return json.loads(done.stdout[done.stdout.index("{") :])


def _row(summary, prefix):
  return next(row for row in summary["rows"] if row["label"].startswith(prefix))


def test_masked_eval_rows_match_sklearn(demo_json):
  reference = _row(demo_json, "scikit-learn")
  assert demo_json["devices"] == 7 and reference["num_examples"] == 360
  masked = [row for row in demo_json["rows"] if "masked_eval" in row["label"]]
  assert [row["label"].split("=")[1] for row in masked] == ["'pmap'", "'shard_map'", "'jit'"]
  for row in masked:
    assert row["error"] is None and row["num_examples"] == 360 and row["traces"] == 1
    for key in ("accuracy", "precision", "recall", "f1"):
      assert row[key] == pytest.approx(reference[key], abs=1e-6), (row["label"], key)
    assert row["crossentropy"] == pytest.approx(reference["crossentropy"], rel=1e-5)
  assert demo_json["masked_eval_matches_sklearn"] is True


def test_accuracy_interval_is_the_same_on_every_backend(demo_json):
  """The demo's 95% bootstrap interval: around the exact accuracy, as wide as the binomial
  standard error says (within 30%), and equal on pmap, shard_map and jit."""
  reference = _row(demo_json, "scikit-learn")
  masked = [row for row in demo_json["rows"] if "masked_eval" in row["label"]]
  p, n = reference["accuracy"], reference["num_examples"]
  for row in masked:
    assert row["accuracy_low"] <= row["accuracy"] <= row["accuracy_high"]
    width = row["accuracy_high"] - row["accuracy_low"]
    assert width == pytest.approx(2 * 1.96 * np.sqrt(p * (1 - p) / n), rel=0.3)
    assert row["accuracy_low"] == pytest.approx(masked[0]["accuracy_low"], abs=1e-6)
    assert row["accuracy_high"] == pytest.approx(masked[0]["accuracy_high"], abs=1e-6)


def test_naive_loops_show_the_four_failures(demo_json):
  reference = _row(demo_json, "scikit-learn")
  dropped = _row(demo_json, "(a)")
  assert dropped["num_examples"] == 3 * 98 and dropped["traces"] == 1
  # Per-batch macro precision/recall/F1 are not the dataset's.
  assert abs(dropped["precision"] - reference["precision"]) > 1e-3
  crashed = _row(demo_json, "(b) naive pmap")
  assert crashed["error"] and "66 rows" in crashed["error"] and "reshape" in crashed["error"]
  recompiled = _row(demo_json, "(b) naive jit")
  assert recompiled["traces"] == 2 and recompiled["num_examples"] == 360
  # The short last batch weighs like a full one.
  assert abs(recompiled["f1"] - reference["f1"]) > 1e-4


def test_table_shows_every_row(demo_json):
  from padded_eval import demo

  table = demo.format_table(demo_json["rows"])
  for row in demo_json["rows"]:
    assert row["label"] in table
  assert "crashed" in table and "(reference)" in table


def test_help_and_bad_batch_size():
  done = _run_demo("--help")
  assert done.returncode == 0 and "--batch-size" in done.stdout and "--devices" in done.stdout
  done = _run_demo("--devices", "2", "--batch-size", "3")
  assert done.returncode == 2 and "multiple of the 2 devices" in done.stdout


def test_plots_are_written(demo_json):
  import matplotlib.image

  from padded_eval import demo

  paths = demo_json["plots"]
  assert [os.path.basename(p) for p in paths] == list(demo.PLOT_FILES)
  for path in paths:
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 300
    assert image[..., :3].std() > 0.05  # not a blank picture
