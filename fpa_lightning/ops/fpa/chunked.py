"""FPA's bias one query block at a time (the block decomposition of docs/kernel.md), in PyTorch.

For query rows t in [lo, hi) and keys s < lo the range (s, t] splits into (s, lo) and [lo, t]:
    M(s, t) = min(R(s), pre(t)),  R(s) = min φ over (s, lo),  pre(t) = min φ over [lo, t],
and the soft minimum splits the same way: −log(Σ_{(s,lo)} e^{−φ} + Σ_{[lo,t]} e^{−φ}).
Keys inside the block use the readable definition on the block. Each piece is O(T) per block, so the
whole bias costs O(T²) work and O(T·block) memory. Dip-sum carries per-key sums of earlier dips.
"""
from __future__ import annotations

import torch

from fpa_lightning.ops.blockwise import blockwise_attention, grow_carry
from fpa_lightning.ops.common import FAR
from fpa_lightning.ops.fpa.naive import check_variant, straight_through_range_min


def _before_block_range_min(phi_h: torch.Tensor, lo: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact and soft minimum of φ over (s, lo) for each key s < lo. phi_h (B, H, T) -> two (B, H, lo).

    The empty range (s = lo − 1) is +FAR: it never wins the exact minimum and adds e^{−FAR} = 0 to the soft one.
    """
    later = phi_h[..., 1:lo]  # φ_u for u in [1, lo): the range of key s starts at s + 1
    exact = later.flip(-1).cummin(dim=-1).values.flip(-1)
    soft = -(-later).flip(-1).logcumsumexp(dim=-1).flip(-1)
    far = phi_h.new_full((*phi_h.shape[:-1], 1), FAR)
    return torch.cat([exact, far], dim=-1), torch.cat([soft, far], dim=-1)


def fpa_bias_block(
    phi_h: torch.Tensor,
    psi_h: torch.Tensor,
    beta: torch.Tensor,
    lo: int,
    hi: int,
    carry: torch.Tensor | None = None,
    *,
    reduction: str = "min",
    level: str = "key",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rows lo..hi-1 of the FPA bias over keys 0..hi-1: (B, H, hi − lo, hi); entries s > t are 0 (masked later).

    phi_h, psi_h: (B, H, T) head-major field and level; beta (H,). carry: dip-sum's Σ_{s<u<lo} min(0, φ_u − ψ_s)
    for keys s < lo, (B, H, lo); unused (None) for the min reduction.
    """
    n = hi - lo
    rows = torch.arange(lo, hi, device=phi_h.device)
    keys = torch.arange(hi, device=phi_h.device)
    after_key = rows[:, None] > keys[None, :]  # (n, hi)
    phi_rows = phi_h[..., lo:hi, None].expand(-1, -1, n, hi)  # (B, H, n, hi): φ_u at [u, s]
    if reduction == "dipsum":
        dips = phi_rows - psi_h[..., None, :hi]
        dips = torch.where(after_key & (dips < 0), dips, torch.zeros_like(dips))
        depth_sum = grow_carry(carry, hi, phi_h)[..., None, :] + dips.cumsum(dim=-2)
        bias = torch.where(after_key, depth_sum, torch.zeros_like(depth_sum))
        return beta.to(bias.dtype)[:, None, None] * bias, depth_sum[..., -1, :]

    inside = straight_through_range_min(phi_rows[..., lo:], after_key[:, lo:])  # (B, H, n, n)
    if lo > 0:
        before_exact, before_soft = _before_block_range_min(phi_h, lo)  # (B, H, lo)
        pre_exact = phi_h[..., lo:hi].cummin(dim=-1).values  # (B, H, n)
        pre_soft = -(-phi_h[..., lo:hi]).logcumsumexp(dim=-1)
        exact = torch.minimum(before_exact[..., None, :], pre_exact[..., :, None])  # (B, H, n, lo)
        soft = -torch.logaddexp(-before_soft[..., None, :], -pre_soft[..., :, None])
        outside = soft + (exact - soft).detach()
        range_min = torch.cat([outside, inside], dim=-1)  # (B, H, n, hi)
    else:
        range_min = inside
    level_of_pair = psi_h[..., lo:hi, None] if level == "query" else psi_h[..., None, :hi]
    depth = range_min - level_of_pair
    bias = torch.where(after_key & (depth < 0), depth, torch.zeros_like(depth))
    return beta.to(bias.dtype)[:, None, None] * bias, None


def chunked_fpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    phi: torch.Tensor,
    psi: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    block_size: int = 64,
    reduction: str = "min",
    level: str = "key",
    segment_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """FPA attention in query blocks (O(T·block) memory); same signature and values as naive_fpa_attention."""
    check_variant(reduction, level)
    phi_h, psi_h = phi.transpose(1, 2), psi.transpose(1, 2)  # (B, H, T)

    def bias_block(lo: int, hi: int, carry):
        return fpa_bias_block(phi_h, psi_h, beta, lo, hi, carry, reduction=reduction, level=level)

    return blockwise_attention(q, k, v, bias_block, scale=scale, block_size=block_size, segment_ids=segment_ids)
