"""Reducers: per-head statistics computed where the attention is, from stored maps or during the forward pass.

A *reducer* turns one layer's attention of a batch of sequences, a ``[B, H, n, n]`` torch tensor on the
device where it was computed (right-padded to the batch's longest sequence, rows = queries), together with
the batch's token table (:class:`ReduceBatch`), into per-sequence or running results, with torch operations
vectorised over heads and tokens. When every batch has been seen, ``result()`` returns the arrays / tables
the analysis computes today from an :class:`~headatlas.core.store.AttentionStore`.

Padding: in a fused batch, padded KEY columns are exactly 0 but padded QUERY rows are full distributions over
the real tokens; in a replayed batch both are 0. A reducer must mask both: :func:`clean_maps` gives the
layer's maps with every cell outside a real query's visible keys set to 0 (one copy shared by the reducers),
and :meth:`ReduceBatch.masks` the boolean masks; the tests fill padding with garbage to make sure it never
leaks.

The base types (:class:`Reducer`, :class:`ReduceBatch` with its memo, :class:`FeedInfo`, :func:`scratch`,
:func:`clean_maps`) live in :mod:`headatlas.core.reducer` and are importable from here.

Two feeds, one code path (both build :class:`ReduceBatch` es and call
:func:`~headatlas.core.layer_view.feed_layer`, which hands each layer to every reducer as a
:class:`~headatlas.core.layer_view.MapsLayer`; the map-free feed hands them a
:class:`~headatlas.core.mapfree.FreeLayer`, the same view from q, k and LSE):

- :func:`replay` reads a stored store in windows of consecutive sequences that fit a byte budget, buckets
  each window by length, and builds the padded tensor per layer;
- :func:`forward_loop`, the one forward loop of every extraction (:func:`fused_reduce`,
  :func:`headatlas.core.extract.extract`, :func:`bare_forward`), runs the model batch by batch inside a feed:
  :class:`FusedFeed` with forward hooks on its attention modules (the modules transformers itself records
  ``attentions`` from, ``_can_record_outputs``; for a model without them, e.g. MPNet, the architecture
  table's ``attention`` module, asked alone for its probabilities, which the hook strips from its output
  again), without ``output_attentions``: each layer's probabilities go to the reducers as soon as they exist
  and are dropped after, so at most one layer's maps are alive (a reducer that keeps rows of every layer of a
  batch, ``keeps_layers``, holds its own copies of them); or the map-free feed (:mod:`headatlas.core.mapfree`, chosen by :func:`open_feed`). What an
  extraction stores is written by reducers of the same feed (:class:`LayerMaps`, :class:`SampleMaps`,
  :class:`headatlas.core.extract.HeadReps`).

A reducer that fails raises :class:`ReduceError` naming the analysis, reducer, model, corpus and sequences.

Saving and combining (the contract of docs/architecture.md, "Fused reduction"): every reducer has a unique
``name`` (the file stem), the ``analysis`` key it serves, ``params()`` (JSON-able settings that change its
result), ``to_arrays``/``from_arrays`` (its result as named numpy arrays and back) and ``combine`` (the
results of consecutive shards into one). :func:`save_reduced` writes ``<store>/reduced/<name>.h5``,
:func:`load_reduced` reads and combines the shards, and :func:`reduce_corpus` is what an analysis rule
calls: the saved results of a corpus reduced fused (maps ``sample`` or ``none``), else a replay of its
stored maps.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from .batching import length_batches, model_inputs, no_cache, storage_windows
from .data import Record, TokenizedRecord
from .figures import head_label
from .integrity import IntegrityError, check_values
from .io import atomic_path, compressed
from .layer_view import feed_layer
from .mapfree import MapFreeFeed, longest_of, plan_feed
from .models import ARCHITECTURES, ModelError, architecture_module
from .progress import progress
from .reducer import (
    FeedInfo,
    ReduceBatch,
    ReduceError,
    Reducer,
    feed_outputs,
    release_scratch,
    stop_all,
)
from .store import NESTED, AttentionStore, map_faults, reduced_problem

log = logging.getLogger("headatlas.core.reduce")

REDUCED_DIR = "reduced"  # <store>/reduced/<reducer name>.h5: the results of a fused corpus


def reducer_from_spec(spec: dict, registry: dict[str, str] | None = None) -> Reducer:
    """The reducer a :meth:`Reducer.spec` describes; ``registry`` maps registered names to ``module:Class``
    (``headatlas.fused.REDUCERS``). A spec of an older run names its class by ``class`` (module:qualname)."""
    if "reducer" in spec:
        if registry is None or spec["reducer"] not in registry:
            known = sorted(registry or ())
            raise ReduceError(f"reducer {spec['reducer']!r} is not registered (known: {known})")
        path = registry[spec["reducer"]]
    else:
        path = spec["class"]
    module, _, qualname = path.partition(":")
    cls = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    r = cls.from_params(spec["params"])
    r.name = spec.get("name", r.name)  # its analysis: the class attribute
    return r


def padded(blocks: Sequence[np.ndarray], n: int | None = None):
    """[B, H, n, n] float32 torch tensor (CPU) from per-sequence [H, n_b, n_b] blocks, zero-padded."""
    import torch

    n = max(b.shape[-1] for b in blocks) if n is None else n
    out = torch.zeros((len(blocks), blocks[0].shape[0], n, n), dtype=torch.float32)
    for b, block in enumerate(blocks):  # one copy per sequence: the stored layout is ragged
        m = block.shape[-1]
        out[b, :, :m, :m] = torch.from_numpy(np.ascontiguousarray(block, dtype=np.float32))
    return out


def replay(
    store,
    reducers: Sequence[Reducer],
    batch_size: int = 32,
    records: Sequence[Record] | None = None,
    device: str = "cpu",
    budget_bytes: int = 256 << 20,
    corpus: str = "",
) -> list:
    """Run ``reducers`` over every sequence of an :class:`~headatlas.core.store.AttentionStore`.

    Windows of consecutive sequences whose maps (all layers if a reducer keeps every layer, else one layer) fit
    ``budget_bytes`` are read one layer at a time, bucketed by length into batches of ``batch_size`` and
    padded. Returns ``[r.result() for r in reducers]``.
    """
    import torch

    all_layers = any(r.keeps_layers for r in reducers)
    info = FeedInfo(
        len(store),
        store.n_layers,
        store.n_heads,
        store.meta.get("model", ""),
        store.meta.get("model_kind", "encoder"),
        corpus or store.meta.get("corpus", ""),
        store.record_id,
    )
    for r in reducers:
        r.start(info)
    per_cell = 4 * store.n_heads * (store.n_layers if all_layers else 1)
    windows = storage_windows(store.lengths, per_cell, budget_bytes)
    what = f"replay {','.join(r.name for r in reducers)} on {info.model or '?'}/{info.corpus or '?'}"
    for start, stop in progress(windows, what, len(store), "sequences", weight=lambda w: w[1] - w[0]):
        local = length_batches(store.lengths[start:stop], batch_size)
        batches = [ReduceBatch.from_store(store, start + pos, records) for pos in local]
        if not any(r.wants(b) for r in reducers for b in batches):
            continue  # e.g. JS distances past their first sequences: no read at all
        for layer in range(store.n_layers):
            maps = store.layer_maps(layer, start, stop)
            for pos, batch in zip(local, batches):
                attn = padded([maps[p] for p in pos]).to(device)
                feed_layer(reducers, info, layer, attn, batch)
            del maps
        if device != "cpu" and torch.cuda.is_available():
            torch.cuda.synchronize()
    release_scratch()
    return [r.result() for r in reducers]


def attention_modules(model, n_layers: int, name: str = "") -> list[tuple[object, int, bool]]:
    """(module, index of the attention probabilities in its output tuple, asked) per layer: the modules
    transformers itself records ``attentions`` from (the model's ``_can_record_outputs['attentions']``,
    matched as transformers does), else the architecture table's ``attention`` modules (MPNet), which return
    the probabilities only when called with ``output_attentions=True``: ``asked`` is True for those, and
    :class:`FusedFeed` asks each of them alone and strips the probabilities from its output."""
    from transformers.utils.output_capturing import OutputRecorder

    specs = getattr(model, "_can_record_outputs", None) or {}
    spec = specs.get("attentions")
    if spec is None:
        arch = ARCHITECTURES.get(getattr(model.config, "model_type", ""))
        if arch is None or arch.attention is None:
            raise ModelError(
                f"model {name!r} ({type(model).__name__}) declares no attention modules (_can_record_outputs) and its "
                "architecture names none (core.models.ARCHITECTURES, attention); it cannot be reduced fused"
            )
        found = [architecture_module(model, arch.attention.format(layer=i)) for i in range(n_layers)]
        if any(m is None for m in found):
            raise ModelError(
                f"model {name!r}: no module {arch.attention!r} for every layer; it cannot be reduced fused"
            )
        return [(m, 1, True) for m in found]
    specs = spec if isinstance(spec, list) else [spec]
    specs = [
        s
        if isinstance(s, OutputRecorder)
        else OutputRecorder(
            target_class=None if isinstance(s, str) else s, index=1, class_name=s if isinstance(s, str) else None
        )
        for s in specs
    ]
    found = []
    for mod_name, module in model.named_modules():
        for s in specs:
            hit = (s.target_class is not None and isinstance(module, s.target_class)) or (
                s.class_name is not None and mod_name.endswith(s.class_name)
            )
            if hit and (s.layer_name is None or "." + s.layer_name.strip(".") + "." in "." + mod_name + "."):
                found.append((module, s.index, False))
                break
    if len(found) != n_layers:
        raise ModelError(
            f"model {name!r}: found {len(found)} attention modules, expected one per layer ({n_layers}); it cannot be reduced fused"
        )
    return found


def check_attentions(attentions, n_layers: int, n_heads: int, model_name: str) -> None:
    if not attentions:
        raise ModelError(
            f"model {model_name!r} returned no attention probabilities; it must be loaded with "
            "attn_implementation='eager' and support output_attentions"
        )
    if len(attentions) != n_layers:
        raise ModelError(f"model {model_name!r} returned attention for {len(attentions)} layers, expected {n_layers}")
    for layer, a in enumerate(attentions):
        if a is None or a.dim() != 4 or a.shape[1] != n_heads:
            shape = None if a is None else tuple(a.shape)
            raise ModelError(
                f"model {model_name!r}: layer {layer + 1} attention has shape {shape}, expected [batch, {n_heads}, n, n]"
            )


class FusedFeed:
    """Each layer's attention probabilities handed to ``reducers`` (a context manager; :func:`fused_reduce` and
    extraction use it). ``source`` ``hooks``: forward hooks on the model's attention modules hand each layer's maps
    over as soon as they exist and keep no reference to them, so a layer's maps are freed before the next layer runs
    ``outputs``: the maps come from the model's output (``output_attentions``: every layer of the batch alive at
    once) after the forward pass, for every type that returns them (also those whose attention modules cannot be
    hooked: ALBERT's shared layers, DeBERTa); the stored maps of ``maps: full`` come this way, as they always did.
    No reducer that needs maps (``needs_maps``): no hook and no ``output_attentions``.

    Around every forward pass call :meth:`begin` with its :class:`ReduceBatch`, run the model with
    :attr:`forward_kwargs`, and call :meth:`end` with its output (:func:`forward_loop` does)."""

    def __init__(self, model, reducers: Sequence[Reducer], info: FeedInfo, source: str = "hooks"):
        if source not in ("hooks", "outputs"):
            raise ValueError(f"FusedFeed source must be hooks or outputs, not {source!r}")
        self.model, self.reducers, self.info, self.source = model, list(reducers), info, source
        self.batch = None
        self.hooks: list = []
        self.stripped: dict[int, bool] = {}  # layer -> its probabilities were asked for by the feed alone
        maps = any(r.needs_maps for r in self.reducers)
        self.from_outputs = maps and source == "outputs"
        self.forward_kwargs = {"output_attentions": True} if self.from_outputs else {}
        if any(r.needs_outputs for r in self.reducers):
            self.forward_kwargs["output_hidden_states"] = True

    def __enter__(self):
        info, n_heads = self.info, self.info.n_heads
        maps = any(r.needs_maps for r in self.reducers)
        found = attention_modules(self.model, info.n_layers, info.model) if maps and self.source == "hooks" else []
        for r in self.reducers:
            r.start(info)

        def make_hook(layer: int, index: int, asked: bool):
            def hook(module, args, output):
                if self.batch is None:
                    return
                strip = asked and self.stripped.pop(layer, False)
                attn = output[index] if isinstance(output, (tuple, list)) else output
                if attn is None or attn.dim() != 4 or attn.shape[1] != n_heads:
                    shape = None if attn is None else tuple(attn.shape)
                    raise ModelError(
                        f"model {info.model!r}: layer {layer + 1} attention has shape {shape}, expected [batch, {n_heads}, n, n]; load it with attn_implementation='eager'"
                    )
                self._layer(layer, attn)
                if strip:  # the caller did not ask for them: its output as without output_attentions
                    return output[:index] + output[index + 1 :]

            return hook

        def make_ask(layer: int):
            def ask(module, args, kwargs):  # this module alone returns its probabilities
                if self.batch is None or kwargs.get("output_attentions"):
                    return None
                self.stripped[layer] = True
                return args, {**kwargs, "output_attentions": True}

            return ask

        self.hooks = []
        for i, (m, idx, asked) in enumerate(found):
            if asked:
                self.hooks.append(m.register_forward_pre_hook(make_ask(i), with_kwargs=True))
            self.hooks.append(m.register_forward_hook(make_hook(i, idx, asked)))
        return self

    def _layer(self, layer: int, attn) -> None:
        n = self.batch.n
        a = attn if attn.shape[-1] == n else attn[:, :, :n, :n]  # an extra position is not part of the sequences
        feed_layer(self.reducers, self.info, layer, a, self.batch)

    def begin(self, batch: ReduceBatch) -> None:
        self.batch = batch

    def end(self, outputs=None) -> None:
        """After the batch's forward pass; ``outputs``: the model's output (run with :attr:`forward_kwargs`)."""
        if self.from_outputs:
            check_attentions(outputs.attentions, self.info.n_layers, self.info.n_heads, self.info.model)
            for layer, attn in enumerate(outputs.attentions):
                self._layer(layer, attn)
        feed_outputs(self.reducers, self.info, outputs, self.batch)
        self.batch = None

    def results(self) -> list:
        return [r.result() for r in self.reducers]

    def __exit__(self, *exc):
        for h in self.hooks:
            h.remove()
        self.hooks, self.batch = [], None
        stop_all(self.reducers)
        release_scratch()
        return False


class SampleMaps(Reducer):
    """Not a statistic: writes the maps of the chosen sequences (positions in the feed) to an
    :class:`~headatlas.core.store.AttentionWriter` (the ``sample/`` store of a fused extraction), each
    checked as the store path checks maps at the source (finite, rows summing to 1 within ``tol``)."""

    name = "sample_maps"

    def __init__(self, positions, writer, tol: float):
        self.local = {int(k): i for i, k in enumerate(positions)}
        self.writer, self.tol = writer, tol

    def update(self, layer: int, view, batch: ReduceBatch) -> None:
        """The kept sequences' maps (:meth:`~headatlas.core.layer_view.LayerView.rows`), each row divided by its
        sum: with scores near 1e4 (Qwen2.5-1.5B's biased q and k), exp(s - LSE) in float32 lost 1.6e-3 of a
        row's mass to cancellation; the divided rows are the softmax of the float32 scores (maps: within
        rounding of what came)."""
        for b, i in self._kept(batch):
            n = int(batch.lengths[b])
            rows = view.rows(0, n, [b])[0, :, :, :n]
            self._write(layer, b, i, (rows / rows.sum(-1, keepdim=True)).cpu().numpy(), batch)

    def _kept(self, batch: ReduceBatch):
        """(batch index, sample index) of the batch's kept sequences."""
        return [(b, self.local[k]) for b, k in enumerate(batch.seq.tolist()) if k in self.local]

    def _write(self, layer: int, b: int, i: int, block: np.ndarray, batch: ReduceBatch) -> None:
        k, n = int(batch.seq[b]), block.shape[-1]
        for head, _, q, what in map_faults(block.reshape(block.shape[0], n * n), np.array([n]), self.tol):
            rid = k if self.info.record_id is None else self.info.record_id[k]
            raise ModelError(
                f"model {self.info.model!r}: head {head_label(layer, head)}, record {rid}, query row {q}: attention {what}"
            )
        self.writer.write(i, layer, block)

    def result(self):
        return None


class LayerMaps(Reducer):
    """Not a statistic: hands every layer's [B, H, n, n] maps of every batch to ``sink(layer, attn, batch)``
    (the stored maps of an extraction, the maps of a figure). ``attn`` is the feed's tensor: copy what is kept."""

    name = "layer_maps"
    full_rows = "keeps every map"

    def __init__(self, sink):
        self.sink = sink

    def update(self, layer: int, view, batch: ReduceBatch) -> None:
        self.sink(layer, view.maps, batch)

    def result(self):
        return None


def open_feed(
    model, reducers: Sequence[Reducer], info: FeedInfo, longest: int = 0, path: str = "auto", cpu_pass: str = "auto"
):
    """The feed :func:`~headatlas.core.mapfree.plan_feed` picks (:class:`FusedFeed` or
    :class:`~headatlas.core.mapfree.MapFreeFeed`, with the CPU attention pass ``cpu_pass``: auto | off), as a
    context manager; the choice and its reason go to the log once (and to :func:`feed_record`)."""
    kind, why = plan_feed(model, reducers, longest, path)
    log.info("model %s, corpus %s: %s attention (%s)", info.model or "?", info.corpus or "?", kind, why)
    feed = MapFreeFeed(model, reducers, info, cpu_pass) if kind == "mapfree" else FusedFeed(model, reducers, info)
    feed.why = why
    return feed


def feed_record(feed) -> dict:
    """What computed a feed's statistics, for the store's metadata: the path (eager | mapfree), why, and the
    kernels that ran (:data:`~headatlas.core.mapfree.kernel_order`'s names, ``triton_pass``, ``cpu_pass``,
    ``blocked``)."""
    free = isinstance(feed, MapFreeFeed)
    return {
        "path": "mapfree" if free else "eager",
        "why": getattr(feed, "why", None),
        "kernels": sorted(feed.kernels) if free else ["eager"],
    }


def forward_loop(
    model,
    tokenized: Sequence[TokenizedRecord],
    batches,
    feed=None,
    records: Sequence[Record] | None = None,
    pad_id: int = 0,
    extra_token: int | None = None,
):
    """The one forward loop of every extraction: for each batch of positions in ``tokenized`` (an iterable of
    index arrays), the open ``feed`` gets its :class:`ReduceBatch` (``records``: the corpus, indexed by record
    index), the model runs on the right-padded inputs (``extra_token``: one more real token after each
    sequence, :func:`~headatlas.core.batching.model_inputs`) and the feed ends the batch with the model's
    output. Yields each batch's positions once its reducers have seen it; ``feed`` None: the bare forward pass."""
    import torch

    with torch.inference_mode():
        for pos in batches:
            inputs = model_inputs([tokenized[p] for p in pos], model, pad_id, extra_token=extra_token)
            if feed is None:
                model(**inputs, **no_cache(model))
            else:
                feed.begin(ReduceBatch.from_tokenized(tokenized, pos, records))
                feed.end(model(**inputs, **no_cache(model), **feed.forward_kwargs))
            yield pos


def fused_reduce(
    model,
    tokenized: Sequence[TokenizedRecord],
    reducers: Sequence[Reducer],
    batch_size: int,
    model_kind: str = "encoder",
    records: Sequence[Record] | None = None,
    pad_id: int = 0,
    name: str = "",
    corpus: str = "",
    record_id: Sequence[str] | None = None,
    first_index: int = 0,
    path: str = "auto",
    cpu_pass: str = "auto",
) -> list:
    """Run ``model`` (loaded by :func:`headatlas.core.models.load`: eager attention, eval mode) over
    ``tokenized`` in length-bucketed batches (:func:`forward_loop`) and reduce each layer's attention as soon as
    it is computed (:class:`FusedFeed`, or without maps by :class:`~headatlas.core.mapfree.MapFreeFeed` when
    ``path`` is ``auto`` and every reducer has a map-free form, :func:`~headatlas.core.mapfree.plan_feed`).
    Returns ``[r.result() for r in reducers]``.
    """
    n_layers, n_heads = int(model.config.num_hidden_layers), int(model.config.num_attention_heads)
    rid = None if record_id is None else np.asarray(record_id)
    info = FeedInfo(len(tokenized), n_layers, n_heads, name, model_kind, corpus, rid, first_index)
    batches = length_batches([len(t) for t in tokenized], batch_size)
    with open_feed(model, reducers, info, longest_of(tokenized), path, cpu_pass) as feed:
        for _ in forward_loop(model, tokenized, batches, feed, records, pad_id):
            pass
        return feed.results()


def bare_forward(model, tokenized: Sequence[TokenizedRecord], batch_size: int, pad_id: int = 0) -> float:
    """Seconds of the bare forward pass over the same length-bucketed batches (the benchmarks' baseline)."""
    import torch

    t0 = time.perf_counter()
    for _ in forward_loop(
        model, tokenized, length_batches([len(t) for t in tokenized], batch_size), None, None, pad_id
    ):
        pass
    if next(model.parameters()).device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


# --- saved results of a fused corpus ---------------------------------------------------------------------------


def reduced_file(store_dir: str | Path, reducer: Reducer) -> Path:
    return Path(store_dir) / REDUCED_DIR / f"{reducer.name}.h5"


def save_reduced(store_dir: str | Path, reducer: Reducer, result, meta: dict | None = None) -> Path:
    """Write ``result`` as ``<store_dir>/reduced/<name>.h5`` atomically: one dataset per array of
    ``reducer.to_arrays(result)`` (large float arrays :func:`~headatlas.core.io.compressed`), the reducer's params, analysis and
    class in the attributes."""
    import h5py

    path = reduced_file(store_dir, reducer)
    arrays = reducer.to_arrays(result)
    with atomic_path(path, sealed=False) as tmp, h5py.File(tmp, "w") as f:  # sealed by the store's manifest
        for key, value in arrays.items():
            a = np.asarray(value)
            if a.dtype.kind in "OUS":
                f.create_dataset(key, data=a.astype(str).astype(object), dtype=h5py.string_dtype("utf-8"))
            elif a.dtype.kind in "biuf":
                f.create_dataset(key, data=a, **compressed(a.shape, a.dtype))
            else:
                raise TypeError(f"reducer {reducer.name}: array {key} has dtype {a.dtype}; numeric, bool or str only")
            f[key].attrs["kind"] = a.dtype.kind
        f.attrs["params"] = json.dumps(reducer.params(), sort_keys=True)
        f.attrs["spec"] = json.dumps(reducer.spec(), sort_keys=True)
        f.attrs["meta"] = json.dumps(meta or {}, sort_keys=True, default=str)
    return path


def _read_reduced(path: Path, reducer: Reducer) -> dict:
    import h5py

    where = f"analysis {reducer.analysis}, " if reducer.analysis else ""
    rerun = "rerun the extraction of that corpus (delete the directory and rerun snakemake)"
    if not path.is_file():
        raise ReduceError(
            f"{path}: missing: the corpus was not reduced fused with reducer {reducer.name} ({where.rstrip(', ') or 'no analysis'}); {rerun}"
        )
    problem = reduced_problem(path)  # its sha256 in the store's manifest
    if problem:
        raise ReduceError(f"{where}{problem}")
    try:
        with h5py.File(path, "r") as f:
            stored = json.loads(f.attrs["params"])
            arrays = {k: (f[k].asstr()[()] if f[k].attrs.get("kind") in ("O", "U", "S") else f[k][()]) for k in f}
    except Exception as e:
        raise ReduceError(f"{path}: cannot read the reduced result ({type(e).__name__}: {e}); {rerun}") from None
    try:
        check_values(path, arrays)
    except IntegrityError as e:
        raise ReduceError(str(e)) from None
    want = json.loads(json.dumps(reducer.params(), sort_keys=True))
    if stored != want:
        diff = sorted(k for k in set(stored) | set(want) if stored.get(k) != want.get(k))
        raise ReduceError(
            f"{path}: {where}reducer {reducer.name} was computed with {', '.join(f'{k}={stored.get(k)!r}' for k in diff)}, "
            f"the config now says {', '.join(f'{k}={want.get(k)!r}' for k in diff)}; {rerun}"
        )
    return {k: (np.asarray(v, dtype=object).astype(str) if isinstance(v, np.ndarray) and v.dtype == object else v)
            for k, v in arrays.items()}  # fmt: skip


def load_reduced(store_dirs: str | Path | Sequence[str | Path], reducer: Reducer):
    """The saved results of ``reducer`` in every shard of a fused corpus, combined in shard order;
    a result computed with other params is an error that says to rerun the extraction."""
    dirs = [store_dirs] if isinstance(store_dirs, (str, Path)) else list(store_dirs)
    parts = [reducer.from_arrays(_read_reduced(reduced_file(d, reducer), reducer)) for d in dirs]
    try:
        return reducer.combine(parts)
    except ReduceError:
        raise
    except Exception as e:
        raise ReduceError(f"reducer {reducer.name}: cannot combine the shards {[str(d) for d in dirs]}: {e}") from e


def map_mode(meta: dict) -> str:
    """full | sample | none: what a store's extraction kept of the maps (an older store records maps as a bool: true = full)."""
    mode = meta.get("maps_mode")
    if mode is None:
        return "full" if meta.get("maps", True) else "none"
    return mode


def map_dirs(store_dirs: str | Path | Sequence[str | Path], what: str = "this figure") -> list[Path]:
    """The store directories whose maps a figure or example reads: the shards themselves when the corpus
    kept every map, their ``sample/`` stores when it kept a sample; a corpus with ``maps: none`` is an error."""
    dirs = [Path(store_dirs)] if isinstance(store_dirs, (str, Path)) else [Path(d) for d in store_dirs]
    with AttentionStore(dirs) as store:
        mode = map_mode(store.meta)
    if mode == "full":
        return dirs
    if mode == "sample":
        return [d / NESTED[1] for d in dirs]
    raise ReduceError(
        f"{dirs[0]}: corpus {store.meta.get('corpus', '?')} was extracted with maps: none; {what} needs maps: "
        "set maps: sample (or full) for it in the config"
    )


def reduce_corpus(
    store_dirs: str | Path | Sequence[str | Path],
    reducer: Reducer,
    records: Sequence[Record] | None = None,
    batch_size: int = 32,
    device: str = "cpu",
    budget_bytes: int = 256 << 20,
):
    """What an analysis rule calls for one (model, corpus): the saved result when the corpus was reduced fused
    (its maps are ``sample`` or ``none``: :func:`load_reduced`), else a :func:`replay` of its stored maps."""
    with AttentionStore(store_dirs) as store:
        if map_mode(store.meta) != "full":
            return load_reduced(store.dirs, reducer)
        return replay(store, [reducer], batch_size, records, device, budget_bytes)[0]
