"""Applies the HOWTO's diffs to a checkout of google/flax: ``python scripts/check_flax_diffs.py FLAX_DIR``.

Every ```` ```diff ```` block of docs/howto/*.md that starts with ``diff --git a/examples/`` is an
edit of one of Flax's example files; each one is checked with ``git apply --check`` from
``FLAX_DIR`` (the root of a google/flax checkout, or a folder holding its ``examples/``). With
``--apply`` the blocks are applied, so the converted examples can then be run. The repository
holds no Flax code: this script is how the HOWTO is checked against Flax's real files.
"""

import argparse
import pathlib
import re
import subprocess
import sys

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs" / "howto"
DIFF = re.compile(r"^```diff\n(diff --git a/examples/.*?)^```$", re.DOTALL | re.MULTILINE)


def flax_diffs() -> dict[str, str]:
  """``{"page.md:line": patch}`` for every diff block that edits a Flax example file."""
  blocks = {}
  for page in sorted(DOCS.glob("*.md")):
    text = page.read_text()
    for match in DIFF.finditer(text):
      blocks[f"{page.name}:{text[: match.start()].count(chr(10)) + 1}"] = match.group(1)
  return blocks


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("flax_dir", type=pathlib.Path)
  parser.add_argument("--apply", action="store_true", help="apply the diffs, not only check them")
  args = parser.parse_args(argv)
  failed = 0
  for where, patch in flax_diffs().items():
    files = sorted(set(re.findall(r"^diff --git a/(\S+)", patch, re.MULTILINE)))
    command = ["git", "apply", "-v"] + ([] if args.apply else ["--check"])
    done = subprocess.run(command, input=patch, text=True, capture_output=True, cwd=args.flax_dir)
    failed += done.returncode != 0
    print(f"{where}: {' '.join(files)}: {'ok' if done.returncode == 0 else 'FAILED'}")
    if done.returncode:
      print(done.stderr, file=sys.stderr)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
