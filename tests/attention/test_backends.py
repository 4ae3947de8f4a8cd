"""Every backend's memory-efficient (chunked) path equals its materialised (naive) path in float64 — outputs and
every parameter gradient — plus causality, the FoX special case of FPA, probes and implementation resolution."""
import dataclasses

import pytest
import torch

from _backend_checks import check_fused_path_matches_dense_bias
from fpa_lightning import AttentionConfig, Decoder, ModelConfig
from fpa_lightning.ops.blockwise import blockwise_attention
from fpa_lightning.ops.fox.naive import fox_bias, fox_bias_block
from fpa_lightning.ops.fpa.chunked import chunked_fpa_attention
from fpa_lightning.ops.common import dense_attention
from fpa_lightning.ops.fpa.naive import naive_fpa_attention

VOCAB = 61
VARIANTS = {
    "sdpa": {},
    "nope": {},
    "alibi": {},
    "fox": {},
    "selective": {},
    "dcp": {"dcp_dim": 6},
    "fpa": {},
    "fpa-stack": {"fpa_form": "stack"},
    "fpa-dipsum": {"fpa_reduction": "dipsum"},
    "fpa-level-none": {"fpa_level": "none"},
    "fpa-level-query": {"fpa_level": "query"},
    "fpa-no-layer1-bias": {"bias_layers": [1]},
    "fox-alibi-positional": {"positional": "alibi"},
    "fpa-rope": {"positional": "rope"},
}


def tiny_model(variant: str, impl: str, seed: int = 0) -> Decoder:
    backend = variant.split("-")[0]
    attention = AttentionConfig(backend=backend, impl=impl, block_size=8, **VARIANTS[variant])
    cfg = ModelConfig(vocab_size=VOCAB, n_layer=2, d_model=24, n_head=3, d_mlp=40, attention=attention)
    torch.manual_seed(seed)
    model = Decoder(cfg).double()
    with torch.no_grad():  # move away from the symmetric init so every gate and bias matters
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def outputs_and_grads(model: Decoder, ids: torch.Tensor):
    model.zero_grad()
    logits = model(ids)
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(1), dtype=logits.dtype)
    (logits * weights).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("T", [1, 17, 67])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_chunked_equals_materialised_in_float64(variant, T):
    ids = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(T))
    naive_out, naive_grads = outputs_and_grads(tiny_model(variant, "naive"), ids)
    chunked_out, chunked_grads = outputs_and_grads(tiny_model(variant, "chunked"), ids)
    torch.testing.assert_close(chunked_out, naive_out, rtol=1e-10, atol=1e-10)
    assert naive_grads.keys() == chunked_grads.keys()
    for name, grad in naive_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-9, atol=1e-10, msg=name)
    if T > 1 and ".backend." in "".join(naive_grads):  # the gate maps receive a gradient at all
        assert any(g.abs().sum() > 0 for n, g in naive_grads.items() if ".backend." in n), variant


