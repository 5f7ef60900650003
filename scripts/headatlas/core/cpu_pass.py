"""The map-free statistics' attention pass on a CPU: ``attention_pass.c``, compiled once per machine, loaded with ctypes.

:func:`attention_pass` computes, in one pass over a layer's scores, the model's output A.V and each row's LSE (what
the fused kernel returns) and the sums a statistic takes over every cell: the row entropy, the smoothed rows'
entropy, value columns (A.m)_i and lower columns sum_{j <= i} A_ij m_j. It is the kernel under
:func:`headatlas.core.mapfree.layer_attention` on a CPU in place of the blocked torch products, which compute
the same on every device (1.7-2.4x its time per layer on a CPU, docs/mapfree.md); tests/unit/core/test_mapfree.py
checks both against an explicit softmax.

Chosen by ``extraction.cpu_pass`` (auto: used where it loads; off: never, every layer takes the blocked
products, the kernel a GPU runs for these sums). The library is built with the
machine's C compiler (``$CC``, else ``cc``, ``gcc`` or ``clang``) at ``-O3 -march=native`` into
``$HEADATLAS_KERNEL_CACHE`` (default ``~/.cache/headatlas``), named by a hash of the source, the flags and the
CPU's instruction sets, so nodes of a cluster with other CPUs build their own; about a second, once. It is
loaded only when (else a warning, once, and the torch path): the folder is this user's own and no other user
can write it or a folder above it (:func:`private_dir`; no fallback folder), the library matches the SHA-256
seal its builder wrote beside it (a damaged, truncated or replaced file is never opened), its argument struct
has the layout of :class:`PassArgs`, and a self-test on small random inputs agrees with an explicit softmax
(:func:`self_test`).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import math
import os
import platform
import shutil
import stat
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("attention_pass.c")
FLAGS = (("-O3", "-march=native"), ("-O3",))  # the second where the compiler does not know -march=native

MODES = ("auto", "off")  # extraction.cpu_pass
NAME = "cpu_pass"  # its name among the kernels of a store's metadata (core.reduce.feed_record)
TOLERANCE = 1e-4  # the self-test's largest difference from an explicit float64 softmax

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


def private_dir(path: Path) -> str | None:
    """Make ``path`` (mode 0700) if it is missing; None when code may be loaded from it, else why not: a real
    folder of this user's that no other user can write, inside folders each owned by this user or root that no
    other user can write (or sticky, as /tmp), so no one else can put a library there or swap the folder."""
    uid = os.getuid()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            return f"{path} is not a folder (a link?)"
        if st.st_uid != uid:
            return f"{path} belongs to user {st.st_uid}, not to this user ({uid})"
        if st.st_mode & 0o022:
            return f"{path} can be written by other users (mode {stat.filemode(st.st_mode)})"
        for parent in path.resolve().parents:
            ps = os.stat(parent)
            if ps.st_uid not in (uid, 0):
                return f"{parent} belongs to user {ps.st_uid}"
            if ps.st_mode & 0o022 and not ps.st_mode & stat.S_ISVTX:
                return f"{parent} can be written by other users (mode {stat.filemode(ps.st_mode)})"
    except OSError as e:
        return f"{path}: {e}"
    return None


def seal_of(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(out: Path, cc: str, extra: tuple = ()) -> str | None:
    """Compile the source into ``out`` and write its seal (:func:`seal_of`: the library's SHA-256) after it,
    each atomically; None, or why it failed. ``extra``: flags after ours (e.g. ``-mno-avx``: a narrower vector)."""
    why = None
    for flags in FLAGS:
        fd, tmp = tempfile.mkstemp(prefix=out.stem, suffix=".so", dir=out.parent)
        os.close(fd)
        cmd = [cc, *flags, *extra, "-shared", "-fPIC", "-o", tmp, str(SOURCE), "-lm"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode == 0:
            digest = _digest(Path(tmp))
            os.replace(tmp, out)
            fd, tmp = tempfile.mkstemp(prefix=out.stem, suffix=".sha256", dir=out.parent)
            with os.fdopen(fd, "w") as f:
                f.write(digest + "\n")
            os.replace(tmp, seal_of(out))
            return None
        os.unlink(tmp)
        why = f"{' '.join(cmd)}: {proc.stderr.strip()[-500:]}"
    return why


_LIB: list = []  # [the loaded library or None] once tried
_LOCK = threading.Lock()


def library():
    """The loaded, checked library (built first if this machine has none yet), or None (said once in the
    log: no compiler, an unsafe cache, a damaged library, a failed self-test)."""
    with _LOCK:
        if not _LIB:
            _LIB.append(_load())
        return _LIB[0]


def _unused(why: str) -> None:
    log.warning("map-free statistics: the CPU attention pass is not used (%s); the torch path computes every "
                "layer instead (core.mapfree.layer_attention)", why)  # fmt: skip


def _load():
    cc = compiler()
    if cc is None:
        return _unused("no C compiler: $CC, cc, gcc or clang")
    folder = cache_dir()
    why = private_dir(folder)
    if why:
        return _unused(f"its cache folder is not private: {why}; set $HEADATLAS_KERNEL_CACHE to a folder of your own")
    digest = hashlib.sha256(SOURCE.read_bytes() + repr((FLAGS, cc, machine_key())).encode()).hexdigest()[:16]
    path = folder / f"attention_pass-{digest}.so"
    if not (path.is_file() and seal_of(path).is_file()):
        try:
            why = build(path, cc)
        except OSError as e:
            why = f"{folder}: {e}"
        if why:
            return _unused(f"it did not build: {why}")
    try:
        st = os.lstat(path)
        sealed = seal_of(path).read_text().strip()
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            return _unused(f"{path} is not a plain file of this user's that only this user can write")
        if _digest(path) != sealed:  # checked before the loader ever maps it
            return _unused(
                f"{path} does not match its seal {seal_of(path).name} (damaged or replaced); delete both to rebuild"
            )
        lib, layout = open_library(path)
    except (OSError, AttributeError, ValueError) as e:
        return _unused(f"{path} does not load ({e}); delete it and its seal to rebuild")
    want = [ctypes.sizeof(PassArgs), *(getattr(PassArgs, f).offset for f in ("scale", "smoothing", "C2", "thread"))]
    if layout[:5] != want:
        return _unused(f"{path}: its argument struct's layout {layout[:5]} is not PassArgs' {want}")
    err = self_test(lib)
    if err > TOLERANCE:
        return _unused(f"{path}: its self-test differs from an explicit softmax by {err:.3g}")
    return lib


def open_library(path: Path):
    """(the library at ``path``, its :func:`pass_args_layout`: struct size, offsets, floats per vector): loaded
    with no check (:func:`_load` checks it first)."""
    lib = ctypes.CDLL(str(path))
    lib.attention_pass.argtypes = [ctypes.POINTER(PassArgs)]
    lib.attention_pass.restype = ctypes.c_int
    layout = (ctypes.c_int64 * 6)()
    lib.pass_args_layout(layout)
    return lib, list(layout)


def self_test(lib) -> float:
    """The largest difference of the library's every output (A.V, LSE, entropy, smoothed entropy, value and
    lower columns) from an explicit float64 softmax, on small random inputs with grouped heads, a
    hidden key and a causal mask."""
    import torch

    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for causal in (False, True):
        bsz, h, hk, n, d = 2, 4, 2, 37, 16
        q, k, v = (torch.randn(bsz, x, n, d, generator=g) for x in (h, hk, hk))
        bias = torch.zeros(bsz, n)
        bias[1, n - 5 :] = -math.inf
        cols, lcols = torch.randn(bsz, n, 2, generator=g), torch.randn(bsz, n, 1, generator=g)
        out, lse, got = attention_pass(q, k, v, bias, causal, 0.25, cols, lcols, True, 0.01, lib=lib)
        s = (
            q.double() @ k.double().repeat_interleave(h // hk, 1).transpose(-1, -2) * 0.25
            + bias.double()[:, None, None]
        )
        if causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        a = torch.softmax(s, -1)
        seen = torch.isfinite(s)
        p = 0.99 * a + 0.01 / seen.sum(-1, keepdim=True)
        want = {
            "entropy": torch.special.entr(a).sum(-1),
            "smoothed_entropy": torch.where(seen, torch.special.entr(p), 0.0).sum(-1),
            "values": a @ cols.double()[:, None],
            "lower": a.tril() @ lcols.double()[:, None],
        }
        pairs = [(out, (a @ v.double().repeat_interleave(h // hk, 1)).transpose(1, 2)), (lse, torch.logsumexp(s, -1))]
        pairs += [(got[key], want[key]) for key in want]
        worst = max(worst, *(float((x.double() - y).abs().max()) for x, y in pairs))
    return worst if worst == worst else math.inf  # NaN: failed


_POOL: list = []  # [(threads, executor)]


def _pool(threads: int) -> ThreadPoolExecutor:
    if not _POOL or _POOL[0][0] != threads:
        if _POOL:
            _POOL.pop()[1].shutdown()
        _POOL.append((threads, ThreadPoolExecutor(threads, thread_name_prefix="headatlas-pass")))
    return _POOL[0][1]


def _ptr(t):
    return None if t is None else ctypes.cast(t.data_ptr(), _F)


def attention_pass(
    q,
    k,
    v,
    keybias,
    causal: bool,
    scale: float,
    cols=None,
    lcols=None,
    entropy=False,
    smoothing=None,
    lib=None,
):
    """(A.v [B, n, H, dv] (the layout a model's attention function returns), LSE [B, H, n], {"values": A.cols
    [B, H, n, C], "lower": sum_{j <= i} A_ij lcols_j [B, H, n, C'], "entropy": [B, H, n],
    "smoothed_entropy": [B, H, n] the entropy of the rows (1 - smoothing) A + smoothing / k_i over each row's k_i
    visible keys}, the asked ones)
    of q [B, H, n, d] and k, v [B, Hkv, n, .] on a CPU (grouped heads not expanded). ``keybias``: [B, n] additive
    (-inf hides a key) or None; ``cols``, ``lcols``: [B, n, C] key columns.
    Float32 (other dtypes are converted; the output comes back in v's dtype); torch's intra-op threads take units of
    64 query rows round-robin."""
    import torch

    lib = library() if lib is None else lib
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
