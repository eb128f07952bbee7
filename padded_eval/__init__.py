"""padded_eval: exact full-dataset evaluation in JAX.

Public names only, re-exported one per line. Importing this package does not
initialise a JAX backend. How the modules fit together: docs/architecture.md.
``pe.nnx`` and ``pe.clu`` (padded_eval.ecosystem) import flax / clu, and ``pe.lm`` (padded_eval.lm)
imports lm-eval, so they are imported on first use.
"""

import importlib as _importlib

from padded_eval import collections as collections
from padded_eval import losses as losses
from padded_eval import metrics as metrics
from padded_eval import plot as plot
from padded_eval.collections import Losses as Losses
from padded_eval.collections import LossesAndMetrics as LossesAndMetrics
from padded_eval.collections import Metrics as Metrics
from padded_eval.data.padded import PaddedBatches as PaddedBatches
from padded_eval.data.padded import pad_batches as pad_batches
from padded_eval.data.sharding import data_axes as data_axes
from padded_eval.data.sharding import global_batch as global_batch
from padded_eval.data.sharding import prefetch_to_device as prefetch_to_device
from padded_eval.data.sharding import shard as shard
from padded_eval.data.sharding import unshard as unshard
from padded_eval.eval import results as results
from padded_eval.eval._evaluate import InvalidValuesWarning as InvalidValuesWarning
from padded_eval.eval._evaluate import masked_eval as masked_eval
from padded_eval.eval.backends import place_params as place_params
from padded_eval.eval.cache import RecompileWarning as RecompileWarning
from padded_eval.eval.cache import clear_caches as clear_caches
from padded_eval.eval.results import EvalResults as EvalResults
from padded_eval.eval.results import best as best
from padded_eval.losses import regularizers as regularizers
from padded_eval.metrics.base import Metric as Metric
from padded_eval.multihost.distributed import process_slice as process_slice

# The one place the version is written; pyproject.toml reads it ([tool.setuptools.dynamic]).
__version__ = "0.1.0"


def __getattr__(name: str):
  """``pe.nnx``, ``pe.clu`` and ``pe.lm``: imported when first read, so flax, clu and lm-eval stay optional."""
  if name in ("nnx", "clu", "lm"):
    module = _importlib.import_module(
      "padded_eval.lm" if name == "lm" else f"padded_eval.ecosystem.{name}"
    )
    globals()[name] = module
    return module
  raise AttributeError(f"module 'padded_eval' has no attribute {name!r}")
