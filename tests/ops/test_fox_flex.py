"""FoX through FlexAttention: CUDA-only, checked against dense_attention with bias c_t − c_s."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fpa_lightning.ops.fox_flex import fox_flex_attention
from fpa_lightning.ops.common import dense_attention

NAMES = ("out", "dq", "dk", "dv", "dc")


def _inputs(B, T, H, D, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    c = F.logsigmoid(2.0 + torch.randn(B, T, H, generator=g, dtype=torch.float64)).cumsum(1)
    do = torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
    return (q, k, v, c), do


def _ref(q, k, v, c):
    ct = c.transpose(1, 2)  # (B, H, T)
    return dense_attention(q, k, v, ct[..., :, None] - ct[..., None, :])


def _run(fn, inputs, do, dtype, device):
    args = [t.detach().to(device=device, dtype=dtype if i < 3 else (torch.float64 if dtype == torch.float64 else torch.float32)).clone().requires_grad_()
            for i, t in enumerate(inputs)]
    out = fn(*args)
    out.backward(do.to(device=device, dtype=out.dtype))
    return [out.detach().double().cpu()] + [a.grad.double().cpu() for a in args]


def test_cpu_raises_clear_error():
    (q, k, v, c), _ = _inputs(1, 8, 2, 16, 0)
    with pytest.raises(RuntimeError, match="CUDA"):
        fox_flex_attention(q.float(), k.float(), v.float(), c.float())


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 256, 3, 64), (1, 1000, 2, 64), (1, 2048, 2, 128), (2, 129, 2, 32)])
def test_gpu_matches_float64_reference(shape):
    inputs, do = _inputs(*shape, seed=sum(shape))
    ref = _run(_ref, inputs, do, torch.float64, "cuda")
    same = _run(_ref, inputs, do, torch.bfloat16, "cuda")
    got = _run(fox_flex_attention, inputs, do, torch.bfloat16, "cuda")
    for name, r, s, g in zip(NAMES, ref, same, got):
        assert torch.isfinite(g).all(), name
        e_k, e_t = (g - r).abs().max().item(), (s - r).abs().max().item()
        floor = 8 * torch.finfo(torch.float32).eps * (1.0 + r.abs().max().item())
        assert e_k <= 2 * e_t + floor, f"{name}: flex err {e_k:.3e} > 2x torch err {e_t:.3e}"


def _segments(B, T, seed):
    """Packed-row document ids (B, T): 0, 0, ..., 1, 1, ... with random document lengths."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.rand(B, T, generator=g) < 0.01
    starts[:, 0] = False
    return starts.long().cumsum(dim=1)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 700, 2, 64), (1, 2048, 2, 128)])
def test_gpu_document_mask_matches_float64_reference(shape):
    """The document mask_mod: causal and same-document, against dense_attention(segment_ids=)."""
    inputs, do = _inputs(*shape, seed=sum(shape) + 1)
    seg = _segments(shape[0], shape[1], seed=shape[1]).cuda()

    def ref(q, k, v, c):
        ct = c.transpose(1, 2)
        return dense_attention(q, k, v, ct[..., :, None] - ct[..., None, :], segment_ids=seg)

    expected = _run(ref, inputs, do, torch.float64, "cuda")
    same = _run(ref, inputs, do, torch.bfloat16, "cuda")
    got = _run(lambda q, k, v, c: fox_flex_attention(q, k, v, c, segment_ids=seg), inputs, do, torch.bfloat16, "cuda")
    for name, r, s, g in zip(NAMES, expected, same, got):
        e_k, e_t = (g - r).abs().max().item(), (s - r).abs().max().item()
        floor = 8 * torch.finfo(torch.float32).eps * (1.0 + r.abs().max().item())
        assert e_k <= 2 * e_t + floor, f"{name}: flex err {e_k:.3e} > 2x torch err {e_t:.3e}"


@pytest.mark.gpu
def test_gpu_many_lengths_stay_within_the_recompile_limit():
    """Prompts of nine lengths (more than dynamo's default recompile limit of 8): one graph per power of two at most."""
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    for T in (100, 300, 513, 700, 1000, 1500, 2100, 3000, 4100):
        (q, k, v, c), _ = _inputs(1, T, 2, 64, seed=T)
        out = fox_flex_attention(*(t.to("cuda", torch.bfloat16) for t in (q, k, v)), c.float().cuda())
        assert out.shape == (1, T, 2, 64) and torch.isfinite(out).all()
    assert counters["stats"]["unique_graphs"] - before <= 6  # 128, 512, 1024, 2048, 4096, 8192 at worst
