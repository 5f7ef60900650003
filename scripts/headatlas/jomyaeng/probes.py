"""Batched linear probes: many multinomial logistic regressions trained as one tensor program.

SentEval's protocol (``senteval/tools/classifier.py`` with ``nhid=0``, as Jo & Myaeng ran it),
on features z-scored with train statistics unless ``standardize`` is off (SentEval feeds raw
features; [CLS] states that barely vary between sentences, as in MiniLM's lower layers,
then sit at chance whatever they encode):
one linear layer and softmax cross-entropy (mean over the batch), RMSprop (or Adam) with the
L2 penalty as weight decay on weights and bias, minibatches of 256 in a fresh
``np.random.permutation`` per pass, ``epoch_size`` passes per epoch, the dev metric after
each epoch, the best-dev model kept, and training stopped once the dev metric has failed to
improve more than ``tenacity`` times (SentEval never resets that counter). The L2 value is
chosen from a grid by dev accuracy rounded to 0.01 % (the first wins a tie), as SentEval's
SplitClassifier does, and the chosen model's test metric is reported.

Batching: ``X`` is ``[P, N, d]``, one feature matrix per probe (every head of a model), and
the L2 grid is a second batched axis, so the weights are ``[P, G * C, d]``. Every probe
starts from the same ``nn.Linear(d, C)`` initialisation drawn with the seed and sees the
same minibatch order, so probe p of a batch computes exactly what it computes alone
(:func:`train_probes_loop`). Gradients are written out (softmax minus target), which is
the autograd gradient of the mean cross-entropy. Probes whose whole grid has stopped are
dropped from the batch. Class scores are laid out [probe, L2, class, item], so every
reduction over classes runs along a strided, vectorised axis.

Soft targets ``[N, C]`` (rows summing to 1) train the same model with cross-entropy to a
distribution; with ``values`` the metric is the Pearson r between the expected value
``softmax @ values`` and the target's (SentEval's SICK-R encoding of a 1-5 score).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..core.settings import Settings

# torch is imported in the functions that use it: the TSV-only rules that import this module
# (through jomyaeng.analysis) do not pay its start-up
if TYPE_CHECKING:
    import torch

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True, kw_only=True)
class ProbeConfig(Settings):
    """analysis.jomyaeng.probe (workflow/schemas/jomyaeng.schema.yaml): SentEval's probe and its grid."""

    SECTION = "analysis.jomyaeng.probe"

    l2: tuple[float, ...] = (1e-5, 1e-4, 1e-3, 1e-2)
    optimizer: str = "rmsprop"
    lr: float | None = None  # None: torch's default of the optimizer (RMSprop 0.01, Adam 0.001)
    batch_size: int = 256
    epoch_size: int = 2
    max_epoch: int = 200
    tenacity: int = 3
    seed: int = 123
    dtype: str = "float32"
    standardize: bool = True  # z-score every feature with train statistics (SentEval: False)

    def __post_init__(self):
        if self.optimizer not in ("rmsprop", "adam"):
            raise ValueError(f"probe optimizer must be 'rmsprop' or 'adam', not {self.optimizer!r}")
        if not self.l2 or any(v < 0 for v in self.l2):
            raise ValueError(f"probe l2 grid must be non-empty and non-negative, got {self.l2}")
        if self.batch_size < 1 or self.epoch_size < 1 or self.tenacity < 0 or self.max_epoch < 0:
            raise ValueError("probe batch_size and epoch_size must be >= 1, tenacity and max_epoch >= 0")

    @property
    def learning_rate(self) -> float:
        if self.lr is not None:
            return float(self.lr)
        return 0.01 if self.optimizer == "rmsprop" else 0.001


@dataclass
class ProbeResult:
    dev: np.ndarray  # [P] dev metric at the chosen L2
    test: np.ndarray  # [P] test metric of the same model
    l2: np.ndarray  # [P] chosen L2
    epochs: np.ndarray  # [P] epochs trained at the chosen L2
    dev_grid: np.ndarray  # [P, G]
    test_grid: np.ndarray  # [P, G]


def _targets(y, n_classes: int | None, dtype) -> tuple[torch.Tensor, int]:
    import torch

    y = torch.as_tensor(np.asarray(y))
    if y.dim() == 1:
        if y.dtype.is_floating_point:
            raise ValueError("class labels must be integers; pass soft targets as an [N, C] array")
        c = int(n_classes if n_classes is not None else int(y.max()) + 1)
        if int(y.min()) < 0 or int(y.max()) >= c:
            raise ValueError(f"labels must lie in 0..{c - 1}")
        return torch.nn.functional.one_hot(y.long(), c).to(dtype), c
    if y.dim() != 2:
        raise ValueError(f"targets must be [N] labels or [N, C] distributions, got shape {tuple(y.shape)}")
    return y.to(dtype), int(y.shape[1])


