"""FoX: the readable definition (naive_fox_attention) against the dense definition with loops, and FlexAttention
(CUDA-only) against the definition."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fpa_lightning.ops.common import dense_attention
from fpa_lightning.ops.fox.flex import fox_flex_attention
from fpa_lightning.ops.fox.naive import naive_fox_attention

NAMES = ("out", "dq", "dk", "dv", "dc")


def _inputs(B, T, H, D, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    c = F.logsigmoid(2.0 + torch.randn(B, T, H, generator=g, dtype=torch.float64)).cumsum(1)
    do = torch.randn(B, T, H, D, generator=g, dtype=torch.float64)
    return (q, k, v, c), do


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


# --- CPU: the pieces FlexAttention is given (score_mod, the block masks, the padding), against the dense definition
# b[t, s] = Σ_{s<u≤t} log σ(f_u), written here with loops. fox_flex_attention itself refuses CPU tensors and
# FlexAttention has no CPU backward, so the tests take the uncompiled core of ``fox_flex._compiled`` and prepare its
# inputs as fox_flex_attention does (heads first, padded to ``padded_length``, the key side a clone).

def _core(monkeypatch, flex):
    """fox_flex's uncompiled core with ``flex`` in place of FlexAttention."""
    import torch.nn.attention.flex_attention as flex_module

    from fpa_lightning.ops.fox import flex as fox_flex

    monkeypatch.setattr(flex_module, "flex_attention", flex)
    compiled = fox_flex._compiled.__wrapped__()  # a fresh core (the cached one keeps the real flex_attention)
    return getattr(compiled, "_torchdynamo_orig_callable", None) or compiled.__wrapped__


def _fox_reference_bias(f: torch.Tensor) -> torch.Tensor:
    """(B, T, H) forget logits -> (B, H, T, T): b[t, s] = Σ_{s<u≤t} log σ(f_u) for s ≤ t, −inf above the diagonal;
    the sum over u is a dense mask (s < u ≤ t), not a difference of cumulative sums."""
    T = f.shape[1]
    t, s, u = torch.arange(T)[:, None, None], torch.arange(T)[None, :, None], torch.arange(T)[None, None, :]
    between = ((s < u) & (u <= t)).to(f.dtype)  # (T, T, T)
    bias = torch.einsum("tsu,buh->bhts", between, F.logsigmoid(f))
    return bias.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))


def test_naive_matches_the_definition_with_loops():
    """naive_fox_attention (c = cumsum log σ(f), bias c_t − c_s) is softmax attention under the bias that sums
    log σ(f_u) over s < u ≤ t, with and without documents."""
    B, T, H, D = 2, 23, 3, 16
    g = torch.Generator().manual_seed(3)
    f = 2.0 + torch.randn(B, T, H, generator=g, dtype=torch.float64)
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    seg = torch.tensor([[0] * 9 + [1] * 14, [0] * 23])
    for segment_ids in (None, seg):
        got = naive_fox_attention(q, k, v, F.logsigmoid(f).cumsum(dim=1), segment_ids=segment_ids)
        want = dense_attention(q, k, v, _fox_reference_bias(f), segment_ids=segment_ids)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def _flex_inputs(q, k, v, c):
    """What fox_flex_attention hands FlexAttention: (B, H, Tp, D) q, k, v and the query/key copies of c (B, H, Tp)."""
    from fpa_lightning.ops.fox.flex import padded_length

    pad = padded_length(q.shape[1]) - q.shape[1]
    heads_first = [F.pad(t, (0, 0, 0, 0, 0, pad)).transpose(1, 2) for t in (q, k, v)]
    cq = F.pad(c, (0, 0, 0, pad)).transpose(1, 2).contiguous()
    return heads_first, cq, cq.clone(), pad


def _index_grid(B, H, Tp):
    return (torch.arange(B).view(B, 1, 1, 1), torch.arange(H).view(1, H, 1, 1), torch.arange(Tp).view(1, 1, Tp, 1),
            torch.arange(Tp).view(1, 1, 1, Tp))


def test_score_mod_adds_the_fox_bias_on_cpu(monkeypatch):
    """score_mod(score, b, h, t, s) = score + b[t, s], on index tensors, and its gradient reaches the forget logits
    as the definition's does (through both copies of c)."""
    B, T, H, D = 2, 37, 3, 16
    g = torch.Generator().manual_seed(5)
    f = (2.0 + torch.randn(B, T, H, generator=g, dtype=torch.float64)).requires_grad_()
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    captured = {}

    def record(q, k, v, score_mod=None, block_mask=None, scale=None):
        captured.update(score_mod=score_mod, block_mask=block_mask, scale=scale)
        return torch.zeros_like(q)

    c = F.logsigmoid(f).cumsum(dim=1)  # the FoX backend's ingredient: c = cumsum log σ(f)
    heads_first, cq, ck, pad = _flex_inputs(q, k, v, c)
    _core(monkeypatch, record)(*heads_first, cq, ck, "mask", 0.25)
    assert captured["block_mask"] == "mask" and captured["scale"] == 0.25
    score = torch.randn(B, H, T + pad, T + pad, generator=g, dtype=torch.float64)
    bias = captured["score_mod"](score, *_index_grid(B, H, T + pad)) - score  # (B, H, Tp, Tp)
    reference = _fox_reference_bias(f)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    torch.testing.assert_close(bias[:, :, :T, :T][..., causal], reference[..., causal], rtol=1e-12, atol=1e-12)
    weights = torch.randn(B, H, T, T, generator=g, dtype=torch.float64) * causal
    (grad,) = torch.autograd.grad((bias[:, :, :T, :T] * weights).sum(), f)
    (want,) = torch.autograd.grad((reference.masked_fill(~causal, 0) * weights).sum(), f)
    torch.testing.assert_close(grad, want, rtol=1e-10, atol=1e-12)


