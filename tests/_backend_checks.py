"""Checks of an attention backend that the backend tests (tests/attention) and the kernels' tests (tests/ops) share."""
import torch

from fpa_lightning.ops.common import dense_attention


def check_fused_path_matches_dense_bias(backend, device):
    """The backend's fused path (its Triton kernel: the interpreter on the CPU, the GPU there) against dense attention
    over its materialised bias, in float32: the output and every parameter's gradient agree. One batch row, two heads
    of 16, 21 tokens (two tiles of 16 in the interpreter), for a backend of width 32: what is checked is what the
    backend hands to the kernel, which no batch size changes (the kernels' own tests check their batch rows)."""
    gen = torch.Generator().manual_seed(5)
    # x (B, T, C); q, k, v (B, T, H, D)
    x, q, k, v = (torch.randn(shape, generator=gen).to(device) for shape in [(1, 21, 32)] + [(1, 21, 2, 16)] * 3)
    results = []
    for path in ("fused", "naive"):
        backend.zero_grad()
        ingredients = backend.ingredients(x, q, k)
        out = (backend.fused(q, k, v, ingredients) if path == "fused"
               else dense_attention(q, k, v, backend.dense_bias(ingredients), scale=backend.scale))
        (out * torch.linspace(-1, 1, out.numel(), device=device).view_as(out)).sum().backward()
        results.append([out.detach()] + [p.grad.clone() for p in backend.parameters()])
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
