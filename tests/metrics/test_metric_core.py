"""Every generic Metric check (tests/metric_checks.py) on every case (tests/metric_cases.py).

The checks run under ``jax_numpy_rank_promotion="raise"``: the library broadcasts explicitly, so a
user who turns implicit rank promotion into an error can use every metric.

Add metrics as rows of ``metric_cases.CASES``; add promises as ``check_*`` functions in
``metric_checks.CHECKS``. Both grow this test grid without new test code.
"""

import jax
import pytest
from metric_cases import CASES
from metric_checks import CHECKS


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_metric_protocol(case, check):
  with jax.numpy_rank_promotion("raise"):
    check(case)
