"""The ``comppo-core`` command line: one subcommand per module in :mod:`comppo_core.commands`.

* ``comppo-core demo``: CompPO end to end on a tiny Llama built from a config (needs
  the ``[hf]`` extra);
* ``comppo-core train``: PPO for one arm on the built-in task or a user's model and data,
  ``metrics.jsonl`` and checkpoints (needs the ``[rl]`` extra);
* ``comppo-core evaluate --model DIR``: the held-out greedy accuracy of a saved model
  (a run's ``warmstart/`` or ``checkpoint/actor``, or a user's model) on the trainer's
  evaluation set (needs the ``[rl]`` extra);
* ``comppo-core compare``: every arm × seed from paired warm starts, ``results.md`` and
  ``curves.png`` (needs the ``[rl]`` extra);
* ``comppo-core synthetic``: GAE vs Comp-GAE on a synthetic batch and a speed check
  against the NumPy reference (NumPy only);
* ``comppo-core advantages IN.parquet -o OUT.parquet``: advantages and returns for a
  Parquet file of rollouts, streamed row group by row group (needs the ``[arrow]`` extra).

Exit status: 0 on success, 2 on a usage error (argparse), 1 on a ``ComppoError`` or
another user-facing failure, which is printed as ``comppo-core: error: ...``.
"""

from __future__ import annotations

import argparse
import sys

from . import __version__, errors
from .commands import advantages, compare, demo, evaluate, synthetic, train

__all__ = ["main"]

#: The command modules, in the order ``--help`` lists them.
_COMMANDS = (demo, train, evaluate, compare, synthetic, advantages)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="comppo-core",
        description="comppo-core: exact, fast GAE and Comp-GAE advantages for PPO-style RL of LLMs.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``comppo-core`` command; returns the exit status."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        status: int = args.run(args, parser)
        return status
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except errors.ComppoError as exc:
        print(f"comppo-core: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
