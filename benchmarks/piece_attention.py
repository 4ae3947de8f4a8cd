"""FPA piece attention benchmark (GPU): the fused kernel (fpa_lightning/ops/fpa/piece) over a KV cache shaped as
scoring with real eviction leaves it, against SDPA-flash over the same queries and every slot (no bias, no mask).

    PYTHONPATH=. python benchmarks/piece_attention.py [--pieces 512,2048,8192] [--past 8192,16384] [--H 12] [--D 64]
                                                      [--dense-heads 0]

The cache: `past` tokens with the realistic walks of benchmarks/attention.py (increments of mean −0.02 and noise
0.3, φ = W + g, ψ = W + h, β = 1); a past key is cached when its bias after the last past token is at least the
threshold (a running minimum: it was never rejected before either), its path minimum is the exact one. The live keys
of each head sit in position order at the front of its slots, then the free ones; the piece's own n keys take the
first free slots, as ``LayerCache.write`` gives them. The capacity S is the most any head needs, rounded up to 64
slots (one capacity for all heads, as the session has). --dense-heads K: the first K heads keep every past key (as
a head with a small β does), so S is about past + n and the other heads' slots are mostly free. bf16 q, k, v;
median of triton's do_bench. Prints ms, the ratio to flash from the same process, and the kept fraction of the
cache.
"""
from __future__ import annotations

import argparse
import datetime
import math

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from fpa_lightning.ops.common import FAR
from fpa_lightning.ops.fpa.piece import fused


def bench(fn, *, warmup=10, rep=50):
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def evicted_cache(n: int, past: int, H: int, D: int, threshold: float, device, *, dense_heads=0, seed=0):
    """The op's inputs for one row (B = 1) and the live fraction of the past keys: see the module docstring."""
    gen = torch.Generator(device=device).manual_seed(seed)
    T = past + n
    walk = (-0.02 + 0.3 * torch.randn(H, T, generator=gen, device=device)).cumsum(-1)  # (H, T)
    phi = walk + 0.5 * torch.randn(H, T, generator=gen, device=device)
    psi = walk + 0.5 * torch.randn(H, T, generator=gen, device=device)
    after = phi[:, :past].flip(-1).cummin(-1).values.flip(-1)  # min φ over [s, past)
    path_min = torch.cat([after[:, 1:], torch.full_like(after[:, :1], FAR)], dim=-1)  # over (s, past)
    live = (path_min - psi[:, :past]).clamp(max=0) >= threshold  # (H, past)
    live[:, -1] = True  # the newest key is never dropped
    live[:dense_heads] = True
    counts = live.sum(-1)  # (H,)
    S = int(math.ceil((int(counts.max()) + n) / 64) * 64)
    key_pos = torch.full((1, H, S), -1, dtype=torch.int32, device=device)
    state_m = torch.zeros(1, H, S, device=device)
    level = torch.zeros(1, H, S, device=device)
    for h in range(H):
        pos = live[h].nonzero()[:, 0]
        c = len(pos)
        key_pos[0, h, :c] = pos.to(torch.int32)
        key_pos[0, h, c : c + n] = torch.arange(past, T, device=device, dtype=torch.int32)
        state_m[0, h, :c], state_m[0, h, c : c + n] = path_min[h, pos], FAR
        level[0, h, :c], level[0, h, c : c + n] = psi[h, pos], psi[h, past:]
    q = torch.randn(1, n, H, D, generator=gen, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(1, H, S, D, generator=gen, device=device, dtype=torch.bfloat16) for _ in range(2))
    beta = torch.ones(H, device=device)
    start = torch.tensor([past], device=device)
    args = (q, k, v, key_pos, state_m, level, phi[None, :, past:].contiguous(), beta, start, 1 / math.sqrt(D),
            threshold)
    return args, float(counts.float().mean()) / past


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pieces", default="512,2048,8192")
    ap.add_argument("--past", default="8192,16384")
    ap.add_argument("--H", type=int, default=12)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--threshold", type=float, default=-10.0)
    ap.add_argument("--dense-heads", type=int, default=0)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/piece_attention.py times GPU kernels: it needs a CUDA device")
    dev = torch.device("cuda")
    print(f"GPU {torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__} | "
          f"{datetime.datetime.now().isoformat(timespec='seconds')} | dense heads {args.dense_heads}")
    print("| past | piece n | live fraction | slots S | fpa_piece ms | flash ms (n × S, no mask) | × flash |")
    print("|---|---|---|---|---|---|---|")
    for past in map(int, args.past.split(",")):
        for n in map(int, args.pieces.split(",")):
            op_args, live = evicted_cache(n, past, args.H, args.D, args.threshold, dev,
                                           dense_heads=args.dense_heads)
            q, k, v = op_args[:3]
            with torch.no_grad():
                piece_ms = bench(lambda: fused.fpa_piece_attention(*op_args))
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    qh = q.transpose(1, 2)
                    flash_ms = bench(lambda: F.scaled_dot_product_attention(qh, k, v))
            print(f"| {past} | {n} | {live:.3f} | {k.shape[2]} | {piece_ms:.3f} | {flash_ms:.3f} | "
                  f"{piece_ms / flash_ms:.2f} |", flush=True)


if __name__ == "__main__":
    main()
