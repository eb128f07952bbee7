"""pytest setup shared by the tests and the docstring examples of padded_eval/ (--doctest-modules).

Set before JAX initialises its backend: 8 virtual CPU devices (tests/conftest.py and every test
rely on them), and ``JAX_NUMPY_RANK_PROMOTION=raise`` (an implicit broadcast of arrays of
different ranks is an error, so a shape bug cannot hide behind one) for the subprocesses tests
start: they inherit both through the environment. In the test processes promotion raises too,
except in the tests that run code as users write it (see ``USER_CODE_TESTS``).
"""

import os

# XLA aborts the process when a CPU collective's devices have not all joined its rendezvous
# within 40 s (``xla_cpu_collective_call_terminate_timeout_seconds``). Two test workers on two
# busy cores may starve one device's thread that long (CI lost a worker once, its message not
# kept, in a collective check). 300 s lets a starved rendezvous finish; a real deadlock still
# aborts, and XLA's warning at 20 s names the stuck program.
_COLLECTIVE_TIMEOUT = "--xla_cpu_collective_call_terminate_timeout_seconds=300"
# The suite compiles thousands of small programs: with XLA's fusion emitters off they compile
# faster; files ran 15-30% faster (masked_eval sets no option of its own: it compiles as jax.jit).
# The tests of a promise at XLA's defaults ask for them (tests/_xla_defaults.py). An XLA_FLAGS that
# names the option wins: XLA_FLAGS=--xla_cpu_use_fusion_emitters=true runs the suite on XLA's own.
_EMITTERS = "xla_cpu_use_fusion_emitters"
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "")
  + " --xla_force_host_platform_device_count=8 "
  + _COLLECTIVE_TIMEOUT
  + ("" if _EMITTERS in os.environ.get("XLA_FLAGS", "") else f" --{_EMITTERS}=false")
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")

# pytest imports padded_eval (and so JAX) before this file, to resolve the warning categories of
# setup.cfg's filterwarnings: in this process the variable above comes too late, so it is set
# below; it reaches every subprocess a test starts (multi-host workers, the benchmark and demo
# runs, pytest-xdist's workers) through the environment.

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")

USER_CODE_TESTS = frozenset(
  {"test_docs.py", "test_howto.py", "test_seed_examples.py", "test_flax_examples.py"}
)
"""Test files that run code as users write it, under JAX's default promotion ("allow"): the
docstring and documentation examples, the HOWTO pages, the seed issues' loops and the re-created
Flax examples write ``x @ w + b``, as Flax's own examples do. Every other test, with the library
code it reaches, runs under "raise"."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
  if type(item).__name__ == "DoctestItem" or item.path.name in USER_CODE_TESTS:
    with jax.numpy_rank_promotion("allow"):
      return (yield)
  return (yield)


collect_ignore = ["padded_eval/__main__.py"]  # the CLI: its parser runs on import of __main__


import gc  # noqa: E402


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
grid (tests/metrics/test_base.py, over a thousand cases) alone reached 42,000 maps."""
_tests_run = [0]


@pytest.fixture(autouse=True)
def _release_compiled_programs_now_and_then():
  yield
  _tests_run[0] += 1
  if _tests_run[0] % RELEASE_EVERY == 0:
    import jax

    jax.clear_caches()
    gc.collect()


# A test worker that dies (an XLA abort, a segfault) takes its C-level stderr with it: pytest's
# default fd capture holds it in a temporary file. setup.cfg's addopts capture at the sys level
# instead, each xdist worker sends its fd 2 to a file, and after the run the controller prints
# the files of the workers that went down, so CI's last lines say why a worker crashed.
_WORKER_LOGS = "PADDED_EVAL_TEST_WORKER_LOGS"
_crashed_workers: list[str] = []


# With test workers on every core (pytest-xdist, ``-n auto``), each worker compiles its programs'
# machine code in one part: XLA's parallel code generation only adds threads to cores the other
# workers keep busy. A test file run in two workers side by side took 120 s instead of 135 s. The
# split changes no bit; an XLA_FLAGS that names the option wins.
_SPLIT = "xla_cpu_parallel_codegen_split_count"


def pytest_configure(config):
  worker = os.environ.get("PYTEST_XDIST_WORKER")
  if worker is None:
    if not config.getoption("numprocesses", None):  # -n 0: no workers
      return
    if _SPLIT not in os.environ["XLA_FLAGS"]:
      os.environ["XLA_FLAGS"] += f" --{_SPLIT}=1"  # read by the workers this process starts
    if config.getoption("capture") == "sys":
      import tempfile

      os.environ[_WORKER_LOGS] = tempfile.mkdtemp(prefix="padded-eval-workers-")
    return
  log_dir = os.environ.get(_WORKER_LOGS)
  if log_dir:
    log = os.open(os.path.join(log_dir, f"{worker}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 2)
    os.close(log)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
  if error:
    _crashed_workers.append(node.gateway.id)


def pytest_terminal_summary(terminalreporter):
  log_dir = os.environ.get(_WORKER_LOGS)
  for worker in _crashed_workers if log_dir else ():
    path = os.path.join(log_dir, f"{worker}.log")
    if not os.path.exists(path):
      continue
    with open(path, errors="replace") as f:
      # a faulthandler dump's frames would push the reason (XLA's log line) out of view
      lines = [line for line in f.read().splitlines() if not line.startswith("  File ")]
    terminalreporter.section(f"C-level stderr of the crashed test worker {worker}")
    for line in lines[-40:]:
      terminalreporter.line(line)


def pytest_unconfigure(config):
  log_dir = os.environ.get(_WORKER_LOGS)
  if log_dir and os.environ.get("PYTEST_XDIST_WORKER") is None:
    import shutil

    shutil.rmtree(log_dir, ignore_errors=True)
