"""Test setup: the one ``backend`` fixture (every registered backend) and the hypothesis profiles
of the property suite (``tests/metrics/**/test_properties_*.py``). The 8 virtual CPU devices and
``JAX_NUMPY_RANK_PROMOTION=raise`` for subprocesses are set in the repository's conftest.py.

Profiles: ``ci`` (loaded by default) runs few examples per property, derandomized so
every CI run draws the same examples, without shrinking (a failure is reported as drawn);
``fuzz`` runs many random examples and shrinks failures: ``HYPOTHESIS_PROFILE=fuzz pytest
tests/metrics/**/test_properties_*.py``.
"""

import os
import pathlib

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


FAST_TIER = pathlib.Path(__file__).with_name("fast_tier.txt")
"""The fast tier (``-m "not slow"``): of each test function, the one parametrization this file names
(its cheapest, if that took at most 0.6 s in a timed whole run and at most 6 s in timed runs of the
tier itself, where it compiles alone what its siblings compiled for it in the whole run), or none
(``-``); written from those runs by ``scripts/fast_tier.py``. The other parametrizations are marked
slow, like the demo, benchmark, scale and multi-process tests; CI runs them all. A function the file
does not know yet runs whole."""


def _fast_tier() -> dict[str, str]:
  lines = FAST_TIER.read_text().splitlines() if FAST_TIER.exists() else []
  return dict(line.split(" ", 1) for line in lines if line and not line.startswith("#"))


def pytest_collection_modifyitems(items):
  """Multi-process tests are slow; so are the parametrizations outside the fast tier."""
  chosen = _fast_tier()
  for item in items:
    if item.get_closest_marker("multihost") is not None:
      item.add_marker(pytest.mark.slow)
    function = item.nodeid.split("[", 1)[0]
    if function in chosen and chosen[function] != item.nodeid:
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
