"""Moved: the collections now live in :mod:`padded_eval.collections`.

``Metrics``, ``Losses`` and ``LossesAndMetrics`` hold losses as well as metrics, so
they sit above both (see docs/architecture.md, "Modules and layers"). This module only
re-exports them so that ``padded_eval.metrics.collections`` keeps working; new code
uses ``pe.Metrics`` or ``padded_eval.collections``. Nothing in the package imports it
except ``padded_eval/__init__.py`` (which keeps ``pe.metrics.collections`` bound).
"""

from padded_eval.collections import LossAverage as LossAverage
from padded_eval.collections import Losses as Losses
from padded_eval.collections import LossesAndMetrics as LossesAndMetrics
from padded_eval.collections import Metrics as Metrics
from padded_eval.collections import unique_name as unique_name