def test_block_masks_on_cpu():
    """The causal mask and the document mask_mod (padded positions a document of their own, id −1) on index tensors."""
    from fpa_lightning.ops.fox.flex import _causal_block_mask, _document_block_mask, padded_length

    B, T = 2, 37
    Tp = padded_length(T)
    _, _, t, s = _index_grid(1, 1, Tp)
    causal = _causal_block_mask(Tp, "cpu").mask_mod(0, 0, t, s)[0, 0]
    assert torch.equal(causal, torch.ones(Tp, Tp, dtype=torch.bool).tril())
    seg = _segments(B, T, seed=3) * 0
    seg[0, 10:], seg[0, 11:], seg[1, 30:] = 1, 2, 1  # a one-token document, a boundary inside a row
    mask = _document_block_mask(F.pad(seg, (0, Tp - T), value=-1))
    for b in range(B):
        got = mask.mask_mod(b, 0, t, s)[0, 0]
        ids = [int(seg[b, i]) if i < T else -1 for i in range(Tp)]
        want = torch.tensor([[s_ <= t_ and ids[s_] == ids[t_] for s_ in range(Tp)] for t_ in range(Tp)])
        assert torch.equal(got, want), b
        assert got.diagonal().all()  # every row, padded ones too, sees its own key: no empty softmax


@pytest.mark.parametrize("documents", [False, True])
def test_flex_forward_on_cpu_matches_the_definition(documents, monkeypatch):
    """The core with the real FlexAttention (eager; forward only on a CPU) and the library's block masks, in float64,
    against softmax(q·kᵀ/√D + b) v with b from the loops."""
    from fpa_lightning.ops.fox.flex import _causal_block_mask, _document_block_mask, padded_length
    from torch.nn.attention.flex_attention import flex_attention

    B, T, H, D = 2, 37, 2, 16
    g = torch.Generator().manual_seed(9)
    f = 2.0 + torch.randn(B, T, H, generator=g, dtype=torch.float64)
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    seg = _segments(B, T, seed=4) * 0
    seg[0, 12:], seg[1, 20:], seg[1, 21:] = 1, 1, 2
    Tp = padded_length(T)
    heads_first, cq, ck, pad = _flex_inputs(q, k, v, F.logsigmoid(f).cumsum(dim=1))
    block_mask = (_document_block_mask(F.pad(seg, (0, pad), value=-1)) if documents
                  else _causal_block_mask(Tp, "cpu"))
    out = _core(monkeypatch, flex_attention)(*heads_first, cq, ck, block_mask, 1 / D**0.5).transpose(1, 2)[:, :T]
    bias = _fox_reference_bias(f)
    scores = torch.einsum("bthd,bshd->bhts", q, k) / D**0.5 + bias
    if documents:
        scores = scores.masked_fill(seg[:, None, :, None] != seg[:, None, None, :], float("-inf"))
    want = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), v)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)


def test_query_side_of_the_bias_has_exactly_zero_gradient():
    """Why fox_flex_attention may detach the query side of c: a per-query term adds one constant to a softmax row,
    and each row of dS sums to zero, so its gradient is zero (float64: rounding only), while the key side's is not."""
    (q, k, v, c), do = _inputs(2, 37, 3, 8, seed=5)
    cq, ck = c.clone().requires_grad_(), c.clone().requires_grad_()
    out = dense_attention(q, k, v, cq.transpose(1, 2)[..., :, None] - ck.transpose(1, 2)[..., None, :])
    out.backward(do)
    assert ck.grad.abs().max() > 1e-2
    assert cq.grad.abs().max() < 1e-12 * ck.grad.abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 256, 3, 64), (1, 1000, 2, 64), (1, 2048, 2, 128), (2, 129, 2, 32)])
def test_gpu_matches_float64_reference(shape):
    inputs, do = _inputs(*shape, seed=sum(shape))
    ref = _run(naive_fox_attention, inputs, do, torch.float64, "cuda")
    same = _run(naive_fox_attention, inputs, do, torch.bfloat16, "cuda")
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
    """The document mask_mod: causal and same-document, against naive_fox_attention(segment_ids=)."""
    inputs, do = _inputs(*shape, seed=sum(shape) + 1)
    seg = _segments(shape[0], shape[1], seed=shape[1]).cuda()

    def ref(q, k, v, c):
        return naive_fox_attention(q, k, v, c, segment_ids=seg)

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
