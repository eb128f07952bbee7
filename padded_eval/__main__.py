"""Command line of padded_eval: ``python -m padded_eval demo [options]``.

The virtual CPU device count is set here, in ``XLA_FLAGS``, before anything asks
JAX for a backend (importing ``padded_eval`` imports JAX but initialises nothing).
"""

from __future__ import annotations

import argparse
import os
import sys

from padded_eval.demo import digits as demo


def build_parser() -> argparse.ArgumentParser:
  """The ``python -m padded_eval`` argument parser, one sub-command per tool."""
  parser = argparse.ArgumentParser(
    prog="python -m padded_eval",
    description="padded_eval: exact full-dataset evaluation metrics in JAX.",
  )
  commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
  demo_parser = commands.add_parser(
    "demo",
    help="show, on the digits data set, why the usual eval loop is wrong and that "
    "masked_eval matches scikit-learn",
    description=demo.DESCRIPTION,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  demo.add_arguments(demo_parser)
  return parser


def use_virtual_cpu_devices(count: int) -> None:
  """Asks XLA for ``count`` host (CPU) devices; must run before JAX starts a backend.

  Raises:
    ValueError: if ``count`` is not positive.
  """
  if count < 1:
    raise ValueError(f"--devices must be a positive int; got {count}")
  flags = [
    flag
    for flag in os.environ.get("XLA_FLAGS", "").split()
    if not flag.startswith("--xla_force_host_platform_device_count")
  ]
  flags.append(f"--xla_force_host_platform_device_count={count}")
  os.environ["XLA_FLAGS"] = " ".join(flags)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  # TensorFlow only reads the data set here; this silences its oneDNN banner.
  os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def main(argv: list[str] | None = None) -> int:
  """Runs the command named in ``argv``; returns the process exit status."""
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command == "demo":
    try:
      use_virtual_cpu_devices(args.devices)
    except ValueError as error:
      parser.error(str(error))
    return demo.run(args)
  parser.error(f"unknown command {args.command!r}")
  return 2


if __name__ == "__main__":
  sys.exit(main())
