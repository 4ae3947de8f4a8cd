"""How many of FPA's off-diagonal tiles have every probability below the GPU's exp2 underflow (CPU, no kernel).

    python benchmarks/dead_tiles.py [--lengths 2048 4096 8192 16384] [--heads 1] [--block 64] [--fields walks|alibi]
                                    [--skip-threshold X] [--out FILE.json]

On `benchmarks/attention.py`'s inputs (random q and k, D = 64, realistic walks, β = 1), per length: the off-diagonal
(query block I, key block J < I) tiles of `--block` rows and columns whose every log2-probability log2 p[t, s] =
(logit − logsumexp) / ln 2 is below −126, the float32 value under which the GPU's exp2 (flushing subnormals) gives
exactly 0. Such a tile has dS = 0 and adds nothing to any gradient, so an exact check in the backward may pass over it
(benchmarks/candidates/README.md). `--fields alibi` takes instead the fields a fresh FPA model starts with
(FpaBackend's init: φ = ψ = −m_h·t with ALiBi's slopes for `--heads` heads, so the bias is −m_h·(t − s)), with the
same random q and k. Logits and bias are float64 (the bias from the definition of docs/method.md: β·min(0, min over
(s, t] of φ − ψ_s)), one query block at a time, so memory stays at a block's rows.

`--skip-threshold X` counts instead the tiles that skipping at X keeps (`skip_threshold`, docs/kernel.md §3: a tile
whose largest bias is ≥ X; fpa_lightning/analysis/tiles.py), on the same fields (no q or k involved): what a skipping
kernel has to compute, against which its time can be read.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys
import time

import torch

UNDERFLOW_LOG2 = -126.0
"""exp2 of a float32 below this is flushed to 0 on the GPU (the smallest normal float32 is 2^-126)."""


def walks(T: int, H: int, gen: torch.Generator, drift=-0.02, noise=0.3, offset=0.5):
    """benchmarks/attention.py's realistic walks for one sequence: phi, psi (T, H), float64."""
    W = (drift + noise * torch.randn(T, H, generator=gen, dtype=torch.float64)).cumsum(0)
    return (W + offset * torch.randn(T, H, generator=gen, dtype=torch.float64),
            W + offset * torch.randn(T, H, generator=gen, dtype=torch.float64))


def alibi_fields(T: int, H: int):
    """A fresh FPA model's fields: phi = psi = -m_h * t with ALiBi's slopes, (T, H) float64 each."""
    from fpa_lightning.ops.fox.alibi import alibi_slopes

    phi = -torch.arange(T, dtype=torch.float64)[:, None] * alibi_slopes(H).double()[None, :]
    return phi, phi.clone()


def block_log2_probs(q, k, phi, psi, beta: float, rows: slice) -> torch.Tensor:
    """log2 p[t, s] of the query rows `rows` over keys s <= t (one head; q, k (T, D), phi, psi (T,)); -inf above
    the diagonal. The range minimum over (s, t] is a reverse running minimum from each t."""
    t_end = rows.stop
    logits = (q[rows] @ k[:t_end].T) / math.sqrt(q.shape[1])  # (BS, t_end)
    bias = torch.full_like(logits, -math.inf)
    for i, t in enumerate(range(rows.start, rows.stop)):
        path_min = torch.flip(torch.cummin(torch.flip(phi[1:t + 1], [0]), 0).values, [0])  # [s] = min phi[s+1..t]
        bias[i, :t] = beta * torch.clamp(path_min - psi[:t], max=0.0)
        bias[i, t] = 0.0
    scores = logits + bias
    return (scores - torch.logsumexp(scores, dim=1, keepdim=True)) / math.log(2.0)


