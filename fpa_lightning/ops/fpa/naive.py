"""The readable definition of FPA (path-minimum forgetting attention), docs/method.md.

    b[t, s] = β · min(0, min_{s<u≤t} φ_u − ψ_s)   for s < t,   b[t, t] = 0,   s > t masked.

Forward: the exact range minimum. Backward: straight-through, the range minimum's gradient is
that of the soft minimum  −τ·log Σ_{u∈(s,t]} exp(−φ_u/τ)  with τ = 1 (softmax weights over the
range). A pair (t, s) is *dead* when min φ − ψ_s < 0 strictly; a live pair's bias is exactly 0 and
sends no gradient to φ, ψ or β.

Everything is materialised as (B, H, T, T): O(T²) memory, any dtype (float64 for references).
"""
from __future__ import annotations

import math

import torch

from fpa_lightning.ops.common import FAR, dense_attention

# The FPA variants the op defines (docs/method.md): the path minimum or the sum of dips (ablation), compared with
# the key's level ψ_s or the query's ψ_t (ablation). "No level" (h = 0) is a parameterisation, ψ = W: a key level.
REDUCTIONS = ("min", "dipsum")
LEVELS = ("key", "query")


def straight_through_range_min(phi_rows: torch.Tensor, in_range: torch.Tensor) -> torch.Tensor:
    """min over u of phi_rows[..., u, s] where in_range[u, s], cumulative along u.

    phi_rows: (..., U, S), the field value of row u broadcast over columns s.
    in_range: (U, S) bool, True where u belongs to the range that ends at row u (i.e. u > s).
    Returns (..., U, S): entry [t, s] = min of phi over rows u ≤ t with in_range[u, s];
    value = exact minimum, gradient = soft minimum's (τ = 1). Entries with an empty range are
    huge (≥ FAR / 2) and must be masked by the caller.
    """
    exact = torch.where(in_range, phi_rows, FAR).cummin(dim=-2).values
    soft = -torch.where(in_range, -phi_rows, -FAR).logcumsumexp(dim=-2)
    return soft + (exact - soft).detach()


def fpa_bias(
    phi: torch.Tensor,
    psi: torch.Tensor,
    beta: torch.Tensor,
    *,
    reduction: str = "min",
    level: str = "key",
) -> torch.Tensor:
    """The FPA bias b[t, s] for all pairs, (B, H, T, T); entries s > t are −inf.

    phi, psi: (B, T, H) field and level; beta: (H,) positive scale.
    reduction "min": the path minimum (the method); "dipsum": β·Σ_{s<u≤t} min(0, φ_u − ψ_s)
    (the ablation that sums dips instead of taking the deepest).
    level "key": compare with ψ_s (the method); "query": with ψ_t (ablation).
    """
    check_variant(reduction, level)
    T = phi.shape[1]
    idx = torch.arange(T, device=phi.device)
    after_key = idx[:, None] > idx[None, :]  # (T, T) [u or t, s]: True where s < u
    phi_rows = phi.transpose(1, 2)[..., :, None].expand(-1, -1, T, T)  # (B, H, T, T): φ_u at [u, s]
    psi_h = psi.transpose(1, 2)  # (B, H, T)
    if reduction == "min":
        level_of_pair = psi_h[..., :, None] if level == "query" else psi_h[..., None, :]  # ψ_t or ψ_s
        depth = straight_through_range_min(phi_rows, after_key) - level_of_pair  # (B, H, T, T)
        bias = torch.where(after_key & (depth < 0), depth, torch.zeros_like(depth))
    else:  # Σ_{s<u≤t} min(0, φ_u − ψ_s): a cumulative sum of dips down the rows
        dips = phi_rows - psi_h[..., None, :]
        bias = torch.where(after_key & (dips < 0), dips, torch.zeros_like(dips)).cumsum(dim=-2)
    bias = beta.to(bias.dtype)[None, :, None, None] * bias
    return bias.masked_fill(idx[None, :] > idx[:, None], float("-inf"))


