"""XLA flags for the processes the multi-host tests start (they choose their own device count).

They get the suite's compile settings (conftest.py: XLA's fusion emitters off, and with test
workers on every core one code generation part per program), less its 8 virtual devices. Two or
three such processes share the machine with the other test worker: ``tests/multihost`` in two test
workers took 163 s with these settings and 189 s without them (``test_multihost.py`` alone, in one
process: 94-96 s against 107-119 s).
"""

import os

DEVICE_COUNT = "--xla_force_host_platform_device_count"


def worker_xla_flags() -> str:
  """This process's ``XLA_FLAGS`` without the virtual device count."""
  flags = os.environ.get("XLA_FLAGS", "").split()
  return " ".join(flag for flag in flags if not flag.startswith(DEVICE_COUNT))
