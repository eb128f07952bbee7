"""The HOWTO's patches of Flax's example files are well-formed patches, one per example.

They are checked against google/flax's real files with ``scripts/check_flax_diffs.py FLAX_DIR``
(the repository holds no Flax code); here, without those files, ``git apply --stat`` parses
each one (hunk headers and line counts), which a hand-edited diff easily breaks.
"""

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import check_flax_diffs  # noqa: E402

EXAMPLES = ("mnist", "imagenet", "lm1b", "wmt", "sst2", "ogbg_molpcba", "gemma")


def test_every_converted_example_has_a_patch():
  files = " ".join(check_flax_diffs.flax_diffs().values())
  for example in EXAMPLES:
    assert f"diff --git a/examples/{example}/" in files, example


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize("where", sorted(check_flax_diffs.flax_diffs()))
def test_each_patch_parses(where):
  patch = check_flax_diffs.flax_diffs()[where]
  done = subprocess.run(["git", "apply", "--stat"], input=patch, text=True, capture_output=True)
  assert done.returncode == 0, f"{where}: {done.stderr}"
  assert re.search(r"\d+ files? changed", done.stdout), done.stdout
