"""Test setup: the one ``backend`` fixture (every registered backend) and the hypothesis profiles
of the property suite (``tests/metrics/test_properties_*.py``). The 8 virtual CPU devices and
``JAX_NUMPY_RANK_PROMOTION=raise`` for subprocesses are set in the repository's conftest.py.

Profiles: ``ci`` (loaded by default) runs few examples per property, derandomized so
every CI run draws the same examples, without shrinking (a failure is reported as drawn);
``fuzz`` runs many random examples and shrinks failures: ``HYPOTHESIS_PROFILE=fuzz pytest
tests/metrics/test_properties_*.py``.
"""

import os

import pytest
from _backends import BACKENDS
from hypothesis import HealthCheck, Phase, settings

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
  "ci",
  max_examples=6,
  deadline=None,
  derandomize=True,
  database=None,
  phases=[Phase.explicit, Phase.generate],
  suppress_health_check=_SLOW_OK,
  print_blob=True,
)
settings.register_profile(
  "fuzz", max_examples=300, deadline=None, suppress_health_check=_SLOW_OK, print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
  """Each backend of `padded_eval.eval.backends.BACKENDS` in turn (a test's own parametrization
  of ``backend`` overrides it)."""
  return request.param


def pytest_collection_modifyitems(items):
  """Multi-process tests are slow too: ``-m "not slow"`` (the fast tier) leaves them out."""
  for item in items:
    if item.get_closest_marker("multihost") is not None:
      item.add_marker(pytest.mark.slow)


# The tests' helper modules (case tables, references, multi-process workers) are imported by
# the tests that use them, never collected on their own: --doctest-modules would import them
# first and out of order (a table that appends the rows of another would import itself back).
collect_ignore_glob = [
  "_*.py",
  "*/_*.py",
  "metric_cases*.py",
  "metric_checks.py",
  "family_references.py",
]
