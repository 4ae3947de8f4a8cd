"""The fused FPA kernel with document masking (GPU): fpa_attention(..., segment_ids=) against the float64 reference
naive_fpa_attention(..., segment_ids=), outputs and every gradient, within 2× the same-precision PyTorch error."""
import pytest
import torch

from fpa_lightning.ops.fpa import fpa_attention, naive_fpa_attention

pytestmark = pytest.mark.gpu
NAMES = ("out", "dq", "dk", "dv", "dphi", "dpsi", "dbeta")


def inputs(B, T, H, D, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    phi = (torch.randn(B, T, H, generator=g, dtype=torch.float64) - 0.05).cumsum(1)
    psi = phi + torch.randn(B, T, H, generator=g, dtype=torch.float64)
    beta = torch.rand(H, generator=g, dtype=torch.float64) + 0.5
    starts = torch.rand(B, T, generator=g) < 4 / T  # about four documents a row, at random places
    starts[:, 0] = False
    starts[0, min(T - 1, 64)] = True  # one boundary on a tile edge
    return (q, k, v, phi, psi, beta), starts.long().cumsum(1), torch.randn(B, T, H, D, generator=g, dtype=torch.float64)


def run(fn, tensors, segment_ids, grad_out, qkv_dtype):
    args = [t.cuda().to(qkv_dtype if i < 3 else (torch.float64 if qkv_dtype == torch.float64 else torch.float32))
            .requires_grad_() for i, t in enumerate(tensors)]
    out = fn(*args, segment_ids=segment_ids.cuda())
    out.backward(grad_out.cuda().to(out.dtype))
    return [out.detach().double().cpu()] + [a.grad.double().cpu() for a in args]


@pytest.mark.parametrize("shape", [(2, 300, 2, 64), (1, 1024, 3, 128), (2, 129, 2, 32)])
def test_document_masked_kernel_matches_float64_reference(shape):
    tensors, segment_ids, grad_out = inputs(*shape, seed=sum(shape))
    ref = run(naive_fpa_attention, tensors, segment_ids, grad_out, torch.float64)
    same = run(naive_fpa_attention, tensors, segment_ids, grad_out, torch.bfloat16)
    got = run(fpa_attention, tensors, segment_ids, grad_out, torch.bfloat16)
    for name, r, s, g in zip(NAMES, ref, same, got):
        assert torch.isfinite(g).all(), name
        e_kernel, e_torch = (g - r).abs().max().item(), (s - r).abs().max().item()
        floor = 8 * torch.finfo(torch.float32).eps * (1.0 + r.abs().max().item())
        assert e_kernel <= 2 * e_torch + floor, f"{name}: kernel error {e_kernel:.3e} > 2x torch error {e_torch:.3e}"
