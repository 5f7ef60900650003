"""Compile the Triton pass (core/triton_pass.py) for NVIDIA GPUs without one, and report each build's resources.

Triton compiles to a cubin with the ptxas its wheel carries, so a machine with no GPU can check that the kernel
the one map-free path runs on CUDA builds for a GPU generation (sm_80: A100; sm_90: H100 / H200) with each
launch configuration, and what it costs in registers per thread, spilled stack bytes and shared memory
(``cuobjdump --dump-resource-usage``)::

    PYTHONPATH=scripts .venv/bin/python benchmarks/triton_compile.py --json benchmarks/results_triton_compile.json

Run without ``TRITON_INTERPRET`` (the interpreter replaces the kernel by Python). Qwen2.5-1.5B's heads (128 wide),
causal, bf16 and float32 inputs, without the statistics and with the entropy and 16 or 128 value columns, at the
launch the pass picks (``core.triton_pass.blocks``) and, for bf16, the other one ``bench_gpu.py --kernels`` times.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
import warnings

COLUMNS = (0, 16, 128)  # none (A.V and LSE), the position statistics' few, Clark's word columns (one per word)


def build(capability: int, dtype: str, columns: int, launch: dict, width: int = 128) -> dict:
    """One cubin's resources: {"registers", "stack", "shared_static", "shared_dynamic"}; ``columns``: 0 for A.V
    and LSE alone, else the entropy and that many value columns."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from headatlas.core import triton_pass

    fn = triton_pass.attention_pass_kernel
    names = list(inspect.signature(fn.fn).parameters)
    t = "*bf16" if dtype == "bf16" else "*fp32"
    pointers = {"Q": t, "K": t, "V": t, "OUT": t, "KEYS": "*i8"} | dict.fromkeys(
        ("X", "L", "LSE", "ENT", "XOUT", "LOUT"), "*fp32"
    )
    const = {
        "BLOCK_M": launch["BLOCK_M"], "BLOCK_N": launch["BLOCK_N"], "BLOCK_D": width, "BLOCK_DV": width, "BLOCK_C": max(16, columns),
        "BLOCK_CL": 16, "CAUSAL": True, "HAS_KEYS": False, "ENTROPY": columns > 0, "HAS_X": columns > 0, "HAS_L": False,
        "F32_DOTS": False, "QK_PRECISION": "tf32" if dtype == "bf16" else "ieee",
    }  # fmt: skip
    sig = {p: pointers.get(p, "i32") for p in names} | dict.fromkeys(const, "constexpr") | {"qk_scale": "fp32"}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in const.items()})
    opts = {k: launch[k] for k in ("num_warps", "num_stages")}
    kernel = triton.compile(src, target=GPUTarget("cuda", capability, 32), options=opts)
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True)
    line = next(x for x in out.stdout.splitlines() if "REG:" in x)
    usage = dict(tok.split(":", 1) for tok in line.split() if ":" in tok)
    return {"registers": int(usage["REG"]), "stack": int(usage["STACK"]), "shared_static": int(usage["SHARED"]),
            "shared_dynamic": int(kernel.metadata.shared)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capabilities", default="80,90")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        sys.exit("triton_compile.py: unset TRITON_INTERPRET (the interpreter compiles nothing)")
    warnings.filterwarnings("ignore", module="triton")
    from bench_gpu import OTHER_BLOCKS

    from headatlas.core.triton_pass import blocks

    rows = []
    for cap in (int(c) for c in args.capabilities.split(",")):
        for dtype in ("bf16", "fp32"):
            for columns in COLUMNS:
                launches = {"pass": blocks(128, "cuda", dtype == "fp32", columns)}
                if dtype == "bf16" and columns == 16:
                    launches["other"] = OTHER_BLOCKS
                for name, launch in launches.items():
                    row = {"sm": cap, "dtype": dtype, "columns": columns, "launch": name} | launch
                    row.update(build(cap, dtype, columns, launch))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.json:
        import triton

        with open(args.json, "w") as f:
            json.dump({"triton": triton.__version__, "rows": rows}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
