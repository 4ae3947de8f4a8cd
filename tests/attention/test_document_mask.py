"""Document masking: a packed row with ``attention.document_mask`` equals its documents run one by one (float64,
naive and chunked, every backend and FPA variant; values and every parameter gradient)."""
import pytest
import torch

from fpa_lightning import AttentionConfig, Decoder, ModelConfig
from fpa_lightning.ops.blockwise import blockwise_attention
from fpa_lightning.ops.common import cumsum_within_documents, dense_attention
from fpa_lightning.ops.dcp import dcp_attention_gpu, dcp_bias
from fpa_lightning.ops.fpa.chunked import chunked_fpa_attention
from fpa_lightning.ops.fpa.naive import naive_fpa_attention
from fpa_lightning.ops.selective import selective_attention_gpu, selective_bias

VOCAB = 61
DOCUMENTS = [[13, 20, 7], [1, 25, 14]]  # document lengths per row: boundaries inside and across 8-row blocks
VARIANTS = {
    "sdpa": {}, "alibi": {}, "fox": {}, "selective": {}, "dcp": {"dcp_dim": 6},
    "fpa": {}, "fpa-stack": {"fpa_form": "stack"}, "fpa-dipsum": {"fpa_reduction": "dipsum"},
    "fpa-level-query": {"fpa_level": "query"}, "fox-alibi-positional": {"positional": "alibi"},
}


def segments(lengths_per_row) -> torch.Tensor:
    return torch.stack([torch.cat([torch.full((n,), i) for i, n in enumerate(row)]) for row in lengths_per_row])


def tiny_model(variant: str, impl: str, document_mask: bool = True) -> Decoder:
    attention = AttentionConfig(backend=variant.split("-")[0], impl=impl, block_size=8, document_mask=document_mask,
                                **VARIANTS[variant])
    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=VOCAB, n_layer=2, d_model=24, n_head=3, d_mlp=40, attention=attention))
    model = model.double()
    with torch.no_grad():  # away from the symmetric init, so every gate matters
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def logits_and_grads(model, pieces):
    """pieces: [(ids (1 or B, n), segment_ids or None, output weights)]; logits per piece and summed gradients."""
    model.zero_grad()
    outs = []
    for ids, seg, weights in pieces:
        logits = model(ids, seg)
        (logits * weights).sum().backward()
        outs.append(logits.detach())
    return outs, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


# chunked for every variant; naive (masked by dense_attention, the reference) for one variant of each backend
CASES = [(v, "chunked") for v in sorted(VARIANTS)] + [(v, "naive") for v in ("fpa", "fox", "sdpa", "selective", "dcp")]


@pytest.mark.parametrize("variant, impl", CASES)
def test_masked_row_equals_its_documents_one_by_one(variant, impl, one_thread_per_module):
    seg = segments(DOCUMENTS)
    ids = torch.randint(0, VOCAB, seg.shape, generator=torch.Generator().manual_seed(1))
    weights = torch.randn(*seg.shape, VOCAB, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    model = tiny_model(variant, impl)
    (packed,), packed_grads = logits_and_grads(model, [(ids, seg, weights)])
    one_by_one = [(ids[b:b + 1, seg[b] == d], None, weights[b:b + 1, seg[b] == d])
                  for b in range(seg.shape[0]) for d in range(len(DOCUMENTS[b]))]
    alone, alone_grads = logits_and_grads(model, one_by_one)
    torch.testing.assert_close(torch.cat([a[0] for a in alone]), packed.flatten(0, 1), rtol=1e-10, atol=1e-10)
    for name, grad in packed_grads.items():
        torch.testing.assert_close(alone_grads[name], grad, rtol=1e-9, atol=1e-10, msg=name)


def test_off_by_default_and_then_documents_see_each_other():
    assert AttentionConfig().document_mask is False
    seg = segments(DOCUMENTS)
    ids = torch.randint(0, VOCAB, seg.shape, generator=torch.Generator().manual_seed(1))
    model = tiny_model("fpa", "chunked", document_mask=False)
    second = seg[0] == 1
    assert not torch.allclose(model(ids, seg)[0, second], model(ids[:1, second])[0])


def test_sdpa_fused_path_masks_documents_on_cpu():
    seg = segments(DOCUMENTS)
    ids = torch.randint(0, VOCAB, seg.shape, generator=torch.Generator().manual_seed(1))
    fused, naive = tiny_model("sdpa", "fused"), tiny_model("sdpa", "naive")
    torch.testing.assert_close(fused(ids, seg), naive(ids, seg), rtol=1e-10, atol=1e-10)


def test_cumsum_within_documents_restarts_at_every_document():
    seg = segments(DOCUMENTS)
    x = torch.randn(*seg.shape, 3, dtype=torch.float64)
    got = cumsum_within_documents(x, seg)
    for b in range(seg.shape[0]):
        for d in seg[b].unique():
            torch.testing.assert_close(got[b, seg[b] == d], x[b, seg[b] == d].cumsum(0), rtol=0, atol=1e-12)


def qkv(B, T, H=2, D=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, T, H, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]


@pytest.mark.parametrize("reduction, level", [("min", "key"), ("min", "query"), ("dipsum", "key")])
def test_chunked_fpa_op_matches_naive_with_segment_ids(reduction, level):
    seg = segments(DOCUMENTS)
    q, k, v = qkv(*seg.shape)
    g = torch.Generator().manual_seed(5)
    phi = (torch.randn(*seg.shape, 2, generator=g, dtype=torch.float64) * 2).cumsum(1).requires_grad_()
    psi = (phi + torch.randn(*seg.shape, 2, generator=g, dtype=torch.float64)).detach().requires_grad_()
    beta = torch.tensor([0.7, 1.3], dtype=torch.float64, requires_grad=True)
    inputs = (q, k, v, phi, psi, beta)
    kw = dict(reduction=reduction, level=level, segment_ids=seg)
    naive = naive_fpa_attention(*inputs, **kw)
    chunked = chunked_fpa_attention(*inputs, block_size=8, **kw)
    torch.testing.assert_close(chunked, naive, rtol=0, atol=1e-12)
    grad_out = torch.randn_like(naive)
    for a, b in zip(torch.autograd.grad(chunked, inputs, grad_out), torch.autograd.grad(naive, inputs, grad_out)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


def test_blockwise_without_bias_matches_dense_with_segment_ids():
    seg = segments(DOCUMENTS)
    q, k, v = qkv(*seg.shape, seed=3)
    torch.testing.assert_close(blockwise_attention(q, k, v, None, block_size=8, segment_ids=seg),
                               dense_attention(q, k, v, None, segment_ids=seg), rtol=0, atol=1e-12)


def test_selective_and_dcp_sdpa_paths_mask_documents():
    """The fast paths' one (B, 1, T, T) bias carries the document mask (SDPA also runs on a CPU)."""
    seg = segments(DOCUMENTS)
    q, k, v = qkv(*seg.shape, seed=4)
    g = torch.Generator().manual_seed(6)
    qi, ki = (torch.randn(*seg.shape, 4, generator=g, dtype=torch.float64) for _ in range(2))
    offset = torch.tensor(0.9, dtype=torch.float64)
    cases = [
        (selective_attention_gpu(q, k, v, segment_ids=seg), selective_bias(q, k, segment_ids=seg)),
        (dcp_attention_gpu(q, k, v, qi, ki, offset, segment_ids=seg), dcp_bias(qi, ki, offset, segment_ids=seg)),
    ]
    for fast, bias in cases:
        torch.testing.assert_close(fast, dense_attention(q, k, v, bias, segment_ids=seg), rtol=0, atol=1e-12)
