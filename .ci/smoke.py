"""Run from outside the source tree with the installed wheel: it imports, knows its version and
evaluates a padded dataset exactly (float64 numpy reference)."""

import importlib.metadata
import pathlib
import sys

import numpy as np

import padded_eval as pe

source_tree = pathlib.Path(sys.argv[1]).resolve()
location = pathlib.Path(pe.__file__).resolve()
assert location.parent != source_tree / "padded_eval", (
  f"imported the source tree, not the wheel: {location}"
)
assert "site-packages" in location.parts, location
assert pe.__version__ == importlib.metadata.version("padded_eval"), pe.__version__
assert (location.parent / "py.typed").is_file()

rng = np.random.default_rng(0)
values = rng.normal(size=37).astype(np.float32)


def step(params, batch):
  del params
  return pe.metrics.Mean("x").batch_updates(x=batch["x"], mask=batch["mask"])


results = pe.masked_eval(step, None, pe.pad_batches({"x": values}, 8), backend="jit")
assert results["num_examples"] == 37, results
np.testing.assert_allclose(results["mean"], np.mean(values.astype(np.float64)), rtol=1e-6)
print(f"smoke: padded_eval {pe.__version__} from {location.parent}: {dict(results)}")
