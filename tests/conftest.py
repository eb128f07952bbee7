"""Test setup: 8 virtual CPU devices (set before JAX initialises its backend) and the
hypothesis profiles of the property suite (``tests/test_properties_*.py``).

Profiles: ``ci`` (loaded by default) runs few examples per property, derandomized so
every CI run draws the same examples, without shrinking (a failure is reported as drawn);
``fuzz`` runs many random examples and shrinks failures: ``HYPOTHESIS_PROFILE=fuzz pytest
tests/test_properties_*.py``.
"""

import os

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from hypothesis import HealthCheck, Phase, settings  # noqa: E402

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
