"""Reference for ICL patching: Todd et al.'s one-head-at-a-time indirect effect with a plain forward pre-hook."""

from __future__ import annotations

import numpy as np


def indirect_effects(model, o_projs, prompts, targets, means, task_of, n_heads):
    """[S, L * H]: per prompt (token id list) and head, p(target) with the head's slice of the output
    projection's input at the last position set to its task's mean [T, L, H, d], minus p(target) unpatched."""
    import torch

    def p_target(ids, t):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        return float(logits.logits[0, -1].float().softmax(-1)[t])

    L = len(o_projs)
    out = np.zeros((len(prompts), L * n_heads))
    for s, (ids, t) in enumerate(zip(prompts, targets)):
        base = p_target(ids, t)
        for layer in range(L):
            for h in range(n_heads):
                v = torch.as_tensor(means[task_of[s], layer, h], dtype=torch.float32)
                d = v.shape[0]

                def hook(module, args, v=v, h=h, d=d):
                    x = args[0].clone()
                    x[:, -1, h * d : (h + 1) * d] = v
                    return (x,) + tuple(args[1:])

                handle = o_projs[layer].register_forward_pre_hook(hook)
                try:
                    out[s, layer * n_heads + h] = p_target(ids, t) - base
                finally:
                    handle.remove()
    return out
