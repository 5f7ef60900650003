"""Hand-built models whose answers are known: a one-layer model named 'llama' (what the ablation and ICL patches
recognise) whose heads' outputs are functions of the token ids, chosen by the test."""

from __future__ import annotations


def one_layer_llama(n_heads: int, outputs, logits, o_diag=None):
    """A one-layer 'llama' with ``n_heads`` heads of width 1: head outputs ``z = outputs(ids)`` [B, n, H] (times a
    trainable gain of ones, so that z is in the gradient's graph) go through the output projection
    ``self_attn.o_proj`` (diagonal ``o_diag``, default the identity) into the residual stream h [B, n, H]; the
    model's logits are ``logits(h, ids)``. ``ids`` are the rows as the layer saw them (a patch may expand the
    batch inside the model). The patches hook the output projection's input: z."""
    from types import SimpleNamespace

    import torch

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn = torch.nn.Module()
            self.self_attn.o_proj = torch.nn.Linear(n_heads, n_heads, bias=False)
            self.gain = torch.nn.Parameter(torch.ones(n_heads))
            diag = torch.ones(n_heads) if o_diag is None else torch.as_tensor(o_diag, dtype=torch.float32)
            with torch.no_grad():
                self.self_attn.o_proj.weight.copy_(torch.diag(diag))

        def forward(self, h, ids):
            self.ids = ids
            return h + self.self_attn.o_proj(outputs(ids) * self.gain)

    class OneLayer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = SimpleNamespace(model_type="llama")
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList([Layer()])

        def forward(self, input_ids, attention_mask):
            h = torch.zeros(*input_ids.shape, n_heads)
            for layer in self.model.layers:
                h = layer(h, input_ids)
            return SimpleNamespace(logits=logits(h, self.model.layers[-1].ids))

    return OneLayer()