def standardize(X: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Z-score every feature of every probe with the train split's mean and standard
    deviation (features [..., N, d]; constant features become 0)."""
    import torch

    mu = X["train"].mean(-2, keepdim=True)
    sd = X["train"].std(-2, keepdim=True)
    sd = torch.where(sd > 0, sd, torch.ones_like(sd))
    return {s: (X[s] - mu) / sd for s in X}


def _softmax(z: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax written out: torch.softmax over a short class axis is slow on CPU."""
    e = (z - z.amax(dim, keepdim=True)).exp_()
    return e.div_(e.sum(dim, keepdim=True))


def _metric(logits: torch.Tensor, target: torch.Tensor, values: torch.Tensor | None) -> torch.Tensor:
    """Per probe and grid column: accuracy, or Pearson r of expected values.
    logits [P, G, C, N] (classes before items), target [N, C]."""
    import torch

    if values is None:
        # correct = the gold class is the first maximum (torch.argmax's tie rule), computed
        # without argmax, which is slow over a short axis
        gold = target.argmax(1)  # [N]
        classes = torch.arange(logits.shape[2])[:, None]
        is_max = logits == logits.amax(2, keepdim=True)
        gold_max = (is_max & (classes == gold)).any(2)
        earlier = (is_max & (classes < gold)).any(2)
        return (gold_max & ~earlier).double().mean(-1)
    pred = torch.einsum("pgcn,c->pgn", _softmax(logits, 2), values)
    gold = (target @ values)[None, None, :]
    pc = pred - pred.mean(-1, keepdim=True)
    gc = gold - gold.mean(-1, keepdim=True)
    den = torch.sqrt((pc**2).sum(-1) * (gc**2).sum(-1))
    return torch.where(den > 0, (pc * gc).sum(-1) / den.clamp_min(1e-30), torch.zeros_like(den))


def train_probes(
    X: dict[str, np.ndarray | torch.Tensor],
    y: dict[str, np.ndarray],
    cfg: ProbeConfig = ProbeConfig(),
    n_classes: int | None = None,
    values: np.ndarray | None = None,
) -> ProbeResult:
    """Train P probes at once. ``X[split]`` is [P, N_split, d] (or [N, d] for one probe),
    ``y[split]`` integer labels [N] or soft targets [N, C]; ``values`` [C] switches the
    metric to Pearson r of expected values."""
    import torch

    dtype = getattr(torch, cfg.dtype)
    Xs = {}
    for s in SPLITS:
        x = torch.as_tensor(np.asarray(X[s]) if not isinstance(X[s], torch.Tensor) else X[s]).to(dtype)
        Xs[s] = x[None] if x.dim() == 2 else x
    P, N, d = Xs["train"].shape
    for s in SPLITS:
        if Xs[s].shape[0] != P or Xs[s].shape[2] != d:
            raise ValueError(f"{s} features have shape {tuple(Xs[s].shape)}, train {P, N, d}")
    if cfg.standardize:
        Xs = standardize(Xs)
    Y = {}
    for s in SPLITS:
        Y[s], c = _targets(y[s], n_classes, dtype)
        if len(Y[s]) != Xs[s].shape[1]:
            raise ValueError(f"{s}: {len(Y[s])} targets for {Xs[s].shape[1]} rows")
        n_classes = c
    C, G = n_classes, len(cfg.l2)
    vals = None if values is None else torch.as_tensor(np.asarray(values, dtype=np.float64)).to(dtype)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        lin = torch.nn.Linear(d, C)
    # weights as [P, G*C, d] (nn.Linear's layout, one block per L2 value): the class axis
    # comes before the items everywhere, which keeps the softmax over classes vectorised
    W = lin.weight.detach().to(dtype).repeat(G, 1)[None].repeat(P, 1, 1).contiguous()
    b = lin.bias.detach().to(dtype).repeat(G)[None].repeat(P, 1).contiguous()  # [P, G*C]
    wd = torch.tensor(cfg.l2, dtype=dtype).repeat_interleave(C)  # [G*C]
    state = [torch.zeros_like(W), torch.zeros_like(b), torch.zeros_like(W), torch.zeros_like(b)]
    lr = cfg.learning_rate
    rng = np.random.RandomState(cfg.seed)
    Yt = {s: Y[s].T.contiguous() for s in SPLITS}  # [C, N]

    best = torch.full((P, G), -1.0, dtype=torch.float64)
    best_test = torch.zeros((P, G), dtype=torch.float64)
    best_epoch = torch.zeros((P, G), dtype=torch.int64)
    count = torch.zeros((P, G), dtype=torch.int64)
    stopped = torch.zeros((P, G), dtype=torch.bool)
    active = torch.arange(P)  # probes still in the batch (global indices)
    Xa = {s: Xs[s] for s in ("dev", "test")}
    Xr = Xs["train"].transpose(0, 1).contiguous()  # [N, P, d]: a minibatch is a gather of whole rows
    nepoch, step = 0, 0
    while nepoch <= cfg.max_epoch and len(active):
        Pa = len(active)
        for _ in range(cfg.epoch_size):
            perm = torch.from_numpy(rng.permutation(N))
            Xp, Yp = Xr.index_select(0, perm), Yt["train"].index_select(1, perm)  # one gather per pass
            for i in range(0, N, cfg.batch_size):
                xb = Xp[i : i + cfg.batch_size]  # [B, Pa, d]
                B = xb.shape[0]
                logits = torch.baddbmm(b[:, :, None], W, xb.permute(1, 2, 0)).view(Pa, G, C, B)
                g = _softmax(logits, 2).sub_(Yp[:, i : i + B]).div_(B).view(Pa, G * C, B)
                gW = torch.bmm(g, xb.transpose(0, 1)).add_(wd[:, None] * W)
                gb = g.sum(2).add_(wd * b)
                step += 1
                _update(cfg, lr, step, (W, b), (gW, gb), state)
        nepoch += cfg.epoch_size
        m = {
            s: _metric(torch.baddbmm(b[:, :, None], W, Xa[s].transpose(1, 2)).view(Pa, G, C, -1), Y[s], vals)
            for s in ("dev", "test")
        }
        st = stopped[active]
        improved = (m["dev"] > best[active]) & ~st
        worse = ~improved & ~st
        best[active] = torch.where(improved, m["dev"], best[active])
        best_test[active] = torch.where(improved, m["test"], best_test[active])
        best_epoch[active] = torch.where(improved, nepoch, best_epoch[active])
        stopped[active] = st | (worse & (count[active] >= cfg.tenacity))
        count[active] = count[active] + worse.long()
        keep = ~stopped[active].all(1)
        if not keep.all():
            k = torch.nonzero(keep).squeeze(1)
            active = active[k]
            Xa = {s: Xa[s].index_select(0, k) for s in Xa}
            Xr = Xr.index_select(1, k)
            W, b = W.index_select(0, k).contiguous(), b.index_select(0, k).contiguous()
            state = [t.index_select(0, k).contiguous() for t in state]
    dev_grid, test_grid = best.numpy(), best_test.numpy()
    choice = np.argmax(np.round(100 * dev_grid, 2), axis=1)
    rows = np.arange(P)
    return ProbeResult(
        dev=dev_grid[rows, choice],
        test=test_grid[rows, choice],
        l2=np.asarray(cfg.l2)[choice],
        epochs=best_epoch.numpy()[rows, choice],
        dev_grid=dev_grid,
        test_grid=test_grid,
    )


def _update(cfg: ProbeConfig, lr: float, step: int, params, grads, state) -> None:
    """One RMSprop or Adam step (torch's formulas, no momentum, not centred), in place."""
    if cfg.optimizer == "rmsprop":
        alpha, eps = 0.99, 1e-8
        for p, g, sq in zip(params, grads, state[:2]):
            sq.mul_(alpha).addcmul_(g, g, value=1 - alpha)
            p.addcdiv_(g, sq.sqrt().add_(eps), value=-lr)
        return
    b1, b2, eps = 0.9, 0.999, 1e-8
    bc1, bc2 = 1 - b1**step, 1 - b2**step
    for p, g, m, v in zip(params, grads, state[:2], state[2:]):
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        p.addcdiv_(m, (v.sqrt() / math.sqrt(bc2)).add_(eps), value=-lr / bc1)


def train_probes_loop(
    X: dict, y: dict, cfg: ProbeConfig = ProbeConfig(), n_classes: int | None = None, values=None
) -> ProbeResult:
    """The same probes trained one at a time (reference for tests and the benchmark)."""
    P = np.asarray(X["train"]).shape[0]
    parts = [
        train_probes({s: np.asarray(X[s])[p : p + 1] for s in SPLITS}, y, cfg, n_classes, values) for p in range(P)
    ]
    return ProbeResult(
        *(
            np.concatenate([getattr(r, f) for r in parts])
            for f in ("dev", "test", "l2", "epochs", "dev_grid", "test_grid")
        )
    )


def senteval_probe(
    X: dict, y: dict, l2: float, cfg: ProbeConfig = ProbeConfig(), n_classes: int | None = None
) -> tuple[float, float, int]:
    """Reference: one probe and one L2 value trained as SentEval's ``MLP(nhid=0).fit`` does it
    (``nn.Linear``, autograd, ``torch.optim``, a deep copy of the best-dev model); returns
    (best dev accuracy, its test accuracy, its epoch). ``X[split]`` is [N, d]."""
    import copy

    import torch

    dtype = getattr(torch, cfg.dtype)
    t = {s: torch.as_tensor(np.asarray(X[s])).to(dtype) for s in SPLITS}
    if cfg.standardize:
        t = standardize(t)
    yy = {s: torch.as_tensor(np.asarray(y[s])).long() for s in SPLITS}
    C = int(n_classes if n_classes is not None else int(yy["train"].max()) + 1)
    np.random.seed(cfg.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = torch.nn.Sequential(torch.nn.Linear(t["train"].shape[1], C)).to(dtype)
    optim = torch.optim.RMSprop if cfg.optimizer == "rmsprop" else torch.optim.Adam
    opt = optim(model.parameters(), lr=cfg.learning_rate, weight_decay=l2)
    loss_fn = torch.nn.CrossEntropyLoss()
    nepoch, best, count, stop, best_model, best_epoch = 0, -1.0, 0, False, model, 0
    while not stop and nepoch <= cfg.max_epoch:
        for _ in range(cfg.epoch_size):
            perm = np.random.permutation(len(t["train"]))
            for i in range(0, len(perm), cfg.batch_size):
                idx = torch.as_tensor(perm[i : i + cfg.batch_size])
                loss = loss_fn(model(t["train"][idx]), yy["train"][idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
        nepoch += cfg.epoch_size
        with torch.no_grad():
            acc = (model(t["dev"]).argmax(1) == yy["dev"]).double().mean().item()
        if acc > best:
            best, best_model, best_epoch = acc, copy.deepcopy(model), nepoch
        else:
            if count >= cfg.tenacity:
                stop = True
            count += 1
    with torch.no_grad():
        test = (best_model(t["test"]).argmax(1) == yy["test"]).double().mean().item()
    return best, test, best_epoch


def senteval_loop(X: dict, y: dict, cfg: ProbeConfig = ProbeConfig(), n_classes: int | None = None) -> ProbeResult:
    """The per-head loop of the reference code: :func:`senteval_probe` for every probe and
    every L2 value, one after another (SentEval then refits the chosen L2 once more; that
    duplicate is skipped here)."""
    P = np.asarray(X["train"]).shape[0]
    G = len(cfg.l2)
    dev, test, ep = np.zeros((P, G)), np.zeros((P, G)), np.zeros((P, G), dtype=np.int64)
    for p in range(P):
        for g, l2 in enumerate(cfg.l2):
            dev[p, g], test[p, g], ep[p, g] = senteval_probe(
                {s: np.asarray(X[s])[p] for s in SPLITS}, y, l2, cfg, n_classes
            )
    choice = np.argmax(np.round(100 * dev, 2), axis=1)
    rows = np.arange(P)
    return ProbeResult(dev[rows, choice], test[rows, choice], np.asarray(cfg.l2)[choice], ep[rows, choice], dev, test)


def pair_features(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """SentEval's sentence-pair features [|u - v|, u * v] along the last axis."""
    return np.concatenate([np.abs(u - v), u * v], axis=-1)


def relatedness_targets(scores: np.ndarray, lo: float = 1.0, hi: float = 5.0) -> tuple[np.ndarray, np.ndarray]:
    """SentEval's SICK-R encoding: a score s in [lo, hi] as a distribution over the integers
    lo..hi with mass on floor(s) and floor(s) + 1 whose expectation is s; returns (targets, values)."""
    values = np.arange(int(lo), int(hi) + 1, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    if np.any(s < lo) or np.any(s > hi):
        raise ValueError(f"relatedness scores must lie in [{lo}, {hi}]")
    k = np.minimum(np.floor(s).astype(int), int(hi) - 1) - int(lo)
    frac = s - (k + lo)
    t = np.zeros((len(s), len(values)))
    t[np.arange(len(s)), k] = 1 - frac
    t[np.arange(len(s)), k + 1] = frac
    return t, values
