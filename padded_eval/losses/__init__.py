"""Losses: stateless, hashable `Loss` objects whose ``loss(**kw)`` is a scalar masked mean.

`base` holds the protocol and the element-wise losses; `regularizers` the penalties on params.
Losses never import metrics (docs/architecture.md, "Modules and layers").
"""

from padded_eval.losses import regularizers as regularizers
from padded_eval.losses.base import Crossentropy as Crossentropy
from padded_eval.losses.base import ElementwiseLoss as ElementwiseLoss
from padded_eval.losses.base import Loss as Loss
from padded_eval.losses.base import MeanAbsoluteError as MeanAbsoluteError
from padded_eval.losses.base import MeanSquaredError as MeanSquaredError
