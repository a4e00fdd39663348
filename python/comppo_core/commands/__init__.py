"""The ``comppo-core`` subcommands, one module each.

Each module defines ``add_parser(subparsers)``, which registers the command and sets
``run`` as its default, and ``run(args, parser) -> int``, which returns the exit status.
Modules import heavy dependencies (torch, transformers, pyarrow) inside ``run`` only, so
``comppo-core --help`` works with NumPy alone.
"""
