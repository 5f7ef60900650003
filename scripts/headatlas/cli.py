"""The ``headatlas`` command (also ``python -m headatlas``).

Each subcommand is a function ``add_<name>(subparsers)`` that adds its parser and sets
``func`` (called with the parsed arguments, returns the exit status); register it in
:data:`COMMANDS`. The logic lives in the library; this module only parses and prints.

    headatlas look MODEL "a sentence"  every head's map for one input (PNG grid), the strongest heads per
                                     Clark surface statistic (the analysis's own reducer) and, when
                                     results/atlas/MODEL exists, each head's roles
    headatlas atlas MODEL            the atlas summary of a finished run, every family (results/atlas/MODEL)
    headatlas export headvis RUN OUT the run's atlases as HeadVis's static data/ layout (OUT/MODEL/data each
                                     when the run has several)
    headatlas store DIR...           describe a store (its shards, in order)
    headatlas store verify DIR...    check stores (manifest, checksums, every value), shard sets and every sealed
                                     file below DIR (results/: the whole run); exit 1 on any fault
    headatlas plan --configfile X    every rule's predicted CPU time, peak memory and disk, before a run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import __version__
from .atlas.headvis import ExportError, atlas_names, export_run
from .core import plan
from .core.inputs import bos_warning
from .core.models import ModelError, load
from .core.store import MANIFEST, StoreError, describe_store, run_faults, store_dirs, verify_store
from .look import (
    PATTERNS,
    LookError,
    atlas_summary,
    head_roles,
    input_record,
    load_config,
    look_spec,
    maps_figure,
    quiet_libraries,
    sentence_maps,
    strongest_heads,
    surface_patterns,
    surface_settings,
    tokenize_input,
)

DEFAULT_CONFIG = "config/config.yaml"


def _store_describe(args) -> int:
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
    try:
        record = input_record(args.sentence, args.pair)  # before loading a model
        if args.config is None:  # the default: the repository's config when there is one
            cfg = load_config(DEFAULT_CONFIG) if Path(DEFAULT_CONFIG).is_file() else {}
        else:
            cfg = load_config(args.config) if args.config else {}
        spec, cache_dir = look_spec(args.model, cfg, args.max_length, args.bos_token)
        quiet_libraries()
        model, tokenizer, config = load(spec, cache_dir, device="cpu")
        warning = bos_warning(spec, config.to_dict())
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
        tok, kind, cut = tokenize_input(record, tokenizer, config, spec)
    except (ModelError, LookError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # a config that does not parse: its file and line
        print(f"error: {e}", file=sys.stderr)
        return 1
    if cut:
        print(f"warning: {cut}", file=sys.stderr)
    maps = sentence_maps(model, tokenizer, config, spec, tok, kind)
    scores = surface_patterns(model, tokenizer, spec, tok, kind, surface_settings(cfg))
    out = Path(args.out or Path(args.results) / "look" / f"{spec.name}.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    title = f"{spec.name}: every head's attention on one input ({maps.shape[0]} layers x {maps.shape[1]} heads)"
    maps_figure(maps, tok.pieces, title, out, out.with_suffix(".svg"))
    print(
        f"{spec.name} ({kind}): {maps.shape[0]} layers x {maps.shape[1]} heads, {len(tok)} tokens: {' '.join(tok.pieces)}"
    )
    print(f"maps: {out} (and {out.with_suffix('.svg').name}); heads are named layer-head, 1-based")
    print("strongest heads per Clark et al. surface statistic (the analysis's reducer on this one input; "
          "means over its query rows, fractions of attention unless noted):")  # fmt: skip
    top = strongest_heads(scores, args.top)
    for pattern, heads in top.items():
        text = ", ".join(f"{label} {value:.2f}" for label, value in heads)
        print(f"  {pattern:<7} {text}    ({PATTERNS[pattern]})")
    left = [p for p in PATTERNS if p not in top]
    if left:
        print(f"  not defined for this {kind} and input: {', '.join(left)}")
    labels = scores["label"].value_counts()
    print("behaviour labels (Clark's thresholds): " + ", ".join(f"{k} {v}" for k, v in labels.items()))
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
        scores.to_csv(args.tsv, sep="\t", index=False, float_format="%.6g")
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
    look.add_argument(
        "--config",
        default=None,
        help=f"config naming the models (default: {DEFAULT_CONFIG} when it exists; '' for none)",
    )
    look.add_argument("--results", default="results", help="results directory of a run (default: %(default)s)")
    look.add_argument("--out", help="PNG to write (an SVG beside it; default: RESULTS/look/MODEL.png)")
    look.add_argument(
        "--tsv", help="also write every head's statistics and label to this TSV (behaviour.tsv's columns)"
    )
    look.add_argument("--top", type=int, default=3, help="heads listed per pattern (default: %(default)s)")
    look.add_argument(
        "--max-length",
        type=int,
        default=512,
        help="longest input in tokens for a model not in the config (default: %(default)s, or the model's position "
        "limit when lower)",
    )
    look.add_argument(
        "--bos-token",
        default="auto",
        help="decoders not in the config: auto, none, or a token string (config key bos_token)",
    )
    look.add_argument("--all-heads", action="store_true", help="list the roles of heads without any too")
    look.set_defaults(func=_look)


def _atlas(args) -> int:
    atlas, path = _atlas_table(args.results, args.model)
    if atlas is None:
        have = atlas_names(args.results)
        where = f"atlases in {Path(args.results) / 'atlas'}: {', '.join(have)}" if have else "no atlas there yet"
        print(f"error: no atlas for model {args.model!r} at {path} ({where}); run the workflow first", file=sys.stderr)
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
        description="Summarise results/atlas/MODEL/atlas.tsv by family: Clark's behaviours, Pande's roles, the best "
        "relations, Jo & Myaeng's probes, the detectors (previous-token, duplicate, induction, sink) and the ablations.",
    )
    atlas.add_argument("model", metavar="MODEL", help="a model name of the run")
    atlas.add_argument("--results", default="results", help="results directory of the run (default: %(default)s)")
    atlas.add_argument("--heads", action="store_true", help="also print every head's roles (pipe it: | head, | grep)")
    atlas.set_defaults(func=_atlas)


def _export_headvis(args) -> int:
    try:
        written = export_run(args.run_dir, args.out, args.model, args.corpus, args.sequences)
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for model, data in written:
        print(f"HeadVis data: {data} ({model}: config.json, scatter_data.json, heads/L{{l}}H{{h}}.json)")
    print("serve HeadVis's dist/ beside a data/ directory to view it")
    return 0


def add_export(subparsers) -> None:
    export = subparsers.add_parser(
        "export", help="write a run's atlas in another viewer's format", description="Export a run's atlas."
    )
    sub = export.add_subparsers(dest="export_command", metavar="{headvis}")
    hv = sub.add_parser(
        "headvis",
        help="HeadVis's static data/ tree (config.json, scatter_data.json, heads/L{l}H{h}.json)",
        description="Write OUT/data for Anthropic's HeadVis viewer: every atlas metric as a scatter axis, every "
        "atlas value per head, and the token-level maps of sequences with stored maps.",
    )
    hv.add_argument("run_dir", metavar="RUN_DIR", help="a run's results directory (or one model's results/atlas/MODEL)")
    hv.add_argument(
        "out", metavar="OUT", help="directory to write data/ into (a run with several atlases: OUT/MODEL/data each)"
    )
    hv.add_argument("--model", help="export this model only (default: every model of the run)")
    hv.add_argument(
        "--corpus", default="ewt_dev", help="corpus whose stored maps give the sequences (default: %(default)s)"
    )
    hv.add_argument("--sequences", type=int, default=40, help="sequences per head (default: %(default)s)")
    hv.set_defaults(func=_export_headvis)


def _plan(args) -> int:

    try:
        hints = dict(plan.parse_model_shape(s) for s in args.shape)
        cfg = plan.load_config(args.configfile)
        model = plan.load_model(args.cost_model)
        jobs = plan.dry_run_jobs(args.configfile, args.directory, every=not args.remaining)
        planned = plan.plan_jobs(jobs, cfg, model, args.directory, hints, args.device_tflops)
    except (plan.PlanError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    summary = plan.summarize(planned)
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    fitted = ", ".join(sorted({m for run in model.get("runs", []) for m in run.get("models", [])}))
    print(f"plan for {args.configfile}: {len(jobs)} jobs (cost model {args.cost_model}, fitted on {fitted})")
    print("\n".join(plan.report(summary, args.cores, args.memory, args.device_tflops, model.get("accuracy"))))
    return 0


def add_plan(subparsers) -> None:

    p = subparsers.add_parser(
        "plan",
        help="every rule's predicted CPU time, peak memory and disk, before a run",
        description="List every job the workflow would run for a config (snakemake's dry run) and print each "
        "rule's predicted CPU-seconds, peak memory and disk from the fitted cost model (docs/plan.md), the totals "
        "and which settings dominate.",
    )
    p.add_argument("--configfile", default=DEFAULT_CONFIG, help="the run's config (default: %(default)s)")
    p.add_argument("--directory", default=".", help="the run directory (default: %(default)s)")
    p.add_argument("--cores", type=int, default=1, help="cores of the machine, for the wall-time bound")
    p.add_argument("--memory", type=float, help="memory of a node in GB: rules predicted above it are marked")
    p.add_argument("--device-tflops", type=float, help="achieved TFLOP/s of a GPU: the forward passes' device time")
    p.add_argument("--shape", action="append", default=[], help="MODEL=L,H,KV,d,P for a model not downloaded yet")
    p.add_argument("--remaining", action="store_true", help="only the jobs not run yet (default: every job)")
    p.add_argument("--cost-model", default=str(plan.COST_MODEL), help="the fitted cost model (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the per-rule summary as JSON")
    p.set_defaults(func=_plan)


COMMANDS = [add_look, add_atlas, add_store, add_export, add_plan]
_DEFAULT_SUB = {"store": ("describe", {"describe", "verify", "-h", "--help"})}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # ``headatlas store DIR`` means ``headatlas store describe DIR``
    if len(argv) > 1 and argv[0] in _DEFAULT_SUB and argv[1] not in _DEFAULT_SUB[argv[0]][1]:
        argv.insert(1, _DEFAULT_SUB[argv[0]][0])

    parser = argparse.ArgumentParser(
        prog="headatlas", description="Map what every attention head of a transformer does."
    )
    parser.add_argument("--version", action="version", version=f"headatlas {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        add(subparsers)
    if not argv:
        parser.print_help(sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:  # a command without its subcommand: show its help
        parser.parse_args(argv + ["--help"])  # exits
    try:
        return args.func(args)
    except BrokenPipeError:  # the reader went away (| head): stop quietly, as a shell tool does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
