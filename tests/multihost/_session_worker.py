"""One process of the 2-process session of tests/multihost/test_session_multihost.py.

Usage: ``python tests/multihost/_session_worker.py PORT NUM_PROCESSES PROCESS_ID PART[,PART...]``. The
parts (``bootstrap``, ``sliced``, ``lm``: the lines of tests/multihost/_<part>_worker.py) run one
after the other in one jax.distributed session, so one start of the processes serves them all;
each JSON line carries its ``part``.
"""

import importlib
import sys

import _launch


def lines(process):
  for part in sys.argv[4].split(","):
    for line in importlib.import_module(f"_{part}_worker").lines(process):
      yield dict(line, part=part)


if __name__ == "__main__":
  _launch.serve(lines)
