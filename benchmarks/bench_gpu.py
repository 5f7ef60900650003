"""GPU benchmark: the workflow's map-free and eager-fused extraction against the SDPA and eager forward passes, on fixed-length inputs, with tokens/s and peak device memory. Called by benchmarks/gpu_check.sh::

    PYTHONPATH=scripts python3 benchmarks/bench_gpu.py --json out.json              # on the device (CUDA)
    PYTHONPATH=scripts python benchmarks/bench_gpu.py --device cpu --smoke           # here: the same code, tiny sizes

Cases (``--cases``): ``minilm`` (BERT 6x12, batch 128 at 128 tokens) and ``smollm2`` (Llama 30x9, batch 32 at
2048 tokens). Each model is built with random weights from the config and tokenizer in ``--model-root``/NAME
(``benchmarks/gpu_prepare.py`` copies them; the weights cannot travel), saved with ``save_pretrained`` and loaded
twice: by :func:`headatlas.core.models.load` (eager attention, the rule's path) and with ``attn_implementation=
"sdpa"``. The inputs are WikiText-2 test windows tokenised to exactly ``tokens`` tokens. Modes, over the same
batches, each run ``--repeats`` times after a warm-up (median reported):

- ``sdpa``: the SDPA forward pass (no maps): the baseline of every ratio;
- ``eager``: the eager forward pass (every map computed, none kept): the bound the map-free path removes;
- ``fused``: :func:`headatlas.core.reduce.fused_reduce` with the position statistics and the detectors on the
  eager-fused path (every map materialised, then reduced);
- ``mapfree``: the same reducers on the map-free path (q, k, LSE and value passes of the fused kernel;
  docs/mapfree.md); where the model type has no map-free form, ``mapfree_unsupported`` says why and the mode
  runs what the workflow would plan.

Peak device memory: ``torch.cuda.max_memory_allocated`` over each mode's runs (both models' weights included;
``resident_mb`` is what was allocated before the mode started).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WIKI = REPO / "resources" / "wikitext2_raw" / "wiki.test.raw"
CASES = {
    "minilm": {"batch_size": 128, "tokens": 128, "batches": 8},
    "smollm2": {"batch_size": 32, "tokens": 2048, "batches": 4},
}
SMOKE = {"batch_size": 4, "tokens": 32, "batches": 2}


def wiki_records(n: int, words: int):
    """``n`` records of ``words`` consecutive WikiText-2 test words (headings left out)."""
    from headatlas.core.data import Record

    text = [ln for ln in WIKI.read_text(encoding="utf-8").splitlines() if ln.strip() and not ln.strip().startswith("=")]
    flat = " ".join(text).split()
    if len(flat) < n * words:
        raise SystemExit(f"{WIKI}: {len(flat)} words, need {n * words}")
    return [Record(id=f"w{i}", words=tuple(flat[i * words : (i + 1) * words]), segment=(0,) * words) for i in range(n)]


def cuda_sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_case(name: str, size: dict, args) -> dict:
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    from headatlas.core.extract import tokenize_records
    from headatlas.core.models import ModelSpec, decoder_bos, load, model_kind
    from headatlas.core.reduce import bare_forward, fused_reduce

    src = args.model_root / name
    cuda = args.device.startswith("cuda")
    B, T, nb = size["batch_size"], size["tokens"], size["batches"]
    out: dict = {"model": name, "batch_size": B, "tokens_per_sequence": T, "sequences": B * nb, "dtype": args.dtype}
    with tempfile.TemporaryDirectory() as tmp:
        config = AutoConfig.from_pretrained(src)
        if args.smoke:  # two layers: the same code, seconds on a CPU
            config.num_hidden_layers = 2
        torch.manual_seed(0)
        AutoModel.from_config(config).save_pretrained(tmp)
        AutoTokenizer.from_pretrained(src).save_pretrained(tmp)
        spec = ModelSpec.from_config(
            {"name": name, "source": {"path": tmp}, "dtype": args.dtype, "max_length": T, "batch_size": B}
        )
        eager, tokenizer, config = load(spec, device=args.device)
        sdpa = AutoModel.from_pretrained(tmp, attn_implementation="sdpa", dtype=eager.dtype).to(args.device).eval()
    kind = model_kind(config, spec)
    out.update(kind=kind, layers=int(config.num_hidden_layers), heads=int(config.num_attention_heads))
    bos = decoder_bos(tokenizer, config, spec) if kind == "decoder" else None
    # a word is at least one token, so every input is cut at T tokens (whole words: a few may be short)
    records = wiki_records(B * nb, T)
    tokenized, _ = tokenize_records(records, tokenizer, kind, T, "truncate", bos)
    lengths = [len(t) for t in tokenized]
    if min(lengths) < T - 16:
        raise SystemExit(f"{name}: an input of {min(lengths)} tokens, expected about {T}")
    out["shortest"] = min(lengths)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    n_tok = sum(len(t) for t in tokenized)
    out["tokens"] = n_tok
    # map-free: the statistics that have a map-free form (position statistics and detectors), planned as the
    # workflow plans them; "fused" is the eager-fused path (maps materialised) with the same reducers
    from headatlas.core.mapfree import mapfree_support
    from headatlas.detectors.reducers import DetectorReducer
    from headatlas.position.reducers import PositionReducer

    why = mapfree_support(config, T)
    if why:
        out["mapfree_unsupported"] = why

    def reduce_with(path):
        def run(toks, recs):
            fused_reduce(
                eager, toks, [PositionReducer(), DetectorReducer()], B, kind, recs, pad, name, "bench", path=path
            )
            cuda_sync(args.device)

        return run

    modes = {
        "sdpa": lambda toks, recs: bare_forward(sdpa, toks, B, pad),
        "eager": lambda toks, recs: bare_forward(eager, toks, B, pad),
        "fused": reduce_with("eager"),
        "mapfree": reduce_with("auto" if why else "mapfree"),
    }
    out["modes"] = {}
    for mode, f in modes.items():
        row: dict = {}
        try:
            f(tokenized[:B], records[:B])  # warm-up: kernels, allocator, reducer buffers
            if cuda:
                row["resident_mb"] = round(torch.cuda.memory_allocated() / 2**20, 1)
                torch.cuda.reset_peak_memory_stats()
            secs = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                f(tokenized, records)
                secs.append(time.perf_counter() - t0)
            row["seconds"] = secs
            row["tokens_per_s"] = round(n_tok / statistics.median(secs), 1)
            if cuda:
                row["peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        except Exception as e:  # noqa: BLE001 - one failing mode must not lose the others' numbers
            row["error"] = f"{type(e).__name__}: {e}"[:2000]
        out["modes"][mode] = row
        print(f"[bench_gpu] {name} {mode}: {row}", file=sys.stderr, flush=True)
    m = out["modes"]
    ok = {k for k, v in m.items() if "tokens_per_s" in v}
    for a, b in (("mapfree", "sdpa"), ("fused", "sdpa"), ("eager", "sdpa"), ("mapfree", "eager"), ("fused", "eager")):
        if {a, b} <= ok:
            out[f"{a}_over_{b}"] = round(m[a]["tokens_per_s"] / m[b]["tokens_per_s"], 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cases", default="minilm,smollm2")
    ap.add_argument("--model-root", type=Path, default=REPO / ".gpu", help="NAME/{config.json,tokenizer files}")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes and two layers (a check of the code, no numbers)")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    import torch
    import transformers

    report = {
        "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "smoke": args.smoke,
        "cases": [],
    }
    for name in args.cases.split(","):
        report["cases"].append(run_case(name, SMOKE if args.smoke else CASES[name], args))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the case's models are gone with its frame
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
