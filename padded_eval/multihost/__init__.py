"""Several processes: the pre-flight agreement (`_agreement`), the coordinator exchange
(`_coordination`) and the lockstep of the steps (`distributed`), around any backend."""

from padded_eval.multihost import distributed as distributed
from padded_eval.multihost.distributed import process_slice as process_slice
