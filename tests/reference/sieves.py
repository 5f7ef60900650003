"""Pande's sieve scores on stored maps (the reference of :class:`headatlas.pande.reducers.SieveReducer`).

The sieves of a run of sequences are built once (cell indices, cell masks, counts) and each layer's flat
cells (the store's layout, sequences' n x n maps row after row) are scored with gathers and
``np.add.reduceat``; there is no Python loop over cells, rows or heads.
"""

from __future__ import annotations

import numpy as np

from headatlas.core.data import SPECIAL_NONE, Record
from headatlas.core.progress import progress
from headatlas.pande.roles import Band, Block, Keys, role_names, token_roles
from headatlas.pande.sieves import SieveSettings, blas_threads, dependency_pairs, query_segment, role_notes


class SievePlan:
    """Everything about a run of sequences that does not depend on the layer: where each row
    starts in the flat cells, each role's sieve as cell indices or a cell mask, the counts
    |S_i|, and the dependency pairs' query rows and key cells.

    Cells are the sequences' n x n maps concatenated row by row (the store's layout): cell
    ``row_start[t] + j`` is query token t (global over the run) attending to key j of its
    sequence.
    """

    def __init__(self, lengths, special, segment, word, pairs, settings: SieveSettings, causal: bool):
        self.settings = settings
        self.causal = causal
        n = np.asarray(lengths, dtype=np.int64)
        special = np.asarray(special)
        segment = np.asarray(segment)
        word = np.asarray(word)
        self.n_seq = len(n)
        self.tok_off = np.concatenate([[0], np.cumsum(n)])
        cell_off = np.concatenate([[0], np.cumsum(n * n)])
        self.n_cells = int(cell_off[-1])
        t_all = int(self.tok_off[-1])
        seq = np.repeat(np.arange(self.n_seq), n)
        pos = np.arange(t_all) - self.tok_off[seq]
        n_row = n[seq]
        self.row_start = cell_off[seq] + pos * n_row
        self.k = (pos + 1 if causal else n_row).astype(np.float64)  # keys each row may attend to
        content = special == SPECIAL_NONE
        second = (content & (segment == 1)).astype(np.int64)
        self.is_pair = np.add.reduceat(second, self.tok_off[:-1]) > 0 if t_all else np.zeros(0, bool)

        def columns(mask):
            """[T, m] cells of each row's keys where ``mask`` holds in its sequence, visible."""
            toks = np.flatnonzero(mask)
            if not len(toks):
                return np.zeros((t_all, 0), np.int64), np.zeros((t_all, 0), np.float32)
            s = seq[toks]
            counts = np.bincount(s, minlength=self.n_seq)
            rank = np.arange(len(toks)) - np.concatenate([[0], np.cumsum(counts)])[s]
            cols = np.full((self.n_seq, counts.max()), -1)
            cols[s, rank] = pos[toks]
            c = cols[seq]
            ok = c >= 0
            if causal:
                ok &= c <= pos[:, None]
            return self.row_start[:, None] + np.where(ok, c, 0), ok.astype(np.float32)

        # the token roles of the registry by the kind of their sieve: [T, m] cells of each row's sieve keys (a band;
        # special keys, one part per group of kinds) or a cell mask (the block)
        self.token = token_roles()
        self.cells: dict[str, list] = {}
        cnt = {}
        for name, role in self.token.items():
            sieve = role.sieve
            if isinstance(sieve, Band):  # offsets j - i inside the sequence (cut to j <= i under a causal mask)
                offs = np.asarray(sieve.keys(settings.window, causal), dtype=np.int64)
                j = pos[:, None] + offs[None, :]
                ok = (j >= 0) & (j < n_row[:, None])
                self.cells[name] = [(self.row_start[:, None] + np.where(ok, j, 0), ok.astype(np.float32))]
            elif isinstance(sieve, Keys):
                self.cells[name] = [columns(np.isin(special, g)) for g in sieve.groups]
            if name in self.cells:
                cnt[name] = sum(w.sum(1) for _, w in self.cells[name])
        self.block = next((name for name, r in self.token.items() if isinstance(r.sieve, Block)), None)

        # block: cells whose key is a content token of the query's segment, pair sequences only
        self.block_mask = None
        block_cnt = np.zeros(t_all)
        if self.block is not None and self.is_pair.any():
            qseg = query_segment(special, segment, self.tok_off[:-1])
            cell_row = np.repeat(np.arange(t_all), n_row)
            col = np.arange(self.n_cells) - self.row_start[cell_row]
            col_tok = self.tok_off[seq[cell_row]] + col
            mask = content[col_tok] & (segment[col_tok] == qseg[cell_row]) & self.is_pair[seq[cell_row]]
            if causal:
                mask &= col <= pos[cell_row]
            self.block_mask = mask.astype(np.float32)
            block_cnt = np.add.reduceat(self.block_mask, self.row_start) if t_all else block_cnt

        if self.block is not None:
            cnt[self.block] = block_cnt
        self.cnt = np.stack([cnt[name] for name in self.token]).astype(np.float64)  # [R, T]
        self.use = self.cnt > 0
        self.use_count = (
            np.add.reduceat(self.use.astype(np.float64), self.tok_off[:-1], axis=1)
            if t_all
            else np.zeros((len(self.token), 0))
        )

        # syntactic: one group per (pair, query piece that sees a key piece)
        n_rel = len(settings.relations)
        directions = {"dep_to_head": [(0, 1)], "head_to_dep": [(1, 0)], "both": [(0, 1), (1, 0)]}[settings.direction]
        pair_seq, pair_rel = [], []
        parts = [{"idx": [], "w": [], "row": [], "cnt": [], "pair": []} for _ in directions]
        n_pairs = 0
        for s in range(self.n_seq):
            dep, head, rel = pairs[s]
            if not len(dep):
                continue
            a, b = self.tok_off[s], self.tok_off[s + 1]
            ws = np.where(content[a:b], word[a:b], -1)
            ends = (np.asarray(dep), np.asarray(head))
            for d, (qi, ki) in enumerate(directions):
                q = ws[None, :] == ends[qi][:, None]  # [P, n] query pieces
                kmask = ws[None, :] == ends[ki][:, None]  # [P, n] key pieces
                kcount = (
                    np.cumsum(kmask, axis=1) if causal else np.broadcast_to(kmask.sum(1, keepdims=True), kmask.shape)
                )
                p_idx, rows = np.nonzero(q & (kcount > 0))
                kp_pair, kp_col = np.nonzero(kmask)  # key pieces, sorted by pair
                per = np.bincount(kp_pair, minlength=len(kmask))
                kp = np.full((len(kmask), max(1, per.max(initial=0))), -1)
                kp[kp_pair, np.arange(len(kp_pair)) - np.concatenate([[0], np.cumsum(per)[:-1]])[kp_pair]] = kp_col
                cells = kp[p_idx]  # [G, width] key positions
                wok = cells >= 0
                if causal:
                    wok &= cells <= rows[:, None]
                parts[d]["idx"].append(self.row_start[a + rows][:, None] + np.where(wok, cells, 0))
                parts[d]["w"].append(wok.astype(np.float32))
                parts[d]["row"].append(a + rows)
                parts[d]["cnt"].append(kcount[p_idx, rows])
                parts[d]["pair"].append(n_pairs + p_idx)
            pair_seq.append(np.full(len(dep), s))
            pair_rel.append(np.asarray(rel))
            n_pairs += len(dep)
        self.n_pairs = n_pairs
        self.pair_seq = np.concatenate(pair_seq) if pair_seq else np.zeros(0, np.int64)
        self.pair_rel = np.concatenate(pair_rel) if pair_rel else np.zeros(0, np.int64)
        self.groups = []
        for part in parts:
            if not n_pairs:
                break
            pair = np.concatenate(part["pair"])
            has = np.bincount(pair, minlength=n_pairs)  # query pieces of each pair
            self.groups.append(
                {
                    "idx": _stack_ragged(part["idx"], 0),
                    "w": _stack_ragged(part["w"], 0.0),
                    "row": np.concatenate(part["row"]),
                    "cnt": np.concatenate(part["cnt"]).astype(np.float64),
                    "start": np.concatenate([[0], np.cumsum(has)[:-1]]),
                    "size": has,
                }
            )
        # pairs scored in some direction, grouped by (sequence, relation) and by sequence
        live = np.zeros(n_pairs, bool)
        for g in self.groups:
            live |= g["size"] > 0
        self.live = live
        key = self.pair_seq * max(n_rel, 1) + self.pair_rel
        self.order = np.argsort(np.where(live, key, -1), kind="stable")[np.count_nonzero(~live) :]
        k_sorted = key[self.order]
        self.rel_keys, self.rel_start, self.rel_size = np.unique(k_sorted, return_index=True, return_counts=True)
        self.seq_keys, self.seq_start, self.seq_size = np.unique(
            self.pair_seq[self.order], return_index=True, return_counts=True
        )
        counts = np.zeros((self.n_seq, n_rel + 1), dtype=np.int64)
        np.add.at(counts, (self.pair_seq[live], self.pair_rel[live]), 1)
        counts[:, n_rel] = counts[:, :n_rel].sum(1)
        self.pair_counts = counts

    def scores(self, flat: np.ndarray, rowsum: np.ndarray | None = None) -> np.ndarray:
        """Sentence scores [heads, sequences, roles] from one layer's flat cells [heads, cells]."""
        h = flat.shape[0]
        n_rel = len(self.settings.relations)
        n_tok = len(self.token)
        out = np.full((h, self.n_seq, n_tok + 1 + n_rel), np.nan)
        if not self.n_seq:
            return out
        rowsum = (np.add.reduceat(flat, self.row_start, axis=1) if rowsum is None else rowsum).astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            scale = np.where(rowsum > 0, self.k / rowsum, np.nan)  # 1 / uniform share
        mass = np.zeros((h, n_tok, len(self.k)))
        for r, name in enumerate(self.token):
            if name in self.cells:  # a band or special keys: the sum over its parts' cells
                mass[:, r] = sum((flat[:, idx] * w).sum(-1) for idx, w in self.cells[name])
            elif self.block_mask is not None:
                mass[:, r] = np.add.reduceat(flat * self.block_mask, self.row_start, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            b = mass / np.maximum(self.cnt, 1) * scale[:, None, :]
        if self.block_mask is not None and self.settings.block_entropy:
            xlogx = np.add.reduceat(flat * np.log(np.maximum(flat, np.finfo(np.float32).tiny)), self.row_start, axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                entropy = np.log(rowsum) - xlogx / rowsum  # of the row renormalised, in nats
            b[:, list(self.token).index(self.block)] *= entropy
        total = np.add.reduceat(np.where(self.use, b, 0.0), self.tok_off[:-1], axis=2)  # [H, R, N]
        with np.errstate(invalid="ignore", divide="ignore"):
            out[:, :, :n_tok] = np.where(self.use_count > 0, total / self.use_count, np.nan).transpose(0, 2, 1)
        if not self.groups or not self.live.any():
            return out
        pair_scores = []
        for g in self.groups:
            m = (flat[:, g["idx"]] * g["w"]).sum(-1) / g["cnt"] * scale[:, g["row"]]  # [H, G]
            ps = np.full((h, self.n_pairs), np.nan)
            has = g["size"] > 0
            if has.any():
                ps[:, has] = np.add.reduceat(m, g["start"][has], axis=1) / g["size"][has]
            pair_scores.append(ps)
        ps = pair_scores[0] if len(pair_scores) == 1 else _nanmean2(*pair_scores)
        ps = ps[:, self.order]
        rel_mean = np.add.reduceat(ps, self.rel_start, axis=1) / self.rel_size
        seq_of, rel_of = np.divmod(self.rel_keys, max(n_rel, 1))
        out[:, seq_of, n_tok + 1 + rel_of] = rel_mean
        out[:, self.seq_keys, n_tok] = np.add.reduceat(ps, self.seq_start, axis=1) / self.seq_size
        return out


def _stack_ragged(arrays: list[np.ndarray], fill) -> np.ndarray:
    """Stack 2-D arrays of equal row count per array but different widths, padding with ``fill``."""
    width = max(x.shape[1] for x in arrays)
    out = np.full((sum(len(x) for x in arrays), width), fill, dtype=arrays[0].dtype)
    row = 0
    for x in arrays:
        out[row : row + len(x), : x.shape[1]] = x
        row += len(x)
    return out


def _nanmean2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = (~np.isnan(a)).astype(np.float64) + ~np.isnan(b)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, (np.nan_to_num(a) + np.nan_to_num(b)) / n, np.nan)


def sequence_scores(
    maps: np.ndarray,
    special: np.ndarray,
    segment: np.ndarray,
    word: np.ndarray,
    pairs: tuple[np.ndarray, np.ndarray, np.ndarray],
    settings: SieveSettings,
    causal: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Sentence scores of one sequence.

    ``maps`` [M, n, n] (any number M of heads), token arrays of length n, ``pairs`` from
    :func:`dependency_pairs`. Returns (scores [M, len(role_names)], NaN where a role has no
    query or pair in this sequence; pair counts [n_relations + 1] (per relation, then the
    union) of the pairs that entered the scores).
    """
    maps = np.asarray(maps)
    m, n, _ = maps.shape
    plan = SievePlan([n], special, segment, word, [pairs], settings, causal)
    return plan.scores(maps.reshape(m, n * n))[:, 0], plan.pair_counts[0]


def score_store(
    store, records: list[Record], settings: SieveSettings, max_bytes: int = 256 << 20, threads: int = 1
) -> dict:
    """Sentence scores of every stored sequence for every layer, head and role.

    ``records`` are the corpus records (with ``head``/``deprel`` from gold trees or a parse),
    indexed by the store's ``record_index``. Sequences are processed in runs of at most
    ``max_bytes`` of one layer's maps; per run the sieves are built once and each layer is
    scored with gathers and ``np.add.reduceat`` over the flat cells. Returns a dict with
    ``scores`` [N, L, H, R] (float32, NaN where a role has no query or pair in a sequence),
    ``pair_counts`` [N, n_relations + 1] (pairs scored; under a causal mask a pair whose key
    word lies after its query word is not), ``pairs_present`` [n_relations + 1] (pairs in the
    model inputs), ``roles``, ``relations``, ``record_id``, ``is_pair``
    [N] and ``notes`` (role -> why it has no sentence in this corpus, for roles without any).
    BLAS runs on ``threads`` threads.
    """
    with blas_threads(threads):
        return _score_store(store, records, settings, max_bytes)


def _score_store(store, records: list[Record], settings: SieveSettings, max_bytes: int) -> dict:
    causal = store.meta.get("model_kind") == "decoder"
    n_layers, n_heads = store.n_layers, store.n_heads
    roles = role_names(settings.relations)
    n = len(store)
    scores = np.full((n, n_layers, n_heads, len(roles)), np.nan, dtype=np.float32)
    pair_counts = np.zeros((n, len(settings.relations) + 1), dtype=np.int64)
    pairs_present = np.zeros(len(settings.relations) + 1, dtype=np.int64)
    is_pair = np.zeros(n, dtype=bool)
    has_trees = np.zeros(n, dtype=bool)
    what = f"Pande sieves {store.meta.get('model', '')} {store.meta.get('corpus', '')}"
    for k0, k1 in progress(store.chunks(max_bytes), what, n, "sequences", weight=lambda c: c[1] - c[0]):
        a, b = store.token_offsets[k0], store.token_offsets[k1]
        pairs = []
        for k in range(k0, k1):
            r = records[int(store.record_index[k])]
            has_trees[k] = bool(r.head)
            pairs.append(dependency_pairs(r.head, r.deprel, settings, int(store.n_words[k])))
            pairs_present += np.bincount(pairs[-1][2], minlength=len(settings.relations) + 1)
            pairs_present[-1] += len(pairs[-1][2])
        plan = SievePlan(
            store.lengths[k0:k1], store.special[a:b], store.segment[a:b], store.word[a:b], pairs, settings, causal
        )
        for layer in range(n_layers):
            cells = store.layer_cells(layer, k0, k1)
            scores[k0:k1, layer] = plan.scores(cells, store.row_sums(layer, k0, k1, cells)).transpose(1, 0, 2)
        pair_counts[k0:k1] = plan.pair_counts
        is_pair[k0:k1] = plan.is_pair
    notes = role_notes(
        scores, roles, has_trees, pairs_present, settings, store.meta.get("corpus", "?"), store.meta.get("model_kind")
    )
    return {
        "scores": scores,
        "pair_counts": pair_counts,
        "pairs_present": pairs_present,
        "roles": roles,
        "relations": list(settings.relations),
        "record_id": store.record_id.astype(str),
        "is_pair": is_pair,
        "notes": notes,
    }
