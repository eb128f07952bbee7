"""The evaluation: `masked_eval`'s loop (`_evaluate`), the backends (`backends/`, one module
each), the compiled-step cache (`cache`), per-row outputs, checkpoints and `EvalResults`."""

from padded_eval.eval import checkpoint as checkpoint
from padded_eval.eval import results as results
from padded_eval.eval._evaluate import InvalidValuesWarning as InvalidValuesWarning
from padded_eval.eval._evaluate import masked_eval as masked_eval
from padded_eval.eval.backends import place_params as place_params
from padded_eval.eval.cache import RecompileWarning as RecompileWarning
from padded_eval.eval.cache import clear_caches as clear_caches
from padded_eval.eval.results import EvalResults as EvalResults
