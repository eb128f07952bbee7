"""Data: sources, `pad_batches` (fixed-size batches with a bool mask) and user sharding helpers.

`sources/` reads what the user passes (one module per kind, a registry), `padded` re-chunks and
pads it (with the one `BatchSpec` of `_batch_spec`), `sharding` splits batches over devices.
Data never needs metrics (docs/architecture.md, "Modules and layers").
"""

from padded_eval.data import sharding as sharding
from padded_eval.data import sources as sources
from padded_eval.data.padded import PaddedBatches as PaddedBatches
from padded_eval.data.padded import pad_batches as pad_batches
