"""Run the fused Selective and DCP ops (Triton interpreter) forward and backward on fixed cases and save every
output and gradient: run once with the base tree first on PYTHONPATH and once with the patched tree, then compare."""
import itertools
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
import torch  # noqa: E402

from fpa_lightning.ops.dcp import fused as dcp_fused  # noqa: E402
from fpa_lightning.ops.selective import fused as sel_fused  # noqa: E402

print(sel_fused.__file__, file=sys.stderr)


def inputs(op, B, T, H, D, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, T, H, D, generator=gen).to(dtype) for _ in range(4))
    if op == "sel":
        return [q, k, v], do
    qi, ki = (0.5 * torch.randn(B, T, 16, generator=gen) for _ in range(2))
    return [q, k, v, qi.to(dtype), ki.to(dtype), torch.tensor(0.6)], do


def docs(B, T, seed):
    gen = torch.Generator().manual_seed(seed)
    starts = torch.rand(B, T, generator=gen) < 1 / 9
    starts[:, 0] = False
    return starts.long().cumsum(1)


results = {}
cases = itertools.product(("sel", "dcp"), ((2, 37, 2), (1, 70, 3), (1, 5, 1), (2, 33, 4)), (torch.float32, torch.float16),
                          (False, True), (1, 2), ("dot", "scan"), ("t16", "mixed"))
for op, (B, T, H), dtype, seg, groups, prefix, tiles in cases:
    if groups > 1 and H % groups:
        continue
    mod = sel_fused if op == "sel" else dcp_fused
    mod._head_groups = lambda B_, H_, nJ, device, n=groups: n
    mod._prefix_by_dot = (lambda: True) if prefix == "dot" else (lambda: False)
    mod._tiles = ((lambda: {"fwd": (16, 16), "bwd": (16, 16, 16)}) if tiles == "t16"
                  else (lambda: {"fwd": (32, 16), "bwd": (16, 32, 32)}))
    args, do = inputs(op, B, T, H, 16, dtype, seed=B * T + H)
    args = [a.clone().requires_grad_() for a in args]
    fn = sel_fused.selective_attention_fused if op == "sel" else dcp_fused.dcp_attention_fused
    out = fn(*args, segment_ids=docs(B, T, T) if seg else None)
    out.backward(do.to(out.dtype))
    results[(op, B, T, H, str(dtype), seg, groups, prefix, tiles)] = [out.detach()] + [a.grad for a in args]
torch.save(results, sys.argv[1])
print(len(results), "cases", file=sys.stderr)
