"""Chooses the fast tier's tests from measured durations and writes tests/fast_tier.txt.

Usage: ``python -m pytest --durations=0 --durations-min=0 -p no:cacheprovider > run.log``, then
``python scripts/fast_tier.py run.log [--budget-case 1.0]``.

The fast tier (``pytest -m "not slow"``, see tests/conftest.py) runs, of each test function (and
each docstring example), its cheapest parametrization, if that one took at most ``--budget-case``
seconds (setup, call and teardown); a function whose every case took longer runs in CI only. One
line per function: the function, a space, and the node id chosen or ``-``. A test function the file
does not know (added since) is in the fast tier whole, until the file is written again.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re

LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S.*?)\s*$")  # ids may hold spaces
OUT = pathlib.Path(__file__).resolve().parents[1] / "tests" / "fast_tier.txt"


def function_of(nodeid: str) -> str:
  """The test function of a node id: its parametrization removed."""
  return nodeid.split("[", 1)[0]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("log", help="pytest output with --durations=0 --durations-min=0")
  parser.add_argument("--budget-case", type=float, default=1.0, help="seconds (default 1.0)")
  args = parser.parse_args()
  seconds: dict[str, float] = collections.defaultdict(float)
  for line in pathlib.Path(args.log).read_text().splitlines():
    match = LINE.match(line)
    if match:
      seconds[match.group(3)] += float(match.group(1))
  cases = collections.defaultdict(list)
  for nodeid, spent in seconds.items():
    cases[function_of(nodeid)].append((spent, nodeid))
  chosen = {
    function: min(timed)[1] if min(timed)[0] <= args.budget_case else "-"
    for function, timed in sorted(cases.items())
  }
  picked = [nodeid for nodeid in chosen.values() if nodeid != "-"]
  header = (
    f"# the fast tier: {len(picked)} of {len(seconds)} tests ({len(cases)} functions), "
    f"{sum(seconds[nodeid] for nodeid in picked):.0f} s measured; written by scripts/fast_tier.py\n"
  )
  OUT.write_text(header + "".join(f"{function} {case}\n" for function, case in chosen.items()))
  print(header.strip())


if __name__ == "__main__":
  main()
