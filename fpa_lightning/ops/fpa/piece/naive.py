"""The readable definition of FPA piece attention: n consecutive new queries of one row attend to the KV cache's S
slots under FPA's key-level path-minimum bias, with a threshold evicting keys on the way (docs/generation.md,
"Scoring with real eviction"). fused.py computes the same without any (n, S) tensor.

    fpa_piece_attention(q, k, v, key_pos, path_min, level, phi, beta, start, scale, threshold)
        -> out (B, n, H, D) in v's dtype, kept (B, H, n) int64

q (B, n, H, D): queries at positions start[b] + i; k, v (B, H, S, D) and key_pos (B, H, S) (−1: a free slot): the
cache, the piece's own keys already written; path_min (B, H, S): m_s, the minimum of φ over the positions after key s
up to the piece (FAR for the piece's own keys); level (B, H, S): ψ_s; phi (B, H, n): the piece's φ; beta (H,).

Query t sees key s when s is cached and not after t; its bias is β·min(0, min(m_s, min φ_u over the piece's u with
s < u ≤ t) − ψ_s). A key whose bias falls below `threshold` at a query after its own position is gone for that
query, and, since this minimum never rises along the queries, for every later one: that is the KV cache's real eviction,
decided per query and exact (−inf: nothing is evicted). out = softmax(scale·q·kᵀ + bias) · v over the keys kept,
in float32 at least; kept = how many keys each query kept.
"""
from __future__ import annotations

import torch

from fpa_lightning.ops.common import FAR, FREE


def fpa_piece_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_pos: torch.Tensor,
                        path_min: torch.Tensor, level: torch.Tensor, phi: torch.Tensor, beta: torch.Tensor,
                        start: torch.Tensor, scale: float, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """See the module docstring: out (B, n, H, D), kept (B, H, n)."""
    n = q.shape[1]
    work = torch.promote_types(q.dtype, torch.float32)
    query_pos = start[:, None, None] + torch.arange(n, device=q.device)  # (B, 1, n)
    running = path_min.to(work)  # (B, H, S)
    minima = []
    for t in range(n):  # query t moves the path of every key older than itself
        older = key_pos < query_pos[..., t : t + 1]  # (B, H, S)
        running = torch.where(older, torch.minimum(running, phi[..., t : t + 1].to(work)), running)
        minima.append(running)
    bias = beta.to(work)[:, None, None] * (torch.stack(minima, dim=2) - level[:, :, None, :].to(work)).clamp(max=0)
    key = key_pos[:, :, None, :]  # (B, H, 1, S)
    seen = (key != FREE) & (key <= query_pos[..., None])  # (B, H, n, S)
    evicted = (bias < threshold) & (key < query_pos[..., None])  # the query's own key is never dropped
    kept = seen & ~evicted
    scores = torch.einsum("bqhd,bhkd->bhqk", q.to(work), k.to(work)) * scale + bias
    probs = scores.masked_fill(~kept, float("-inf")).softmax(dim=-1)
    out = torch.einsum("bhqk,bhkd->bqhd", probs, v.to(work))
    return out.to(v.dtype), kept.sum(dim=-1)


def path_min_after(path_min: torch.Tensor, phi: torch.Tensor, key_pos: torch.Tensor,
                   start: torch.Tensor) -> torch.Tensor:
    """Every slot's path minimum after the piece's last query, (B, H, S): min(m_s, min φ_u over the piece's u after
    key s). path_min, key_pos (B, H, S); phi (B, H, n); start (B,). O(S + n), no (n, S) table: a key older than the
    piece takes the whole piece's minimum, the piece's own key j the minimum of φ after it (FAR for the last)."""
    n = phi.shape[-1]
    after = phi.flip(-1).cummin(dim=-1).values.flip(-1)  # (B, H, n): min φ over u ≥ j
    after_own = torch.cat([after[..., 1:], torch.full_like(after[..., :1], FAR)], dim=-1)  # over u > j
    j = (key_pos - start[:, None, None]).clamp(-1, n - 1)  # (B, H, S): the key's index in the piece, −1 older
    moved = torch.where(j < 0, after[..., :1], after_own.gather(-1, j.clamp(min=0).long()))
    return torch.minimum(path_min, moved)
