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

# ruff: noqa: B023 - every closure below is called in the loop iteration that made it

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
    "smollm2": {"batch_size": 32, "tokens": 2048, "batches": 3},  # 196,608 of the test set's 235,845 words
}
SMOKE = {"batch_size": 4, "tokens": 32, "batches": 2}
# The scale ladder (--ladder): Qwen2.5-0.5B and 1.5B shapes (qwen2: q/k/v biases, rotary base 1e6, 2 KV heads),
# random weights, SmolLM2's tokenizer (the base model has no output layer: the vocabulary only sizes the
# embedding lookup). Sizes batch x tokens; the long ones run the SDPA forward and the map-free path only (an
# eager map of 8 x 14 heads x 8192^2 is 30 GB a layer).
LADDER = {
    "qwen05": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14},
    "qwen15": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12},
}
LADDER_SIZES = {"bfloat16": [(32, 2048), (8, 8192), (1, 32768)], "float32": [(32, 2048)]}
LADDER_SMOKE = {"bfloat16": [(2, 32), (1, 64)], "float32": [(2, 32)]}


def ladder_config(name: str, tokenizer_dir: Path, smoke: bool):
    """A qwen2 config of ``name``'s shape for SmolLM2's tokenizer in ``tokenizer_dir``."""
    from transformers import AutoTokenizer, Qwen2Config

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    shape = dict(LADDER[name])
    if smoke:
        shape["num_hidden_layers"] = 2
    return Qwen2Config(
        vocab_size=len(tok),
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1e6,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        **shape,
    )


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