@pytest.mark.parametrize("impl", ["naive", "chunked"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_causal(variant, impl):
    """Changing the tokens after position t leaves the logits up to t unchanged."""
    model = tiny_model(variant, impl)
    T, t = 23, 13
    ids = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[:, t + 1 :] = torch.randint(0, VOCAB, (2, T - t - 1), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-12)
    assert (a[:, t + 1 :] - b[:, t + 1 :]).abs().max() > 1e-6  # the change is visible later


@pytest.mark.parametrize("T", [1, 9, 40])
def test_fpa_with_fox_gates_is_fox(T):
    """δ = log σ(f) ≤ 0, g = h = 0, β = 1: φ = ψ = W is non-increasing, so min_{(s,t]} φ − ψ_s = W_t − W_s,
    FoX's cumulative log forget gate. Outputs and the q, k, v gradients are identical; the gate gradient is
    not, by design (FPA's straight-through soft minimum spreads it over the range)."""
    g = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(2, T, 3, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    walk = torch.nn.functional.logsigmoid(torch.randn(2, T, 3, generator=g, dtype=torch.float64) * 3).cumsum(1)
    beta = torch.ones(3, dtype=torch.float64)
    fox = dense_attention(q, k, v, fox_bias(walk))
    fox_chunked = blockwise_attention(
        q, k, v, lambda lo, hi, c: (fox_bias_block(walk.transpose(1, 2), lo, hi), None), block_size=4
    )
    for fpa in (naive_fpa_attention(q, k, v, walk, walk, beta), chunked_fpa_attention(q, k, v, walk, walk, beta, block_size=4)):
        torch.testing.assert_close(fpa, fox, rtol=0, atol=1e-14)
        grad_out = torch.randn_like(fpa)
        for a, b in zip(torch.autograd.grad(fpa, (q, k, v), grad_out), torch.autograd.grad(fox, (q, k, v), grad_out, retain_graph=True)):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-13)
    torch.testing.assert_close(fox_chunked, fox, rtol=0, atol=1e-14)


@pytest.mark.parametrize("variant", ["fpa", "fox", "selective", "dcp", "alibi", "fpa-dipsum"])
def test_probe_bias_rows_equal_dense_bias(variant):
    model = tiny_model(variant, "naive")
    ids = torch.randint(0, VOCAB, (2, 30), generator=torch.Generator().manual_seed(3))
    for block, layer_probe in zip(model.blocks, model.probe(ids)):
        x = block.attn_norm(model.embed(ids)) if block is model.blocks[0] else None
        if x is None:
            continue
        backend = block.attn.backend
        q, k, _ = block.attn.project(x)
        dense = backend.dense_bias(backend.ingredients(x, q, k))
        torch.testing.assert_close(layer_probe.bias(), dense.expand_as(layer_probe.bias()), rtol=0, atol=1e-12)
        torch.testing.assert_close(layer_probe.bias(7, 19, block_size=5), layer_probe.bias()[..., 7:19, :19])


def test_layer_without_bias_has_no_gate_maps():
    model = tiny_model("fpa-no-layer1-bias", "chunked")
    assert not any(True for _ in model.blocks[0].attn.backend.parameters())
    assert any(True for _ in model.blocks[1].attn.backend.parameters())
    probes = model.probe(torch.zeros(1, 5, dtype=torch.long))
    assert [p.backend for p in probes] == ["none", "fpa"]
    assert model.attention_impls("cpu") == ["softmax:chunked", "fpa:chunked"]


def test_initial_fpa_and_fox_are_alibi():
    """The documented init: FPA and FoX both start as ALiBi (zero gate weights)."""
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    biases = {}
    for backend in ("fpa", "fox", "alibi"):
        cfg = ModelConfig(vocab_size=VOCAB, n_layer=1, d_model=24, n_head=3, d_mlp=40, attention=AttentionConfig(backend=backend))
        biases[backend] = Decoder(cfg).probe(ids)[0].bias()
    torch.testing.assert_close(biases["fpa"], biases["alibi"], rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(biases["fox"], biases["alibi"], rtol=1e-6, atol=1e-5)


def test_impl_resolution_is_recorded_and_never_silent():
    cfg = ModelConfig(vocab_size=VOCAB, n_layer=1, d_model=48, n_head=3, d_mlp=40, attention=AttentionConfig(backend="fpa", impl="fused"))
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        Decoder(cfg).attention_impls("cpu")
    for variant in ({"fpa_level": "query"}, {"fpa_reduction": "dipsum"}, {"fpa_level": "none"}, {"fpa_form": "stack"}):
        fused_variant = dataclasses.replace(cfg, attention=dataclasses.replace(cfg.attention, **variant))
        assert Decoder(fused_variant).attention_impls("cuda") == ["fpa:fused"], variant  # every variant is fused
    odd_dim = ModelConfig(vocab_size=VOCAB, n_layer=1, d_model=24, n_head=2, d_mlp=40, attention=AttentionConfig(backend="fpa", impl="fused"))
    with pytest.raises(ValueError, match="head dims"):
        Decoder(odd_dim).attention_impls("cuda")
    auto = dataclasses.replace(cfg, attention=AttentionConfig(backend="fpa"))
    assert Decoder(auto).attention_impls("cpu") == ["fpa:chunked"]
    assert Decoder(auto).attention_impls("cuda") == ["fpa:fused"]
    sdpa = dataclasses.replace(cfg, attention=AttentionConfig(backend="sdpa"))
    assert Decoder(sdpa).attention_impls("cpu") == ["softmax:fused"]  # SDPA runs on any device


@pytest.mark.parametrize("variant", ["fpa", "fpa-stack", "fpa-dipsum", "fpa-level-none", "fpa-level-query"])
def test_fpa_fused_path_receives_its_variant(variant):
    # The backend hands its variant to the Triton kernel (the CPU interpreter here, the GPU there): output and the
    # gate parameters' gradients equal the materialised bias's, in float32.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = AttentionConfig(backend="fpa", block_size=8, **VARIANTS[variant])
    model = Decoder(ModelConfig(vocab_size=VOCAB, n_layer=1, d_model=32, n_head=2, d_mlp=40, attention=cfg)).to(device)
    backend = model.blocks[0].attn.backend
    with torch.no_grad():
        for p in backend.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)).to(device))
    check_fused_path_matches_dense_bias(backend, device)
