"""padded_eval: exact full-dataset evaluation metrics in JAX (padded batches, masked statistics, one compilation).

Importing this package does not initialise a JAX backend and does not import TensorFlow.
"""

from padded_eval.data import PaddedBatches as PaddedBatches
from padded_eval.data import pad_batches as pad_batches
from padded_eval.sharding import global_batch as global_batch
from padded_eval.sharding import prefetch_to_device as prefetch_to_device
from padded_eval.sharding import shard as shard
from padded_eval.sharding import unshard as unshard
