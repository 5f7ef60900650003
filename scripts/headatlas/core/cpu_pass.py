"""The map-free statistics' attention pass on a CPU: ``attention_pass.c``, compiled once per machine, loaded with ctypes.

:func:`attention_pass` computes, in one pass over a layer's scores, the model's output A.V and each row's LSE (what
the fused kernel returns) and every statistic's sums: the row entropy, the smoothed rows' entropy, value columns
(A.m)_i, lower columns sum_{j <= i} A_ij m_j and the attention to each query's target keys. It is the CPU
implementation of what :func:`headatlas.core.mapfree.blocked_attention` and :class:`~headatlas.core.mapfree.
FreeLayer`'s targets and smoothed entropy compute with torch (on a GPU, and on a CPU where no C compiler is
found); tests/test_mapfree.py checks both against an explicit softmax.

The library is built with the machine's C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) at ``-O3
-march=native`` into ``$HEADATLAS_KERNEL_CACHE`` (default ``~/.cache/headatlas``), named by a hash of the source,
the flags and the CPU's instruction sets, so nodes of a cluster with other CPUs build their own. A build takes
about a second, once; concurrent jobs each build and rename atomically. Without a compiler :func:`library`
returns None and says why once in the log.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("attention_pass.c")
FLAGS = (("-O3", "-march=native"), ("-O3",))  # the second where the compiler does not know -march=native

_F, _I, _L = ctypes.POINTER(ctypes.c_float), ctypes.c_int, ctypes.c_int64


class PassArgs(ctypes.Structure):
    """``pass_args`` of attention_pass.c, field for field."""

    _fields_ = [
        ("q", _F), ("k", _F), ("v", _F),
        *((s, _L) for s in ("qsb", "qsh", "qsi", "ksb", "ksh", "ksi", "vsb", "vsh", "vsi")),
        ("keybias", _F),
        *((s, _I) for s in ("B", "H", "Hkv", "n", "d", "dv", "causal")),
        ("scale", ctypes.c_float),
        ("out", _F), ("osb", _L), ("osh", _L), ("osi", _L),
        ("lse", _F), ("ent", _F), ("sment", _F), ("smoothing", ctypes.c_float),
        ("cols", _F), ("vals", _F), ("lcols", _F), ("low", _F), ("C", _I), ("C2", _I),
        ("targets", ctypes.POINTER(ctypes.c_int32)), ("tout", _F), ("T", _I),
        ("threads", _I), ("thread", _I),
    ]  # fmt: skip


def cache_dir() -> Path:
    """Where built libraries are kept: ``$HEADATLAS_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/headatlas``, else
    ``~/.cache/headatlas``."""
    if os.environ.get("HEADATLAS_KERNEL_CACHE"):
        return Path(os.environ["HEADATLAS_KERNEL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "headatlas"


def machine_key() -> str:
    """The processor and its instruction sets (a library built with -march=native runs only where they are)."""
    features = ""
    try:
        with open("/proc/cpuinfo") as f:
            features = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.system()} {platform.machine()} {platform.processor()} {features}"


def compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build(out: Path, cc: str) -> str | None:
    """Compile the source into ``out`` (atomically); None, or why it failed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    why = None
    for flags in FLAGS:
        fd, tmp = tempfile.mkstemp(prefix=out.stem, suffix=".so", dir=out.parent)
        os.close(fd)
        cmd = [cc, *flags, "-shared", "-fPIC", "-o", tmp, str(SOURCE), "-lm"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0:
            os.replace(tmp, out)
            return None
        os.unlink(tmp)
        why = f"{' '.join(cmd)}: {proc.stderr.strip()[-500:]}"
    return why


_LIB: list = []  # [the loaded library or None] once tried
_LOCK = threading.Lock()


def library():
    """The loaded library (built first if this machine has none yet), or None without a working C compiler."""
    with _LOCK:
        if not _LIB:
            _LIB.append(_load())
        return _LIB[0]


def _load():
    cc = compiler()
    if cc is None:
        log.warning("map-free statistics: no C compiler ($CC, cc, gcc, clang) for the CPU attention pass; "
                    "the torch products are used instead (slower)")  # fmt: skip
        return None
    digest = hashlib.sha256(SOURCE.read_bytes() + repr((FLAGS, cc, machine_key())).encode()).hexdigest()[:16]
    path = cache_dir() / f"attention_pass-{digest}.so"
    if not path.is_file():
        try:
            why = build(path, cc)
        except OSError as e:  # an unwritable cache: build in the temporary folder
            path = Path(tempfile.gettempdir()) / f"headatlas-{os.getuid()}" / path.name
            why = None if path.is_file() else build(path, cc)
            why = why and f"{why} (cache {cache_dir()}: {e})"
        if why:
            log.warning("map-free statistics: the CPU attention pass did not build (%s); the torch products are "
                        "used instead (slower)", why)  # fmt: skip
            return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:  # a library this machine cannot load: say so, and use the torch products
        log.warning("map-free statistics: the CPU attention pass %s does not load (%s); the torch products are "
                    "used instead (slower); delete it to rebuild", path, e)  # fmt: skip
        return None
    lib.attention_pass.argtypes = [ctypes.POINTER(PassArgs)]
    lib.attention_pass.restype = ctypes.c_int
    return lib


_POOL: list = []  # [(threads, executor)]


def _pool(threads: int) -> ThreadPoolExecutor:
    if not _POOL or _POOL[0][0] != threads:
        if _POOL:
            _POOL.pop()[1].shutdown()
        _POOL.append((threads, ThreadPoolExecutor(threads, thread_name_prefix="headatlas-pass")))
    return _POOL[0][1]


def _ptr(t, kind=_F):
    return None if t is None else ctypes.cast(t.data_ptr(), kind)


def attention_pass(
    q, k, v, keybias, causal: bool, scale: float, cols=None, lcols=None, entropy=False, targets=None, smoothing=None
):
    """(A.v [B, n, H, dv] (the layout a model's attention function returns), LSE [B, H, n], {"values": A.cols
    [B, H, n, C], "lower": sum_{j <= i} A_ij lcols_j [B, H, n, C'], "entropy": [B, H, n], "targets": A[i,
    targets[b, t, i]] [B, H, T, n] (0 where the target is -1, hidden or after i under ``causal``),
    "smoothed_entropy": [B, H, n] the entropy of the rows (1 - smoothing) A + smoothing / k_i over each row's k_i
    visible keys}, the asked ones)
    of q [B, H, n, d] and k, v [B, Hkv, n, .] on a CPU (grouped heads not expanded). ``keybias``: [B, n] additive
    (-inf hides a key) or None; ``cols``, ``lcols``: [B, n, C] key columns; ``targets``: [B, T, n] int.
    Float32 (other dtypes are converted; the output comes back in v's dtype); torch's intra-op threads take units of
    64 query rows round-robin."""
    import torch

    lib = library()
    if lib is None:
        raise RuntimeError("the CPU attention pass is not built (see the log)")

    def f32(x):
        x = x.detach().float() if x.dtype != torch.float32 else x.detach()
        return x if x.stride(-1) == 1 else x.contiguous()

    dtype = v.dtype
    q, k, v = f32(q), f32(k), f32(v)
    bsz, h, n, d = q.shape
    hk, dv = k.shape[1], v.shape[-1]
    out = torch.empty((bsz, n, h, dv), dtype=torch.float32)
    lse = torch.empty((bsz, h, n), dtype=torch.float32)
    got = {}
    args = PassArgs(q=_ptr(q), k=_ptr(k), v=_ptr(v), B=bsz, H=h, Hkv=hk, n=n, d=d, dv=dv, causal=int(causal))
    args.scale = scale
    args.qsb, args.qsh, args.qsi = q.stride()[:3]
    args.ksb, args.ksh, args.ksi = k.stride()[:3]
    args.vsb, args.vsh, args.vsi = v.stride()[:3]
    args.out, args.lse = _ptr(out), _ptr(lse)
    args.osb, args.osi, args.osh = out.stride()[:3]
    keep = [q, k, v]  # every tensor the library reads stays alive until it returns
    if keybias is not None:
        keybias = keybias.detach().float().expand(bsz, n).contiguous()
        args.keybias = _ptr(keybias)
        keep.append(keybias)
    if entropy:
        got["entropy"] = torch.empty((bsz, h, n), dtype=torch.float32)
        args.ent = _ptr(got["entropy"])
    if smoothing is not None:
        got["smoothed_entropy"] = torch.empty((bsz, h, n), dtype=torch.float32)
        args.sment, args.smoothing = _ptr(got["smoothed_entropy"]), smoothing
    if cols is not None:
        cols = cols.detach().float().expand(bsz, n, -1).contiguous()
        got["values"] = torch.empty((bsz, h, n, cols.shape[-1]), dtype=torch.float32)
        args.cols, args.vals, args.C = _ptr(cols), _ptr(got["values"]), cols.shape[-1]
        keep.append(cols)
    if lcols is not None:
        lcols = lcols.detach().float().expand(bsz, n, -1).contiguous()
        got["lower"] = torch.empty((bsz, h, n, lcols.shape[-1]), dtype=torch.float32)
        args.lcols, args.low, args.C2 = _ptr(lcols), _ptr(got["lower"]), lcols.shape[-1]
        keep.append(lcols)
    if targets is not None:
        targets = torch.as_tensor(targets, dtype=torch.int32).contiguous()
        got["targets"] = torch.empty((bsz, h, targets.shape[1], n), dtype=torch.float32)
        args.targets, args.tout, args.T = (
            _ptr(targets, ctypes.POINTER(ctypes.c_int32)),
            _ptr(got["targets"]),
            targets.shape[1],
        )
        keep.append(targets)
    threads = max(1, min(torch.get_num_threads(), bsz * h * -(-n // 64)))  # units of 64 rows (ROWS)
    args.threads = threads

    def run(thread):
        a = PassArgs.from_buffer_copy(args)
        a.thread = thread
        return lib.attention_pass(ctypes.byref(a))

    codes = [run(0)] if threads == 1 else list(_pool(threads).map(run, range(threads)))
    if any(codes):
        raise MemoryError(f"the CPU attention pass could not allocate its buffers (n = {n}, head size {d})")
    return out.to(dtype), lse, got
