"""Side by side, per converted Flax example: lines changed, numbers, traces and eval time.

Run from the repository root: ``python -m examples.from_flax.report`` (8 virtual CPU devices are set
up unless ``XLA_FLAGS`` says otherwise). Times are wall times on this machine, compilation
included in the first ("cold") call; the ratio is converted over original.
"""

import ast
import difflib
import importlib
import inspect
import os
import re
import textwrap

EXAMPLES = ("mnist_nnx", "imagenet", "lm1b", "wmt", "sst2", "gemma")
GRAPHS = ("ogbg",)  # jraph GraphsTuple inputs; checked by tests/test_flax_ogbg.py
_ROLE = re.compile(r"\b(original|converted)_|\b(ORIGINAL|CONVERTED)_")


def conversion_diff(module) -> list[str]:
  """The unified diff from a module's ``ORIGINAL`` functions to its ``CONVERTED`` ones.

  The ``original_``/``converted_`` prefixes, the docstrings and the trace-counting decorators
  are left out, so the diff holds the edits a user makes.

  Args:
    module: an example module with ``ORIGINAL`` and ``CONVERTED`` tuples of functions.

  Returns:
    The changed lines: those starting with ``+`` or ``-``, headers excluded.
  """

  def source(functions):
    lines = []
    for fn in functions:
      code = inspect.getsource(fn).splitlines()
      docstring = _docstring_lines(code)
      for number, line in enumerate(code):
        counter = line.lstrip().startswith("@") and "TRACES" in line
        if not counter and number not in docstring:
          lines.append(_ROLE.sub("", line))
    return lines

  diff = difflib.unified_diff(source(module.ORIGINAL), source(module.CONVERTED), lineterm="", n=0)
  return [d for d in diff if d[:1] in "+-" and not d.startswith(("+++", "---"))]


def _docstring_lines(code: list[str]) -> range:
  """The 0-based line numbers of a function source's docstring (empty if it has none)."""
  function = ast.parse(textwrap.dedent("\n".join(code))).body[0]
  first = function.body[0]
  if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)):
    return range(0)
  return range(first.lineno - 1, first.end_lineno)


def compare(name: str) -> dict:
  """Runs one example's original and converted eval twice each, and its reference.

  Args:
    name: a module name of `EXAMPLES` or `GRAPHS`.

  Returns:
    ``{"original", "converted"}``: the cold and warm `common.EvalRun` pairs;
    ``"reference"``: ``(metrics, rows)``; ``"diff"``: `conversion_diff`'s lines.
  """
  from examples.from_flax import common

  module = importlib.import_module(f"examples.from_flax.{name}")
  inputs = module.make_inputs()
  runs = {}
  for role in ("original", "converted"):
    counter, evaluate = getattr(module, f"{role.upper()}_TRACES"), getattr(module, f"{role}_eval")
    runs[role] = [common.run_counted(counter, evaluate, *inputs) for _ in range(2)]
  return {**runs, "reference": module.reference(*inputs), "diff": conversion_diff(module)}


def main() -> None:
  """Prints the table of the report."""
  for name in EXAMPLES + GRAPHS:
    result = compare(name)
    (original, original_warm), (converted, converted_warm) = result["original"], result["converted"]
    reference, rows = result["reference"]
    added = sum(line.startswith("+") for line in result["diff"])
    print(f"== {name}: conversion +{added} -{len(result['diff']) - added} lines")
    print(f"  rows: original {original.rows}, converted {converted.rows}, dataset {rows}")
    for key, value in reference.items():
      print(
        f"  {key}: original {original.metrics[key]:.7f}  converted {converted.metrics[key]:.7f}"
        f"  reference {value:.7f}"
      )
    print(f"  traces: original {original.traces}, converted {converted.traces} (first call)")
    print(
      f"  seconds cold: original {original.seconds:.2f}, converted {converted.seconds:.2f}"
      f" (x{converted.seconds / original.seconds:.2f}); warm: {original_warm.seconds:.2f},"
      f" {converted_warm.seconds:.2f} (x{converted_warm.seconds / original_warm.seconds:.2f})"
    )


if __name__ == "__main__":
  os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  main()
