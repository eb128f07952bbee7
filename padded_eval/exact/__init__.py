"""Exact arithmetic: error-free float steps (`_floats`) and the exact accumulators (`accumulate`).

The bottom of the data flow: every masked sufficient statistic of `padded_eval.metrics` is an
`ExactCount` or an `ExactSum`, merged and reduced without rounding (docs/architecture.md).
"""

from padded_eval.exact import accumulate as accumulate
from padded_eval.exact.accumulate import ExactCount as ExactCount
from padded_eval.exact.accumulate import ExactSum as ExactSum