def check_skip_threshold(op: str, skip_threshold) -> None:
    """Raise unless skip_threshold is None or a finite negative number (a bias bound; 0 or more would drop live
    pairs, whose bias is 0)."""
    if skip_threshold is not None and not (
        isinstance(skip_threshold, (int, float)) and math.isfinite(skip_threshold) and skip_threshold < 0
    ):
        raise ValueError(f"{op}: skip_threshold must be a finite negative float or None, got {skip_threshold!r}")


def check_variant(reduction: str, level: str) -> None:
    """Raise for an FPA variant that docs/method.md does not define."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"FPA reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if level not in LEVELS:
        raise ValueError(f"FPA level must be one of {LEVELS} ('none' is h = 0, a key level), got {level!r}")
    if reduction == "dipsum" and level == "query":
        raise ValueError("FPA ablations combine dipsum with the key level only (docs/method.md); got level='query'")


def naive_fpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    phi: torch.Tensor,
    psi: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    reduction: str = "min",
    level: str = "key",
    segment_ids: torch.Tensor | None = None,
    skip_threshold: float | None = None,
    skip_tile: int = 64,
) -> torch.Tensor:
    """Causal FPA attention, the reference: q, k, v (B, T, H, D); phi, psi (B, T, H); beta (H,).

    Returns (B, T, H, D). Exact range-minimum forward, straight-through soft-minimum backward. ``reduction`` and
    ``level`` select the variant (``fpa_bias``); ``segment_ids`` (B, T) restricts every query to keys of its own
    document (a path (s, t] inside one document never crosses a boundary, so the field needs no restart here).
    ``skip_threshold`` defines the fused kernel's skipping (docs/kernel.md, §3): the pairs of every off-diagonal
    tile of ``skip_tile`` rows and columns (the kernel's: 64 on the GPU) whose largest bias is below it are masked.
    """
    check_skip_threshold("naive_fpa_attention", skip_threshold)
    bias = fpa_bias(phi, psi, beta, reduction=reduction, level=level)
    if skip_threshold is not None:
        bias = bias.masked_fill(skipped_tiles(bias.detach(), skip_threshold, skip_tile), float("-inf"))
    return dense_attention(q, k, v, bias, scale=scale, segment_ids=segment_ids)


def skipped_tiles(bias: torch.Tensor, threshold: float, tile: int) -> torch.Tensor:
    """The pairs that skipping at `threshold` drops: (B, H, T, T) bool, True in every tile (query block I, key
    block J < I, `tile` rows and columns from position 0) whose largest bias (over all its pairs, documents or not:
    the kernel's bound) is below the threshold. Diagonal tiles are always kept. bias: (B, H, T, T), −inf for s > t."""
    T = bias.shape[-1]
    tile_max = tile_maxima(bias, tile)  # (B, H, nI, nJ)
    n = tile_max.shape[-1]
    off_diagonal = torch.ones(n, n, dtype=torch.bool, device=bias.device).tril(-1)
    skipped = (tile_max < threshold) & off_diagonal
    return skipped.repeat_interleave(tile, -2).repeat_interleave(tile, -1)[..., :T, :T]


def tile_maxima(x: torch.Tensor, tile: int) -> torch.Tensor:
    """x (..., R, C) -> (..., ceil(R / tile), ceil(C / tile)): the largest entry of each tile of `tile` rows and
    columns counted from (0, 0); a partial tile's missing entries count as −inf."""
    R, C = x.shape[-2:]
    nr, nc = -(-R // tile), -(-C // tile)
    padded = torch.nn.functional.pad(x, (0, nc * tile - C, 0, nr * tile - R), value=float("-inf"))
    return padded.unflatten(-1, (nc, tile)).unflatten(-3, (nr, tile)).amax(dim=(-3, -1))
