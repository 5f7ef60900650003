"""The ``headatlas`` command (also ``python -m headatlas``).

Each subcommand is a function ``add_<name>(subparsers)`` that adds its parser and sets
``func`` (called with the parsed arguments, returns the exit status); register it in
:data:`COMMANDS`. The logic lives in the library; this module only parses and prints.

    headatlas store DIR...           describe a store (its shards, in order)
    headatlas store verify DIR...    check manifest, checksums and every value; exit 1 on any fault
"""

from __future__ import annotations

import argparse
import json
import sys


def _store_describe(args) -> int:
    from .core.store import StoreError, describe_store

    try:
        info = describe_store(args.dirs)
    except StoreError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        width = max(len(k) for k in info)
        for key, value in info.items():
            print(f"{key:<{width}}  {', '.join(map(str, value)) if isinstance(value, list) else value}")
    return 0


def _store_verify(args) -> int:
    from .core.store import verify_store

    status = 0
    for d in args.dirs:
        faults = verify_store(d)
        for line in faults:
            print(f"FAULT {line}")
        print(f"{d}: {'ok' if not faults else f'{len(faults)} fault(s)'}", file=sys.stderr)
        status = status or (1 if faults else 0)
    return status


def add_store(subparsers) -> None:
    store = subparsers.add_parser(
        "store",
        help="describe or verify attention stores",
        description="Describe (default) or verify attention stores.",
    )
    sub = store.add_subparsers(dest="store_command", metavar="{describe,verify}")
    describe = sub.add_parser("describe", help="model, corpus, sequences, tokens, bytes, layout version (the default)")
    describe.add_argument(
        "dirs", nargs="+", metavar="DIR", help="store directories: one, or the shards of one corpus in order"
    )
    describe.add_argument("--json", action="store_true", help="print JSON")
    describe.set_defaults(func=_store_describe)
    verify = sub.add_parser(
        "verify", help="check manifest, checksums, token table and every value; exit 1 on any fault"
    )
    verify.add_argument("dirs", nargs="+", metavar="DIR", help="store directories, each checked on its own")
    verify.set_defaults(func=_store_verify)


COMMANDS = [add_store]
_DEFAULT_SUB = {"store": ("describe", {"describe", "verify", "-h", "--help"})}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # ``headatlas store DIR`` means ``headatlas store describe DIR``
    if len(argv) > 1 and argv[0] in _DEFAULT_SUB and argv[1] not in _DEFAULT_SUB[argv[0]][1]:
        argv.insert(1, _DEFAULT_SUB[argv[0]][0])
    parser = argparse.ArgumentParser(
        prog="headatlas", description="Map what every attention head of a transformer does."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        add(subparsers)
    if not argv:
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:  # a command without its subcommand: show its help
        parser.parse_args(argv + ["--help"])  # exits
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
