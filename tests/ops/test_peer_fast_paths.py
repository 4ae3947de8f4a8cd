"""The fast paths of Selective Attention and DCP (one layer-shared (B, 1, T, T) bias fed to SDPA) against the
float64 definition: outputs and every gradient. Tolerance: the fast path's error is at most 2× the error of the
same-precision PyTorch definition (float32 on the CPU, bf16 on a GPU)."""
import pytest
import torch

from fpa_lightning.ops.dcp import dcp_attention_gpu, dcp_bias
from fpa_lightning.ops.common import dense_attention
from fpa_lightning.ops.selective import selective_attention_gpu, selective_bias

DEVICES = [("cpu", torch.float32), pytest.param("cuda", torch.bfloat16, marks=pytest.mark.gpu)]


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check_against_float64(fast_fn, reference_fn, inputs, device, dtype):
    """inputs: float64 CPU leaves. fast_fn and reference_fn take the same tensors."""
    leaves64 = [x.clone().requires_grad_() for x in inputs]
    low = [x.to(device=device, dtype=dtype if x.dim() == 4 else torch.float32).detach().requires_grad_() for x in inputs]
    low_ref = [x.detach().clone().requires_grad_() for x in low]
    out64, out_fast, out_ref = reference_fn(*leaves64), fast_fn(*low), reference_fn(*low_ref)
    grad = torch.randn(out64.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    grads64 = torch.autograd.grad(out64, leaves64, grad)
    grads_fast = torch.autograd.grad(out_fast, low, grad.to(device, out_fast.dtype))
    grads_ref = torch.autograd.grad(out_ref, low_ref, grad.to(device, out_ref.dtype))
    pairs = [("out", out_fast, out_ref, out64)] + [
        (f"grad{i}", gf, gr, g64) for i, (gf, gr, g64) in enumerate(zip(grads_fast, grads_ref, grads64))
    ]
    for name, fast, same_precision, exact in pairs:
        exact = exact.to(device)
        assert torch.isfinite(fast).all(), name
        fast_err, ref_err = relative_error(fast, exact), relative_error(same_precision, exact)
        assert fast_err <= 2 * ref_err + 1e-12, f"{name}: fast {fast_err:.2e} vs same-precision torch {ref_err:.2e}"


@pytest.mark.parametrize("device, dtype", DEVICES)
@pytest.mark.parametrize("T", [1, 17, 130])
def test_selective_fast_path(device, dtype, T):
    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(2, T, 3, 16, generator=g, dtype=torch.float64) for _ in range(3))

    def reference(q, k, v):
        return dense_attention(q, k, v, selective_bias(q, k))

    check_against_float64(selective_attention_gpu, reference, [q, k, v], device, dtype)


@pytest.mark.parametrize("device, dtype", DEVICES)
@pytest.mark.parametrize("T", [1, 17, 130])
def test_dcp_fast_path(device, dtype, T):
    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(2, T, 3, 16, generator=g, dtype=torch.float64) for _ in range(3))
    qi, ki = (torch.randn(2, T, 8, generator=g, dtype=torch.float64) for _ in range(2))
    offset = torch.tensor(0.3, dtype=torch.float64)

    def reference(q, k, v, qi, ki, offset):
        return dense_attention(q, k, v, dcp_bias(qi, ki, offset))

    check_against_float64(dcp_attention_gpu, reference, [q, k, v, qi, ki, offset], device, dtype)