def timed(f, cuda: bool, repeats: int) -> dict:
    """Median seconds of ``repeats`` calls of ``f`` (after the caller's warm-up), peak device memory."""
    import torch

    row: dict = {}
    if cuda:
        row["resident_mb"] = round(torch.cuda.memory_allocated() / 2**20, 1)
        torch.cuda.reset_peak_memory_stats()
    secs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        if cuda:
            torch.cuda.synchronize()
        secs.append(time.perf_counter() - t0)
    row["seconds"] = [round(x, 4) for x in secs]
    if cuda:
        row["peak_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return row


def run_ladder(name: str, args, emit) -> None:
    """The ladder's model ``name`` in each dtype and size: the SDPA forward and the map-free extraction (the
    position statistics and the detectors), tokens/s, peak memory above the resident weights."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from headatlas.core import mapfree as mapfree_kernels
    from headatlas.core.extract import tokenize_records
    from headatlas.core.models import ModelSpec, load
    from headatlas.core.reduce import bare_forward, fused_reduce
    from headatlas.detectors.reducers import DetectorReducer
    from headatlas.position.reducers import PositionReducer

    cuda = args.device.startswith("cuda")
    tok_dir = args.model_root / "smollm2"
    config = ladder_config(name, tok_dir, args.smoke)
    sizes = LADDER_SMOKE if args.smoke else LADDER_SIZES
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        torch.manual_seed(0)
        with torch.device(args.device):
            m = AutoModel.from_config(config)
        m.save_pretrained(tmp)
        del m
        AutoTokenizer.from_pretrained(tok_dir).save_pretrained(tmp)
        build_s = round(time.perf_counter() - t0, 1)
        for dtype, shapes in sizes.items():
            T_max = max(t for _, t in shapes)
            spec = ModelSpec.from_config(
                {"name": name, "source": {"path": tmp}, "dtype": dtype, "max_length": T_max, "batch_size": 1}
            )
            try:
                eager, tokenizer, _ = load(spec, device=args.device)
                sdpa = AutoModel.from_pretrained(tmp, attn_implementation="sdpa", dtype=eager.dtype)
                sdpa = sdpa.to(args.device).eval()
            except Exception as e:  # noqa: BLE001
                emit({"model": name, "dtype": dtype, "error": f"{type(e).__name__}: {e}"[:2000]})
                continue
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
            bos = tokenizer.bos_token_id
            for B, T in shapes:
                out = {"model": name, "dtype": dtype, "batch_size": B, "tokens_per_sequence": T, "build_s": build_s}
                out.update(layers=config.num_hidden_layers, heads=config.num_attention_heads, kv_heads=2)
                records = wiki_records(B, T)
                toks, _ = tokenize_records(records, tokenizer, "decoder", T, "truncate", bos)
                n_tok = sum(len(t) for t in toks)
                out["tokens"] = n_tok
                warm, warm_recs = toks[:1], records[:1]

                def mapfree(tt, rr, bs, model=eager, pad=pad):
                    red = [PositionReducer(), DetectorReducer()]
                    fused_reduce(model, tt, red, bs, "decoder", rr, pad, name, "bench", path="mapfree")

                modes = {
                    "sdpa": (lambda: bare_forward(sdpa, toks, B, pad), lambda: bare_forward(sdpa, warm, 1, pad)),
                    "mapfree": (lambda: mapfree(toks, records, B), lambda: mapfree(warm, warm_recs, 1)),
                }
                out["modes"] = {}
                for mode, (f, w) in modes.items():
                    try:
                        w()
                        row = timed(f, cuda, args.repeats)
                        row["tokens_per_s"] = round(n_tok / statistics.median(row["seconds"]), 1)
                    except Exception as e:  # noqa: BLE001 - one failing mode must not lose the others' numbers
                        row = {"error": f"{type(e).__name__}: {e}"[:2000]}
                        if cuda:
                            torch.cuda.empty_cache()
                    out["modes"][mode] = row
                    print(f"[bench_gpu] {name} {dtype} {B}x{T} {mode}: {row}", file=sys.stderr, flush=True)
                mm = out["modes"]
                if all("tokens_per_s" in mm[k] for k in ("sdpa", "mapfree")):
                    out["mapfree_over_sdpa"] = round(mm["mapfree"]["tokens_per_s"] / mm["sdpa"]["tokens_per_s"], 4)
                # the kernels that failed so far (said once in the log; the next one ran): none on CUDA means
                # the map-free rows ran the Triton pass
                out["kernels_failed"] = {" ".join(map(str, key)): why for key, why in mapfree_kernels._FAILED.items()}
                emit(out)
            eager = sdpa = None
            if cuda:
                torch.cuda.empty_cache()


OTHER_BLOCKS = {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 8, "num_stages": 3}  # the Triton pass's other launch


def einsum_dot(q, k):
    """_dot's result by einsum (k broadcast to q's shape)."""
    import torch

    return torch.einsum("...d,...d->...", q, k.expand_as(q))


def free_view(q, k, scale):
    """A function building one layer's FreeLayer with 9 targets (offsets -2, -1, +1, +2, the first key, 4 indexed)
    over a causal batch of q's shape, optionally with ``dot`` in place of mapfree._dot."""
    import numpy as np
    import torch

    from headatlas.core import mapfree
    from headatlas.core.reducer import ReduceBatch

    bsz, _, n, _ = q.shape
    rows = [{"word": np.arange(n), "special": np.zeros(n, dtype=np.int64), "segment": np.zeros(n, dtype=np.int64),
             "piece": np.array(["p"] * n, dtype=object)} for _ in range(bsz)]  # fmt: skip
    batch = ReduceBatch.from_rows(np.arange(bsz), rows, np.arange(bsz), np.full(bsz, n))
    rng = np.random.default_rng(0)
    targets = {f"offset:{o}": np.zeros((bsz, n), dtype=np.int64) for o in (-2, -1, 1, 2)}
    targets["key:0"] = np.zeros((bsz, n), dtype=np.int64)
    targets |= {f"t{i}": rng.integers(0, n, (bsz, n)) for i in range(4)}
    qf, kf = q.float(), k.float()
    lse = torch.zeros(q.shape[:3], device=q.device)  # (any LSE: the timing is the same)

    def build(dot=None):
        before = mapfree._dot
        mapfree._dot = dot or before
        try:
            return mapfree.FreeLayer(qf, kf, lse, scale, batch, True, None, None, None, targets)._targets
        finally:
            mapfree._dot = before

    return build


