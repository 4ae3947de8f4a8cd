"""Which rounding explains the DCP d2 kernel's bf16 offset-gradient error at 1 x 4096 (GPU test: 2.81 against a
float64 value of -740.33; PyTorch's bf16 error 0.33)?

A float64 emulation on the CPU of the kernel's structure, one rounding at a time, everything else exact:
doffset = sum over pairs (s < t') of g(t', s) * R(t', s), R = the reverse cumulative sum over queries of the heads'
dS = P (dP - Δ), g = d log keep / dz. The roundings: tf32 operands in the in-tile triangular sums (the backward's
suffix sums of dS, the forward bias's prefix sums of L, also with different tiles in the two passes, so that the
backward's P no longer matches the forward's log-sum-exp), and Δ = rowsum(dO·O) from a rounded O or from an O
accumulated as round(P)·V (P cast to v's dtype for the tensor-core dot, as the kernel's fp32 output is).
Inputs: the GPU test's (seed 26, rounded to bf16).

usage: PYTHONPATH=<a tree with fpa_lightning/ops/dcp/naive.py> python offset_precision_emulation.py [T]
"""
import math
import sys
import time

import torch

from fpa_lightning.ops.dcp.naive import dcp_attention_naive, log_keep_rows

B, T, H, D, R_DIM = 1, int(sys.argv[1]) if len(sys.argv) > 1 else 4096, 4, 64, 32
BT_BACKWARD = 32  # the key-major backward's query tiles, where the offset partials are summed


def rounded(dtype):
    return lambda x: x.to(dtype).double()


def tf32_truncated(x):
    bits = x.float().contiguous().view(torch.int32) & ~((1 << 13) - 1)
    return bits.view(torch.float32).double()


def tf32_nearest(x):
    bits = x.float().contiguous().view(torch.int32).long()
    bits = (bits + (1 << 12) - 1 + ((bits >> 13) & 1)) & ~((1 << 13) - 1)
    return bits.to(torch.int32).view(torch.float32).double()


def split_bf16(x):  # d3's P·V: P as the sum of two bf16 terms
    hi = x.to(torch.bfloat16).double()
    return hi + (x - hi).to(torch.bfloat16).double()


def in_tile(error, tile, prefix):
    """Strict in-tile prefix (t' < t) or suffix (t > t') sums over queries of `error` (T, S)."""
    e = error.view(T // tile, tile, T)
    sums = e.cumsum(1) if prefix else e.flip(1).cumsum(1).flip(1)
    return (sums - e).reshape(T, T)


gen = torch.Generator().manual_seed(26)
q, k, v, do = (torch.randn(B, T, H, D, generator=gen, dtype=torch.float64) for _ in range(4))
qi, ki = (torch.randn(B, T, R_DIM, generator=gen, dtype=torch.float64) * 0.5 for _ in range(2))
q, k, v, qi, ki, do = map(rounded(torch.bfloat16), (q, k, v, qi, ki, do))
off = torch.tensor(0.6, dtype=torch.float64)

started = time.time()
off_leaf = off.clone().requires_grad_()
dcp_attention_naive(q, k, v, qi, ki, off_leaf).backward(do)
print(f"float64 doffset (autograd)         {off_leaf.grad.item():.6f}  ({time.time() - started:.0f} s)")

L = log_keep_rows(qi, ki, off, 0, T)[0]  # (T', S), zero where s >= t'
x = ((qi[0] @ ki[0].T) / math.sqrt(R_DIM) + off + 1) / 2
g = torch.where((x >= 1e-30) & (x <= 1), 1 / (2 * x), torch.zeros_like(x))
g = torch.where(torch.ones(T, T, dtype=torch.bool).tril(-1), g, torch.zeros_like(g))  # s < t'
bias = L.cumsum(0).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
scale = 1 / math.sqrt(D)


def doffset(*, bias_forward=bias, bias_backward=bias, o_round=None, p_round=None, ds_round=None):
    """The offset gradient with the given roundings: the forward (log-sum-exp, O) on bias_forward, the backward's P
    on bias_backward, O rounded by o_round or accumulated from p_round(P)·V, dS's operands of the backward's in-tile
    suffix sums rounded by ds_round."""
    R, tile_error = torch.zeros(T, T, dtype=torch.float64), torch.zeros(T, T, dtype=torch.float64)
    for h in range(H):
        qk = q[0, :, h] @ k[0, :, h].T * scale
        s_forward = qk + bias_forward
        m = s_forward.max(-1, keepdim=True).values
        p_forward = torch.exp(s_forward - m)  # unnormalised, as the online softmax holds it
        l = p_forward.sum(-1, keepdim=True)
        O = ((p_round or (lambda p: p))(p_forward) @ v[0, :, h]) / l
        O = o_round(O) if o_round else O
        delta = (do[0, :, h] * O).sum(-1, keepdim=True)
        P = torch.exp(qk + bias_backward - m - torch.log(l))
        dS = P * (do[0, :, h] @ v[0, :, h].T - delta)
        R += dS
        if ds_round:  # the in-tile part of R's sum takes rounded operands; later tiles come exact (the carry)
            tile_error += in_tile(ds_round(dS) - dS, BT_BACKWARD, prefix=False)
    R = R.flip(0).cumsum(0).flip(0) + tile_error  # Σ_{t ≥ t'} Σ_h dS
    return (R * g).sum().item()


def bias_with(round_fn, tile):
    return bias + in_tile(round_fn(L) - L, tile, prefix=True)


print(f"emulated, exact                    {doffset():.6f}")
for name, fn in (("fp32", rounded(torch.float32)), ("tf32 truncated", tf32_truncated), ("tf32 nearest", tf32_nearest),
                 ("bf16", rounded(torch.bfloat16))):
    print(f"backward suffix sums, {name:15s}{doffset(ds_round=fn):.6f}")
for name, fn in (("tf32 truncated", tf32_truncated), ("tf32 nearest", tf32_nearest)):
    for tile in (32, 64):
        b = bias_with(fn, tile)
        print(f"forward prefix sums, {name}, tiles {tile}: {doffset(bias_forward=b, bias_backward=b):.6f}")
    print(f"forward tiles 64, backward tiles 32, {name}: "
          f"{doffset(bias_forward=bias_with(fn, 64), bias_backward=bias_with(fn, 32)):.6f}")
for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)):
    print(f"Δ from a {name} O:                 {doffset(o_round=rounded(dtype)):.6f}")
for name, fn in (("bf16", rounded(torch.bfloat16)), ("fp16", rounded(torch.float16)), ("split bf16", split_bf16)):
    print(f"Δ from {name}(P)·V:               {doffset(p_round=fn):.6f}")
