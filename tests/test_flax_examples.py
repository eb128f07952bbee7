"""The converted Flax examples (examples/from_flax/) against numpy float64 and against the originals.

Each example's data has 1003 rows (or what its length filter keeps), which divides neither
its batch size nor the 8 devices. The converted loop must match the float64 reference over
every row, with one trace per step function; the original loop shows its silent error (dropped
rows) or, for sst2 whose sums are right, its recompilations.
"""

import functools
import importlib
import pathlib
import sys

import numpy as np
import pytest

ROOT = str(pathlib.Path(__file__).resolve().parents[1])
if ROOT not in sys.path:  # `examples` is a folder of the repository, not of the package
  sys.path.insert(0, ROOT)

from examples.from_flax import common, report  # noqa: E402

pytestmark = pytest.mark.slow  # demo / example / benchmark: run by CI, not by the fast tier

RTOL = 1e-6  # float32 model outputs against float64 numpy; measured errors are below 1e-7
BATCH_SIZES = {"mnist_nnx": 128, "imagenet": 128, "lm1b": 64, "wmt": 64, "gemma": 64}
DROPS_ROWS = tuple(BATCH_SIZES)
STEP_FUNCTIONS = {"wmt": 2}  # its loss and its BLEU: two masked_eval calls, two step functions


@functools.cache
def _example(name):
  module = importlib.import_module(f"examples.from_flax.{name}")
  return module, module.make_inputs()


@functools.cache
def _runs(name):
  module, inputs = _example(name)
  original = common.run_counted(module.ORIGINAL_TRACES, module.original_eval, *inputs)
  converted = common.run_counted(module.CONVERTED_TRACES, module.converted_eval, *inputs)
  return original, converted, module.reference(*inputs)


@pytest.mark.parametrize("name", report.EXAMPLES)
def test_converted_matches_float64_reference_with_one_trace(name):
  _, converted, (reference, rows) = _runs(name)
  assert converted.rows == rows  # every real row, once
  assert set(converted.metrics) == set(reference)
  for key, value in reference.items():
    np.testing.assert_allclose(converted.metrics[key], value, rtol=RTOL, err_msg=key)
  assert converted.traces == STEP_FUNCTIONS.get(name, 1)  # one per step function


@pytest.mark.parametrize("name", DROPS_ROWS)
def test_original_drops_the_last_partial_batch(name):
  original, converted, (reference, rows) = _runs(name)
  batch_size = BATCH_SIZES[name]
  assert rows % batch_size != 0 and rows % 8 != 0
  assert original.rows == rows - rows % batch_size  # e.g. mnist: 107 of 1003 rows dropped
  errors = [abs(original.metrics[k] / v - 1) for k, v in reference.items()]
  assert max(errors) > 100 * RTOL, errors  # the silent error, far beyond float32 noise


# The figures HOWTO.md quotes: (rows the eval covers, rows the original never sees).
HOWTO_FIGURES = {
  "mnist_nnx": (1003, 107),
  "imagenet": (1003, 107),
  "lm1b": (820, 52),
  "wmt": (724, 20),
  "gemma": (795, 27),
}


@pytest.mark.parametrize("name", tuple(HOWTO_FIGURES))
def test_the_figures_howto_quotes(name):
  original, converted, (_, rows) = _runs(name)
  assert (rows, rows - original.rows, converted.rows) == (*HOWTO_FIGURES[name], rows)


def test_sst2_original_is_right_but_compiles_per_longest_length():
  module, (params, examples) = _example("sst2")
  original, converted, (reference, rows) = _runs("sst2")
  assert original.rows == converted.rows == rows == len(examples)
  for key, value in reference.items():  # per-batch sums divided once: no weighting error
    np.testing.assert_allclose(original.metrics[key], value, rtol=RTOL, err_msg=key)
  batches = list(module.original_get_batches(examples, module.BATCH_SIZE).as_numpy_iterator())
  shapes = {b["token_ids"].shape for b in batches}
  assert original.traces == len(shapes) == 6  # one trace per batch shape (HOWTO.md quotes 6)
  assert converted.traces == 1


def test_wmt_traces_each_step_function_once_and_its_original_bleu_is_right():
  module, inputs = _example("wmt")
  original, converted, (reference, rows) = _runs("wmt")
  # the counters add up over this process; only _runs calls the wmt loops before this point
  assert module.CONVERTED_EVAL_TRACES.count == module.CONVERTED_BLEU_TRACES.count == 1
  assert module.ORIGINAL_EVAL_TRACES.count == 1
  # the predict step compiles again for the last batch, padded to 24 rows (3 per device)
  assert rows % module.BATCH_SIZE == 20 and module.ORIGINAL_PREDICT_TRACES.count == 2
  # _runs is cached across tests: another test of this worker may have cleared the compiled steps
  common.run_counted(module.CONVERTED_TRACES, module.converted_eval, *inputs)
  again = common.run_counted(module.CONVERTED_TRACES, module.converted_eval, *inputs)
  assert again.traces == 0 and again.metrics == converted.metrics
  # the original's BLEU covers every pair (its predict pipeline keeps the last batch): right
  np.testing.assert_allclose(original.metrics["bleu"], reference["bleu"], rtol=RTOL)
  assert 20 < reference["bleu"] < 80  # a BLEU that says something


def test_gemma_original_traces_twice():
  # jax.jit of the example's step, batches on the mesh: the second batch traces it again
  # (HOWTO.md says so).
  original, _, _ = _runs("gemma")
  assert original.traces == 2


@pytest.mark.slow  # two more compilations; jit is the converted mnist run above
@pytest.mark.parametrize("backend", ["pmap", "shard_map"])
def test_nnx_module_as_params_on_every_backend(backend):
  module, inputs = _example("mnist_nnx")
  _, jit_run, (reference, rows) = _runs("mnist_nnx")
  run = common.run_counted(module.CONVERTED_TRACES, module.converted_eval, *inputs, backend=backend)
  assert run.rows == rows and run.traces == 1
  for key, value in reference.items():
    np.testing.assert_allclose(run.metrics[key], value, rtol=RTOL, err_msg=key)


def test_conversion_diffs_are_small_and_counted():
  for name in report.EXAMPLES:
    changed = report.conversion_diff(importlib.import_module(f"examples.from_flax.{name}"))
    assert 0 < len(changed) < 60, (name, changed)