def run_kernels(args, emit) -> None:
    """The one-path candidates on the device, one layer of Qwen2.5-1.5B's heads (12 on 2 KV heads of 128),
    causal, bf16: the SDPA kernel (no LSE), the memory-efficient kernel with its LSE (today's CUDA path, KV
    expanded), the flash kernel with its LSE, FlexAttention with its LSE (compile time apart),
    blocked_attention with the entropy and one key column, the one path (``layer_attention``: the same outputs,
    its widened values [V | K | column] on the kernel ``kernel_order`` picks), a widened fused call in bf16
    (``fused_attention``: none where ``kernel_order`` names no kernel for widened values), FlexAttention on
    [V | K] in one bf16 call and in two head-size calls (V, then K; compiled with dynamic shapes), each with the
    kernels that ran; the Triton pass (A.V and LSE alone, then with the entropy and the column, at two block
    sizes); FreeLayer's 9 targets above the kernel (its products, and einsum in their place); the largest LSE
    difference from float64 rows."""
    import torch
    import torch.nn.functional as F

    from headatlas.core import triton_pass
    from headatlas.core.mapfree import blocked_attention, fused_attention, layer_attention

    dev = args.device
    cuda = dev.startswith("cuda")
    shapes = [(1, 64)] if args.smoke else [(8, 8192), (1, 32768)]
    for B, n in shapes:
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(B, 12, n, 128, device=dev, generator=g, dtype=torch.bfloat16)
        k = torch.randn(B, 2, n, 128, device=dev, generator=g, dtype=torch.bfloat16)
        v = torch.randn(B, 2, n, 128, device=dev, generator=g, dtype=torch.bfloat16)
        scale = 128**-0.5
        cols = torch.rand(B, 1, n, 1, device=dev, generator=g)
        ke, ve = k.repeat_interleave(6, 1), v.repeat_interleave(6, 1)
        # exact LSE of a few rows (float64) for the error column
        rows = torch.tensor([0, n // 2, n - 1], device=dev)
        s = (q[:1, :, rows].double() @ ke[:1].double().transpose(-1, -2)) * scale
        s = s.masked_fill(torch.arange(n, device=dev)[None, None, None] > rows[None, None, :, None], -torch.inf)
        ref = torch.logsumexp(s, -1)
        cands = {
            "sdpa": lambda: (
                F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True),
                None,
            ),
            "efficient_lse": lambda: torch.ops.aten._scaled_dot_product_efficient_attention(
                q, ke, ve, None, True, 0.0, True, scale=scale
            )[:2],
            "flash_lse": lambda: torch.ops.aten._scaled_dot_product_flash_attention(
                q, ke, ve, 0.0, True, False, scale=scale
            )[:2],
            "blocked_entropy_column": lambda: blocked_attention(q, k, v, None, True, scale, cols=cols, entropy=True)[
                :2
            ],
            # the one path (the feed's call: float32, values widened to [V | K | column]), and the same widened
            # call in the inputs' dtype (a speed bound: the statistics would be rounded to bf16)
            "layer_entropy_column": lambda: layer_attention(
                q, k, v, None, True, scale, cols=cols, entropy=True, ran=ran
            )[:2],
            "widened_bf16": lambda: fused_attention(
                q, k, torch.cat([v, k, cols.to(v.dtype).expand(B, 2, n, 1)], -1), None, True, scale, ran_bf16
            ),
            # the Triton pass (the one path's kernel on CUDA): A.V and LSE alone (its flash speed), with the
            # entropy and the column, and the same with blocks of 128 rows and 32 keys (no spilled registers when
            # compiled for sm_90: benchmarks/triton_compile.py)
            "triton_lse": lambda: triton_pass.attention_pass(q, k, v, None, True, scale)[:2],
            "triton_entropy_column": lambda: triton_pass.attention_pass(
                q, k, v, None, True, scale, cols[:, 0], None, True
            )[:2],
            "triton_entropy_column_128x32": lambda: triton_pass.attention_pass(
                q, k, v, None, True, scale, cols[:, 0], None, True, launch=OTHER_BLOCKS
            )[:2],
        }
        ran, ran_bf16 = set(), set()
        # the targets above the kernel (FreeLayer.attention_to: 9 as the default reducers declare, offsets, the
        # first key and indexed ones) from float32 q, k and LSE, with _dot's products in one buffer and a sum,
        # and with einsum (a batched matrix product reading q and k once) in its place
        view = free_view(q, k, scale)
        cands["targets_products"] = lambda: (view(), None)
        cands["targets_einsum"] = lambda: (view(einsum_dot), None)
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, n, n, device=dev)
            flex = torch.compile(flex_attention)
            flex_dyn = torch.compile(flex_attention, dynamic=True)
            try:
                from torch.nn.attention.flex_attention import AuxRequest

                def lse_call(fn, vals):
                    o, aux = fn(
                        q, k, vals, block_mask=bm, scale=scale, enable_gqa=True, return_aux=AuxRequest(lse=True)
                    )
                    return o, aux.lse

            except ImportError:  # an older torch

                def lse_call(fn, vals):
                    return fn(q, k, vals, block_mask=bm, scale=scale, enable_gqa=True, return_lse=True)

            t0 = time.perf_counter()
            lse_call(flex, v)
            if cuda:
                torch.cuda.synchronize()
            compile_s = round(time.perf_counter() - t0, 2)
            cands["flex_lse"] = lambda: lse_call(flex, v)
            # the candidates for the entropy at flash speed: one call on [V | K] (256 wide, bf16: A.V, LSE and
            # A.K, whence H = LSE - scale q . A.K) and the same outputs from two head-size calls (V, then K)
            vk = torch.cat([v, k], -1)
            cands["flex_vk_bf16"] = lambda: lse_call(flex, vk)
            cands["flex_v_then_k"] = lambda: (lse_call(flex_dyn, v)[0], lse_call(flex_dyn, k)[1])
        except Exception as e:  # noqa: BLE001
            compile_s = f"{type(e).__name__}: {e}"[:500]
        out = {"kernels": f"{B}x{n}", "heads": "12 on 2 of 128, causal, bf16", "flex_compile_s": compile_s, "rows": {}}
        for name, f in cands.items():
            try:
                res = f()
                row = timed(f, cuda, max(2, args.repeats))
                row["ms"] = round(1000 * statistics.median(row.pop("seconds")), 2)
                if res[1] is not None:
                    lse = res[1][:1, :, :n][..., rows].double()
                    row["lse_max_err"] = float((lse - ref).abs().max())
            except Exception as e:  # noqa: BLE001
                row = {"error": f"{type(e).__name__}: {e}"[:1000]}
            if name in ("layer_entropy_column", "widened_bf16"):
                row["kernels"] = sorted(ran if name == "layer_entropy_column" else ran_bf16)
            out["rows"][name] = row
            print(f"[bench_gpu] kernels {B}x{n} {name}: {row}", file=sys.stderr, flush=True)
        emit(out)
        q = k = v = ke = ve = None
        if cuda:
            torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--cases", default="minilm,smollm2")
    ap.add_argument("--model-root", type=Path, default=REPO / ".gpu", help="NAME/{config.json,tokenizer files}")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes and two layers (a check of the code, no numbers)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--ladder", default="", help="e.g. qwen05,qwen15: the scale ladder's shapes (LADDER_SIZES)")
    ap.add_argument("--kernels", action="store_true", help="the one-path kernel candidates (run_kernels)")
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
    report["ladder"], report["kernels"] = [], []

    def save():  # after every case: a step cut by its time limit keeps what it measured
        if args.json:
            args.json.write_text(json.dumps(report, indent=2) + "\n")

    def emitter(key):
        def emit(row):
            report[key].append(row)
            save()

        return emit

    if args.kernels:
        run_kernels(args, emitter("kernels"))
    for name in filter(None, args.ladder.split(",")):
        run_ladder(name, args, emitter("ladder"))
    for name in filter(None, args.cases.split(",")):
        report["cases"].append(run_case(name, SMOKE if args.smoke else CASES[name], args))
        save()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the case's models are gone with its frame
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
