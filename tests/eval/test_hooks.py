"""masked_eval(progress=True): the tqdm bar's counts, total and start, read from its captured output
(issue 28): integer example counts, a total for a tf.data pipeline of known length, a resumed run
starting where it stopped, and one bar (process 0's) for a multi-host run."""

import re
import sys

import jax
import numpy as np
import pytest
import tensorflow as tf

import padded_eval as pe


def mean_step(params, batch):
  del params
  return pe.metrics.Mean().batch_updates(values=batch["x"], mask=batch["mask"])


def bar_lines(err):
  """The bar's states as tqdm wrote them (carriage returns separate redraws)."""
  return [line for line in re.split(r"[\r\n]", err) if line.startswith("masked_eval")]


def values(n, seed=0):
  return np.random.default_rng(seed).normal(size=n).astype(np.float32)


def test_example_counts_are_integers(capsys):
  n = 20_011  # tqdm writes a number 20011 as 2e+4
  x = values(n)
  batches = pe.pad_batches({"x": x}, 4096, pad_value=np.nan)
  result = pe.masked_eval(mean_step, None, batches, backend="jit", progress=True)
  np.testing.assert_allclose(result["mean"], x.astype(np.float64).mean(), rtol=1e-6)
  last = bar_lines(capsys.readouterr().err)[-1]
  assert f"examples={n}" in last, last
  assert "e+" not in last, last
  assert "5/5" in last, last


def test_a_tf_data_pipeline_of_known_length_has_a_total(capsys):
  n = 37  # batches of 10 from tf.data, 16 rows per padded batch: 3 steps
  x = values(n)
  dataset = tf.data.Dataset.from_tensor_slices({"x": x}).batch(10)
  batches = pe.pad_batches(dataset, 16, pad_value=np.nan)
  with pytest.raises(TypeError):  # no exact length: the batches' rows are not static
    len(batches)
  result = pe.masked_eval(mean_step, None, batches, backend="jit", progress=True)
  np.testing.assert_allclose(result["mean"], x.astype(np.float64).mean(), rtol=1e-6)
  lines = bar_lines(capsys.readouterr().err)
  assert lines[0].startswith("masked_eval:   0%") and "0/3" in lines[0], lines
  assert "3/3" in lines[-1] and f"examples={n}" in lines[-1], lines


class Preempted:
  """Padded batches of known length whose iteration raises at batch `fail_at` (a preemption)."""

  def __init__(self, batches, fail_at=None):
    self.batches, self.fail_at = batches, fail_at

  def __len__(self):
    return len(self.batches)

  def __iter__(self):
    for index, batch in enumerate(self.batches):
      if index == self.fail_at:
        raise RuntimeError("preempted")
      yield batch


def test_a_resumed_run_starts_at_its_resumed_position(capsys, tmp_path):
  n, size = 100, 8  # 13 steps
  x = values(n)
  batches = list(pe.pad_batches({"x": x}, size, pad_value=np.nan))
  common = dict(backend="jit", checkpoint_dir=tmp_path, checkpoint_every=3, progress=True)
  with pytest.raises(RuntimeError, match="preempted"):
    pe.masked_eval(mean_step, None, Preempted(batches, fail_at=8), **common)
  capsys.readouterr()
  saved = [name for name in (tmp_path / "process_0").iterdir() if name.suffix == ".state"]
  (consumed,) = [int(name.name[5:15]) for name in saved]
  assert 3 <= consumed <= 8
  result = pe.masked_eval(mean_step, None, Preempted(batches), **common)
  np.testing.assert_allclose(result["mean"], x.astype(np.float64).mean(), rtol=1e-6)
  lines = bar_lines(capsys.readouterr().err)
  assert f" {consumed}/13" in lines[0], lines  # not 0/13: the resumed steps are done
  assert "13/13" in lines[-1], lines
  assert f"examples={n - consumed * size}" in lines[-1], lines  # the rows this call read


def test_only_process_0_draws_the_bar(capsys, monkeypatch):
  x = values(30)
  batches = pe.pad_batches({"x": x}, 16, pad_value=np.nan)
  pe.masked_eval(mean_step, None, batches, backend="jit", progress=True)
  assert bar_lines(capsys.readouterr().err)  # process 0 draws it
  monkeypatch.setattr(jax, "process_index", lambda *backend: 1)
  result = pe.masked_eval(mean_step, None, batches, backend="jit", progress=True)
  np.testing.assert_allclose(result["mean"], x.astype(np.float64).mean(), rtol=1e-6)
  assert not bar_lines(capsys.readouterr().err)  # another process draws nothing


@pytest.mark.parametrize("progress", ["false", 1, "auto"])
def test_progress_must_be_a_bool_or_none(progress):
  # progress="false" drew a bar (bool("false") is True), as outputs= refuses anything but a bool
  batches = pe.pad_batches({"x": values(5)}, 4, num_devices=1)
  with pytest.raises(
    ValueError, match=rf"progress must be True, False or None \(automatic\); got {progress!r}"
  ):
    pe.masked_eval(mean_step, None, batches, backend="jit", progress=progress)


class Terminal:
  """A stderr that says it is a terminal, keeping what is written (tqdm writes to sys.stderr)."""

  def __init__(self, tty=True):
    self.text, self.tty = [], tty

  def write(self, text):
    self.text.append(text)

  def flush(self):
    pass

  def isatty(self):
    return self.tty


def unending_like(x, batch_size):
  """Batches with neither length nor length hint, as a generator or an itertools.cycle gives
  (stopped here after the data, so the test ends)."""
  for start in range(0, len(x), batch_size):
    chunk = np.full(batch_size, np.nan, np.float32)
    rows = x[start : start + batch_size]
    chunk[: len(rows)] = rows
    yield {"x": chunk, "mask": np.arange(batch_size) < len(rows)}


@pytest.mark.parametrize("tty, progress, drawn", [
  (True, None, True), (False, None, False), (True, False, False),
])  # fmt: skip
def test_batches_without_a_length_show_progress_on_a_terminal(monkeypatch, tty, progress, drawn):
  """Issue 65: an infinite generator or itertools.cycle ran with no output until killed. By default
  (progress=None) a source without a length now draws a bar when stderr is a terminal; not in a
  pipe or a log, nor with progress=False. The result is numpy's either way."""
  x = values(203, seed=65)
  stderr = Terminal(tty)
  monkeypatch.setattr(sys, "stderr", stderr)
  kwargs = {} if progress is None else {"progress": progress}
  result = pe.masked_eval(mean_step, None, unending_like(x, 64), backend="jit", **kwargs)
  np.testing.assert_allclose(result["mean"], x.astype(np.float64).mean(), rtol=1e-6)
  lines = bar_lines("".join(stderr.text))
  if drawn:
    assert "4batch" in lines[-1].replace(" ", "") and "examples=203" in lines[-1], lines
  else:
    assert not lines, lines


def test_batches_of_known_length_stay_quiet_by_default_on_a_terminal(monkeypatch):
  stderr = Terminal(True)
  monkeypatch.setattr(sys, "stderr", stderr)
  pe.masked_eval(mean_step, None, pe.pad_batches({"x": values(20)}, 8), backend="jit")
  assert not bar_lines("".join(stderr.text))
