"""pytest setup shared by the tests and the docstring examples of padded_eval/ (--doctest-modules).

Set before JAX initialises its backend: 8 virtual CPU devices (tests/conftest.py and every test
rely on them), and ``JAX_NUMPY_RANK_PROMOTION=raise`` (an implicit broadcast of arrays of
different ranks is an error, so a shape bug cannot hide behind one) for the subprocesses tests
start: they inherit both through the environment. This process keeps JAX's default promotion
(see below).
"""

import os

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")

# pytest imports padded_eval (and so JAX) before this file, to resolve the warning categories of
# pyproject's filterwarnings: in this process the variable above comes too late, and JAX keeps
# its default ("allow"); it reaches every subprocess a test starts (multi-host workers, the
# benchmark and demo runs), where promotion raises. Tests that check a code path under "raise"
# in this process say so with ``jax.numpy_rank_promotion("raise")``.

import jax  # noqa: E402

# pytest-xdist's workers are subprocesses of this one: they inherit the variable above, and their
# JAX reads it on import. Pinned here, every test process promotes alike (the metric protocol grid
# checks the library under "raise" itself: tests/metrics/test_metric_core.py).
jax.config.update("jax_numpy_rank_promotion", "allow")

collect_ignore = ["padded_eval/__main__.py"]  # the CLI: its parser runs on import of __main__


import gc  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """After each test module, drop every compiled program JAX and the package keep alive.

  Each live XLA CPU executable holds a few memory mappings; a whole-suite run that kept every
  module's programs (JAX's jit caches, the package's bounded caches, module-level jitted
  functions) grew past the kernel's ``vm.max_map_count`` (65,530) two thirds of the way through,
  and the next compile segfaulted inside LLVM. Released after each module, the count stays at
  what one module needs.
  """
  yield
  import jax

  import padded_eval as pe

  pe.clear_caches()
  jax.clear_caches()
  gc.collect()


RELEASE_EVERY = 250
"""Inside a module, JAX's compiled programs are released every this many tests as well: the protocol
grid (tests/metrics/test_metric_core.py, over a thousand cases) alone reached 42,000 maps."""
_tests_run = [0]


@pytest.fixture(autouse=True)
def _release_compiled_programs_now_and_then():
  yield
  _tests_run[0] += 1
  if _tests_run[0] % RELEASE_EVERY == 0:
    import jax

    jax.clear_caches()
    gc.collect()
