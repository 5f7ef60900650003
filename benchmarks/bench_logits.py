"""What an exact ablation pass pays for its logits beyond the output layer's multiply-adds, one thread.

``Evaluation.exact`` scores the next token at every position of every block: the output layer writes rows x
vocabulary float32 logits (2.4 GB for a pass of 4,032 rows of Qwen's 151,936 tokens) and the loss reads them
(log-softmax, the target's entry). Their cost per logit does not grow with the model's width, so a cost model
that counts only the output layer's vocabulary x d multiply-adds charges a narrow model too little for it.

Per width d: the output layer alone (``h @ W.T``), the same followed by ``Evaluation``'s loss (and by the same
loss on the logits as rows), and a body-sized product (d x 4d) for the multiply-add rate. Reports the loss's seconds per logit and, in multiply-adds of the body
product's rate, what a logit costs on top of the output layer's d.

    python benchmarks/bench_logits.py --out benchmarks/results_logits.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
import torch.nn.functional as F


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def measure(d: int, vocab: int, batch: int, n: int, repeat: int) -> dict:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(batch, n, d, generator=g)
    w = torch.randn(vocab, d, generator=g) / d**0.5
    body = torch.randn(4 * d, d, generator=g) / d**0.5
    target = torch.randint(0, vocab, (batch, n), generator=g)

    def logits_only():
        return h @ w.T

    def with_loss():  # Evaluation._metrics, task "lm"
        logits = (h @ w.T).float()[:, :-1]
        tok = F.cross_entropy(logits.transpose(1, 2), target[:, 1:], reduction="none")
        return tok.sum(1)

    def with_flat_loss():  # the same loss on the logits as rows
        logits = (h @ w.T)[:, :-1]
        tok = F.cross_entropy(logits.reshape(-1, vocab), target[:, 1:].reshape(-1), reduction="none")
        return tok.view(batch, n - 1).sum(1)

    with torch.inference_mode():
        t_body = best(lambda: h @ body.T, repeat)
        t_out = best(logits_only, repeat)
        t_loss = best(with_loss, repeat)
        t_flat = best(with_flat_loss, repeat)
        gap = float((with_loss() - with_flat_loss()).abs().max() / with_loss().abs().max())
    rows = batch * n
    rate = rows * d * 4 * d / t_body  # multiply-adds per CPU-second of a body-sized product
    per_logit = (t_loss - rows * vocab * d / rate) / (rows * vocab)
    return {
        "d": d, "rows": rows, "vocab": vocab, "body_madds_per_s": rate, "output_layer_s": t_out, "with_loss_s": t_loss,
        "output_layer_madds_per_s": rows * vocab * d / t_out, "loss_s_per_logit": (t_loss - t_out) / (rows * vocab),
        "logit_beyond_d_in_madds": per_logit * rate, "flat_loss_s_per_logit": (t_flat - t_out) / (rows * vocab),
        "flat_loss_relative_difference": gap,
    }  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", default="576,896,1536")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=36)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(1)
    res = [measure(int(d), args.vocab, args.batch, args.tokens, args.repeat) for d in args.widths.split(",")]
    for r in res:
        print(f"d {r['d']:5d}: body {r['body_madds_per_s'] / 1e9:.1f} G madd/s, output layer "
              f"{r['output_layer_madds_per_s'] / 1e9:.1f} G madd/s, loss {r['loss_s_per_logit'] * 1e9:.2f} ns/logit "
              f"(as rows {r['flat_loss_s_per_logit'] * 1e9:.2f}), a logit costs {r['logit_beyond_d_in_madds']:.0f} multiply-adds beyond its d")  # fmt: skip
    if args.out:
        doc = {"command": "python benchmarks/bench_logits.py " + " ".join(f"--{k} {v}" for k, v in vars(args).items()
                                                                       if k != "out" and v is not None),
               "torch": torch.__version__, "cpu": platform.processor() or platform.machine(), "threads": 1,
               "results": res}  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
