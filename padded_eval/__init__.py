"""padded_eval: exact full-dataset evaluation in JAX.

Public names only, re-exported one per line. Importing this package does not
initialise a JAX backend.
"""

from padded_eval import accumulate as accumulate
from padded_eval import metrics as metrics
from padded_eval.metrics.base import Metric as Metric
