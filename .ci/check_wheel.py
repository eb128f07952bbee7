"""Checks the built wheel and sdist: the wheel holds the package only, the sdist the sources.

Usage: python .ci/check_wheel.py DIST_DIR   (prints the wheel's size and file list)
"""

import pathlib
import sys
import tarfile
import zipfile

dist = pathlib.Path(sys.argv[1])
[wheel] = dist.glob("padded_eval-*.whl")
[sdist] = dist.glob("padded_eval-*.tar.gz")
names = zipfile.ZipFile(wheel).namelist()
info = [n for n in names if n.split("/")[0].endswith(".dist-info")]
package = [n for n in names if n not in info]
stray = [n for n in package if not n.startswith("padded_eval/")]
assert not stray, f"the wheel holds files outside padded_eval/: {stray}"
assert "padded_eval/py.typed" in package, "py.typed is missing from the wheel"
assert not [n for n in package if "__pycache__" in n or n.endswith(".pyc")], "compiled files"
assert any(n.endswith(".dist-info/licenses/LICENSE") for n in info), info
members = tarfile.open(sdist).getnames()
wanted_files = (
  "LICENSE",
  "README.md",
  "CHANGELOG.md",
  "pyproject.toml",
  "setup.cfg",
  "padded_eval/py.typed",
)
for wanted in wanted_files:
  assert any(m.endswith("/" + wanted) for m in members), f"the sdist lacks {wanted}"
print(f"wheel {wheel.name}: {wheel.stat().st_size / 1024:.0f} KiB, {len(names)} files")
for name in names:
  print("  " + name)
print(f"sdist {sdist.name}: {sdist.stat().st_size / 1024:.0f} KiB, {len(members)} members")
