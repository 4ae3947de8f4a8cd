"""ALiBi (the positional baseline): per-head geometric slopes, written as a FoX-style cumulative gate so that the
FoX bias functions (b[t, s] = c_t − c_s) serve it too."""
from __future__ import annotations

import torch


def alibi_slopes(n_head: int, device=None) -> torch.Tensor:
    """ALiBi's geometric head slopes 2^(−8·(h+1)/H), (H,)."""
    return torch.pow(2.0, -8.0 * torch.arange(1, n_head + 1, device=device, dtype=torch.float32) / n_head)


def alibi_cumulative(slopes: torch.Tensor, batch: int, T: int) -> torch.Tensor:
    """ALiBi as a FoX-style cumulative gate: c_t = −m_h·t, (B, T, H)."""
    t = torch.arange(T, device=slopes.device, dtype=torch.float32)
    return (-t[:, None] * slopes[None, :]).expand(batch, T, -1)


def alibi_decode_bias(slopes: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:
    """ALiBi for queries at query_pos (B, n) over cached keys at key_pos (B, H, S): (B, H, n, S), computed as
    c_t − c_s with c = −m_h·position in float32, exactly as the parallel path computes it (same rounding)."""
    m = slopes.to(key_pos.device)[None, :, None]  # (1, H, 1)
    c_query = -query_pos[:, None, :].to(torch.float32) * m  # (B, H, n)
    c_key = -key_pos.to(torch.float32) * m  # (B, H, S)
    return c_query[..., :, None] - c_key[..., None, :]
