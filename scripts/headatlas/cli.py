"""The ``headatlas`` command (also ``python -m headatlas``).

Each subcommand is a function ``add_<name>(subparsers)`` that adds its parser and sets
``func`` (called with the parsed arguments, returns the exit status); register it in
:data:`COMMANDS`. The logic lives in the library; this module only parses and prints.

    headatlas look MODEL "a sentence"  every head's map for one input (PNG grid), the strongest heads
                                     per pattern and, when results/atlas/MODEL exists, each head's roles
    headatlas atlas MODEL            the atlas summary of a finished run (results/atlas/MODEL/atlas.tsv)
    headatlas store DIR...           describe a store (its shards, in order)
    headatlas store verify DIR...    check stores (manifest, checksums, every value), shard sets and every sealed
                                     file below DIR (results/: the whole run); exit 1 on any fault
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _store_describe(args) -> int:
    from .core.store import StoreError, describe_store, store_dirs

    try:
        info = describe_store([s for d in args.dirs for s in store_dirs(d)])
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
    from .core.integrity import run_faults
    from .core.store import MANIFEST, verify_store

    status = 0
    for d in map(Path, args.dirs):
        d = d.parent if d.name == MANIFEST else d
        if not d.is_dir():
            faults = [f"{d}: missing"]
        else:  # a store, or any directory above stores (a corpus, a model, the whole run: results/)
            faults = verify_store(d) if (d / MANIFEST).is_file() else run_faults(d)
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
        "dirs",
        nargs="+",
        metavar="DIR",
        help="store directories: one, the shards of one corpus in order, or a corpus directory (its shards)",
    )
    describe.add_argument("--json", action="store_true", help="print JSON")
    describe.set_defaults(func=_store_describe)
    verify = sub.add_parser(
        "verify",
        help="check stores (manifest, checksums, every value), shard sets and every sealed file; exit 1 on any fault",
    )
    verify.add_argument(
        "dirs", nargs="+", metavar="DIR", help="stores, corpus directories or a whole run directory (results/)"
    )
    verify.set_defaults(func=_store_verify)


def _atlas_table(results: str, name: str):
    import pandas as pd

    path = Path(results) / "atlas" / name / "atlas.tsv"
    return (pd.read_csv(path, sep="\t"), path) if path.is_file() else (None, path)


def _look(args) -> int:
    from .core.inputs import bos_warning
    from .core.look import PATTERNS, head_roles, load_config, look_spec, maps_figure, pattern_scores, sentence_maps
    from .core.models import ModelError, load

    try:
        cfg = load_config(args.config) if args.config and Path(args.config).is_file() else {}
        spec, cache_dir = look_spec(args.model, cfg, args.max_length, args.bos_token)
        model, tokenizer, config = load(spec, cache_dir, device="cpu")
    except (ModelError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    warning = bos_warning(spec, config.to_dict())
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    maps, tok = sentence_maps(model, tokenizer, config, spec, args.sentence, args.pair)
    out = Path(args.out or f"look_{spec.name}.png")
    title = f"{spec.name}: every head's attention on one input ({maps.shape[0]} layers x {maps.shape[1]} heads)"
    maps_figure(maps, tok.pieces, title, out, out.with_suffix(".svg"))
    scores = pattern_scores(maps, tok.special, tok.pieces)
    print(f"{spec.name}: {maps.shape[0]} layers x {maps.shape[1]} heads, {len(tok)} tokens: {' '.join(tok.pieces)}")
    print(f"maps: {out} (and {out.with_suffix('.svg').name}); heads are named layer-head, 1-based")
    print("strongest heads per pattern (mean over the query rows of this input):")
    from .core.look import strongest_heads

    for pattern, top in strongest_heads(scores, args.top).items():
        heads = ", ".join(f"{label} {value:.2f}" for label, value in top)
        print(f"  {pattern:<6} {heads}    ({PATTERNS[pattern]})")
    atlas, path = _atlas_table(args.results, spec.name)
    if atlas is not None:
        roles = head_roles(atlas)
        print(f"roles from the atlas of a finished run ({path}):")
        for label, text in roles.items():
            if text != "-" or args.all_heads:
                print(f"  {label:<6} {text}")
    else:
        print(f"no atlas for {spec.name} yet ({path}): run the workflow to see each head's roles")
    if args.tsv:
        scores.to_csv(args.tsv, sep="\t", index=False, float_format="%.4f")
    return 0


def add_look(subparsers) -> None:
    look = subparsers.add_parser(
        "look",
        help="every head's attention map for one input, and the strongest heads",
        description="Draw every head's attention map for one input to a PNG grid (layers as rows, layer 1 at the "
        "top), print the strongest heads per surface pattern and, when an atlas exists for the model, each head's roles.",
    )
    look.add_argument(
        "model", metavar="MODEL", help="a model name of the config, a local save_pretrained directory, or a hub id"
    )
    look.add_argument("sentence", help="the input, words separated by spaces")
    look.add_argument("--pair", help="a second sentence (segment B: [SEP] between them for encoders)")
    look.add_argument("--config", default="config/config.yaml", help="config naming the models (default: %(default)s)")
    look.add_argument("--results", default="results", help="results directory of a run (default: %(default)s)")
    look.add_argument("--out", help="PNG to write (an SVG beside it; default: look_MODEL.png)")
    look.add_argument("--tsv", help="also write every head's pattern scores to this TSV")
    look.add_argument("--top", type=int, default=3, help="heads listed per pattern (default: %(default)s)")
    look.add_argument(
        "--max-length", type=int, default=512, help="longest input in tokens for a model not in the config"
    )
    look.add_argument(
        "--bos-token",
        default="auto",
        help="decoders not in the config: auto, none, or a token string (config key bos_token)",
    )
    look.add_argument("--all-heads", action="store_true", help="list the roles of heads without any too")
    look.set_defaults(func=_look)


def _atlas(args) -> int:
    from .core.look import atlas_summary, head_roles

    atlas, path = _atlas_table(args.results, args.model)
    if atlas is None:
        print(f"error: no atlas at {path}: run the workflow for model {args.model!r} first", file=sys.stderr)
        return 1
    print(f"atlas of {args.model} ({path}); heads are named layer-head, 1-based")
    for key, value in atlas_summary(atlas).items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        print(f"  {key}: {value}")
    if args.heads:
        for label, text in head_roles(atlas).items():
            print(f"  {label:<6} {text}")
    return 0


def add_atlas(subparsers) -> None:
    atlas = subparsers.add_parser(
        "atlas",
        help="the atlas summary of a finished run",
        description="Summarise results/atlas/MODEL/atlas.tsv: heads per Clark behaviour, Pande role and best relation.",
    )
    atlas.add_argument("model", metavar="MODEL", help="a model name of the run")
    atlas.add_argument("--results", default="results", help="results directory of the run (default: %(default)s)")
    atlas.add_argument("--heads", action="store_true", help="also print every head's roles")
    atlas.set_defaults(func=_atlas)


COMMANDS = [add_look, add_atlas, add_store]
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
