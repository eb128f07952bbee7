"""Chooses the fast tier's tests from measured durations and writes tests/fast_tier.txt.

Usage: ``python -m pytest --durations=0 --durations-min=0 -p no:cacheprovider > run.log``, then
``python scripts/fast_tier.py run.log [--budget-case 0.6]``; then, optionally, time the tier itself
(``python -m pytest -m "not slow" --durations=0 --durations-min=0 -p no:cacheprovider >
tier.log``) and write the file again with ``--tier-log tier.log``.

The fast tier (``pytest -m "not slow"``, see tests/conftest.py) runs, of each test function (and
each docstring example), its cheapest parametrization, if that one took at most ``--budget-case``
seconds (setup, call and teardown) in the whole run; a function whose every case took longer runs in
CI only. In the whole run a case is often cheap because its siblings compiled the programs it
shares with them; run alone in the tier it compiles them itself (on 2 cores, cases of 0.01 s took
20 s there). ``--tier-log`` gives those times (one log or several: each case's longest counts, so a case left out
by an earlier run of the tier stays out): a function whose chosen case took more than
``--budget-alone`` seconds there is left out too. One line per function: the function, a
space, and the node id chosen or ``-``. A test function the file does not know (added since) is in
the fast tier whole, until the file is written again.
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


def durations(log: str) -> dict[str, float]:
  """``{node id: seconds}`` (setup, call and teardown) of a pytest log with ``--durations=0``."""
  seconds: dict[str, float] = collections.defaultdict(float)
  for line in pathlib.Path(log).read_text().splitlines():
    match = LINE.match(line)
    if match:
      seconds[match.group(3)] += float(match.group(1))
  return seconds


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("log", help="pytest output with --durations=0 --durations-min=0")
  parser.add_argument("--budget-case", type=float, default=0.6, help="seconds (default 0.6)")
  parser.add_argument(
    "--tier-log", nargs="*", default=[], help="the same, of runs of the fast tier alone"
  )
  parser.add_argument("--budget-alone", type=float, default=6.0, help="seconds (default 6)")
  args = parser.parse_args()
  seconds = durations(args.log)
  alone: dict[str, float] = {}  # a case's longest time alone, over the tier's runs
  for log in args.tier_log:
    for nodeid, spent in durations(log).items():
      alone[nodeid] = max(spent, alone.get(nodeid, 0.0))
  cases = collections.defaultdict(list)
  for nodeid, spent in seconds.items():
    cases[function_of(nodeid)].append((spent, nodeid))
  chosen = {}
  for function, timed in sorted(cases.items()):
    spent, nodeid = min(timed)
    cheap = spent <= args.budget_case and alone.get(nodeid, 0.0) <= args.budget_alone
    chosen[function] = nodeid if cheap else "-"
  picked = [nodeid for nodeid in chosen.values() if nodeid != "-"]
  header = (
    f"# the fast tier: {len(picked)} of {len(seconds)} tests ({len(cases)} functions), "
    f"{sum(seconds[nodeid] for nodeid in picked):.0f} s measured in the whole run"
    + (f", {sum(alone.get(n, 0.0) for n in picked):.0f} s alone" if alone else "")
    + "; written by scripts/fast_tier.py\n"
  )
  OUT.write_text(header + "".join(f"{function} {case}\n" for function, case in chosen.items()))
  print(header.strip())


if __name__ == "__main__":
  main()
