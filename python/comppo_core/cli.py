"""The ``comppo-core`` command line: one subcommand per module in :mod:`comppo_core.commands`.

* ``comppo-core demo``: CompPO end to end on a tiny Llama built from a config (needs
  the ``[hf]`` extra);
* ``comppo-core train``: PPO for one arm on the built-in task or a user's model and data,
  ``metrics.jsonl`` and checkpoints (needs the ``[rl]`` extra);
* ``comppo-core evaluate --model DIR``: the frozen evaluation of a saved model (a run's
  ``warmstart/`` or ``checkpoint/actor``, a TRL output, or a user's model) on each task's
  held-out set: greedy accuracy, and pass@k with ``--samples`` (needs the ``[rl]`` extra);
* ``comppo-core diagnose``: will the gate help? The attention concentration (each
  statistic and layer) and baselines against the Monte-Carlo pivotality of held-out
  responses' tokens, with bootstrap CIs and a gate direction (needs the ``[rl]`` extra);
* ``comppo-core compare``: every arm × seed from paired warm starts, ``results.md`` and
  ``curves.png`` (needs the ``[rl]`` extra);
* ``comppo-core synthetic``: GAE vs Comp-GAE on a synthetic batch and a speed check
  against the NumPy reference (NumPy only);
* ``comppo-core advantages IN.parquet -o OUT.parquet``: advantages and returns for a
  Parquet file of rollouts, streamed row group by row group (needs the ``[arrow]`` extra).

Exit status: 0 on success, 2 on a usage error (argparse), 1 on a ``ComppoError`` or
another user-facing failure, which is printed as ``comppo-core: error: ...``. A usage error
is one line naming the flag, ``comppo-core train: error: --arm: expected ...``, with no
usage block (``--help`` prints the flags); every command checks its flags and paths before
it imports torch, so these answer at once.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from . import __version__, errors
from .commands import advantages, compare, demo, diagnose, evaluate, synthetic, train

__all__ = ["OneLineErrorParser", "main"]

#: The command modules, in the order ``--help`` lists them.
_COMMANDS = (demo, train, evaluate, diagnose, compare, synthetic, advantages)


class OneLineErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line, ``PROG: error: MESSAGE (PROG
    --help lists the flags)``, on stderr with exit status 2, instead of the usage block
    followed by the message."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the flags)\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="comppo-core",
        description="comppo-core: exact, fast GAE and Comp-GAE advantages for PPO-style RL of LLMs.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)
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
    except KeyboardInterrupt:  # Ctrl-C outside a run's own handling (loading, the demo's table)
        print("comppo-core: stopped (Ctrl-C)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