def count_dead_tiles(q, k, phi, psi, beta: float, block: int) -> tuple[int, int]:
    """(dead, off-diagonal) tile counts of one head; the last query block may be partial (as a kernel's is)."""
    T = q.shape[0]
    dead = total = 0
    for I in range(-(-T // block)):
        log2_p = block_log2_probs(q, k, phi, psi, beta, slice(I * block, min((I + 1) * block, T)))
        for J in range(I):
            total += 1
            dead += bool((log2_p[:, J * block:(J + 1) * block] < UNDERFLOW_LOG2).all())
    return dead, total


def count_kept_tiles(phi, psi, threshold: float, block: int) -> tuple[int, int]:
    """(kept, off-diagonal) tile counts over the heads of phi, psi (T, H) at β = 1 (fpa_lightning.analysis.tiles)."""
    from fpa_lightning.analysis.tiles import kept_tile_counts
    from fpa_lightning.attention import AttentionConfig, LayerProbe
    from fpa_lightning.attention.backends import FpaBackend

    T, H = phi.shape
    owner = FpaBackend(AttentionConfig(backend="fpa"), d_model=4, n_head=H, head_dim=2)
    probe = LayerProbe("fpa", {"phi": phi[None], "psi": psi[None], "beta": torch.ones(H, dtype=phi.dtype)}, owner=owner)
    kept, per_head = kept_tile_counts(probe, threshold, block)
    return int(kept.sum()), H * per_head


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fields", choices=("walks", "alibi"), default="walks")
    ap.add_argument("--skip-threshold", type=float, default=None,
                    help="count the tiles that skipping at this threshold keeps instead of the dead ones")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    rows = []
    for T in args.lengths:
        if T % args.block:
            ap.error(f"length {T} is not a multiple of --block {args.block}")
        gen = torch.Generator().manual_seed(args.seed)
        q, k = (torch.randn(T, args.heads, args.D, generator=gen, dtype=torch.float64) for _ in range(2))
        phi, psi = walks(T, args.heads, gen) if args.fields == "walks" else alibi_fields(T, args.heads)
        start = time.time()
        if args.skip_threshold is not None:
            kept, total = count_kept_tiles(phi, psi, args.skip_threshold, args.block)
            rows.append({"T": T, "heads": args.heads, "fields": args.fields, "threshold": args.skip_threshold,
                         "kept_tiles": kept, "off_diagonal_tiles": total, "fraction": round(kept / total, 4),
                         "seconds": round(time.time() - start, 1)})
            print(f"T = {T}: {kept} of {total} off-diagonal tiles kept at {args.skip_threshold} ({kept / total:.1%}), "
                  f"{rows[-1]['seconds']} s", flush=True)
            continue
        dead = total = 0
        for h in range(args.heads):
            d, n = count_dead_tiles(q[:, h], k[:, h], phi[:, h], psi[:, h], 1.0, args.block)
            dead, total = dead + d, total + n
        rows.append({"T": T, "heads": args.heads, "fields": args.fields, "dead_tiles": dead, "off_diagonal_tiles": total,
                     "fraction": round(dead / total, 4), "seconds": round(time.time() - start, 1)})
        print(f"T = {T}: {dead} of {total} off-diagonal tiles dead ({dead / total:.1%}), {rows[-1]['seconds']} s",
              flush=True)
    if args.out:
        fields = ("benchmarks/attention.py's walks" if args.fields == "walks"
                  else "a fresh FPA model's fields (ALiBi: phi = psi = -m_h t)")
        counted = ("off-diagonal FPA tiles whose every probability underflows the GPU's exp2 (log2 p < -126)"
                   if args.skip_threshold is None else
                   f"off-diagonal FPA tiles that skipping at {args.skip_threshold} keeps (largest bias >= it)")
        record = {"what": f"{counted}, on {fields} (beta = 1)",
                  "command": "python benchmarks/dead_tiles.py " + " ".join(sys.argv[1:] if argv is None else argv),
                  "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} threads",
                  "versions": {"torch": torch.__version__, "python": platform.python_version()},
                  "date": datetime.date.today().isoformat(), "block": args.block, "D": args.D, "seed": args.seed,
                  "rows": rows}
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
