"""Selective Attention and DCP against an independent float64 reference written here from their definitions
(docs/method.md, §3), not from fpa_lightning.ops: the backends' naive and chunked paths, and the fused paths' functions
(SDPA with a layer-shared bias, which run on a CPU too), outputs and every gradient, on random inputs of odd sizes,
without and with document masking.

Selective Attention (Leviathan et al. 2024): the selection logits are head 0's attention logits q0·k0/√D after a ReLU,
zeroed on and above the diagonal (a token never selects itself or later tokens) and in the BOS column (key 0, or
every document's first token under document masking); F[t, s] = Σ_{t' < t} S[t', s] (shifted: a selection only
masks later queries) is subtracted from every head's logits.
DCP (Anagnostidis et al. 2023): interaction queries and keys qi = x·W_qᵀ, ki = x·W_kᵀ of width r, shared across heads;
z[t', s] = qi_{t'}·ki_s/√r + offset; keep = clamp((z + 1)/2, 0, 1) (the sparse sigmoid); the log of the product of
keep over queries s < t' ≤ t (each factor floored at 1e-30) is added to every head's logits.
"""
import math

import pytest
import torch

from fpa_lightning import AttentionConfig
from fpa_lightning.attention.backends import DcpBackend, SelectiveBackend

B, T, H, D, R, D_MODEL = 2, 29, 3, 6, 5, 11  # odd sizes: T crosses four query blocks of 7, not a multiple of it
BLOCK = 7


def segments() -> torch.Tensor:
    """Packed rows: a one-token document, boundaries inside and on block edges."""
    lengths = [[9, 1, 12, 7], [7, 14, 8]]
    return torch.stack([torch.cat([torch.full((n,), i) for i, n in enumerate(row)]) for row in lengths])


def attend(q, k, v, bias, segment_ids):
    """softmax(q·kᵀ/√D + bias) v over keys s ≤ t (and of the query's document), every head; bias (B, T, T)."""
    scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1]) + bias[:, None]
    t = torch.arange(q.shape[1])
    visible = (t[None, :] <= t[:, None])[None, None]
    if segment_ids is not None:
        visible = visible & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
    return torch.einsum("bhts,bshd->bthd", probs, v)


def first_tokens(segment_ids, batch, length):
    """Keys that are never selected: key 0, and every document's first token."""
    if segment_ids is None:
        return [[s == 0 for s in range(length)] for _ in range(batch)]
    return [[s == 0 or bool(segment_ids[b, s] != segment_ids[b, s - 1]) for s in range(length)] for b in range(batch)]


def selective_reference(q, k, v, segment_ids=None):
    batch, length = q.shape[:2]
    never = first_tokens(segment_ids, batch, length)
    rows = []
    for b in range(batch):
        # S[t', s] of the selecting head (head 0), one scalar at a time
        S = [[torch.relu(q[b, tq, 0] @ k[b, s, 0] / math.sqrt(q.shape[-1])) if s < tq and not never[b][s]
              else q.new_zeros(()) for s in range(length)] for tq in range(length)]
        F = [[sum((S[tq][s] for tq in range(t)), q.new_zeros(())) for s in range(length)] for t in range(length)]
        rows.append(torch.stack([torch.stack([-F[t][s] for s in range(length)]) for t in range(length)]))
    return attend(q, k, v, torch.stack(rows), segment_ids)


def dcp_reference(x, q, k, v, weight, offset, segment_ids=None):
    r = weight.shape[0] // 2
    qi, ki = x @ weight[:r].T, x @ weight[r:].T  # (B, T, r): the two interaction projections
    batch, length = q.shape[:2]
    rows = []
    for b in range(batch):
        log_keep = [[torch.log(torch.clamp((qi[b, tq] @ ki[b, s] / math.sqrt(r) + offset[0] + 1) / 2, 0, 1)
                               .clamp(min=1e-30)) for s in range(length)] for tq in range(length)]
        rows.append(torch.stack([torch.stack([sum((log_keep[tq][s] for tq in range(s + 1, t + 1)), x.new_zeros(()))
                                              for s in range(length)]) for t in range(length)]))
    return attend(q, k, v, torch.stack(rows), segment_ids)


def inputs(seed: int, length: int = T):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, length, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    x = torch.randn(B, length, D_MODEL, generator=g, dtype=torch.float64)
    return q, k, v, x


def backend(cls, impl: str):
    cfg = AttentionConfig(backend="selective" if cls is SelectiveBackend else "dcp", impl=impl, block_size=BLOCK,
                          dcp_dim=R)
    torch.manual_seed(0)
    module = cls(cfg, D_MODEL, H, D).double()
    if cls is DcpBackend:  # keep decisions spread over the clamp's three regions (0, between, 1)
        with torch.no_grad():
            module.interaction.weight.normal_(0.0, 0.4)
            module.offset.fill_(0.3)
    return module


def value_and_grads(fn, tensors, params=()):
    """fn's output and the gradients of a fixed random projection of it w.r.t. every tensor and parameter."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(11), dtype=out.dtype)
    grads = torch.autograd.grad((out * weights).sum(), [*leaves, *params], allow_unused=True)
    return out.detach(), [torch.zeros_like(t) if g is None else g for g, t in zip(grads, [*leaves, *params])]


def assert_same(got, want, names):
    (out, grads), (ref_out, ref_grads) = got, want
    torch.testing.assert_close(out, ref_out, rtol=1e-9, atol=1e-11, msg="output")
    for name, g, r in zip(names, grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-11, msg=name)
        if name != "x (no role)":
            assert r.abs().max() > 1e-3, f"{name}: the reference gradient vanishes, the case checks nothing"


@pytest.mark.parametrize("documents", [False, True])
@pytest.mark.parametrize("impl", ["naive", "chunked"])
def test_selective_backend_matches_the_reference(impl, documents):
    q, k, v, x = inputs(seed=1)
    seg = segments() if documents else None
    module = backend(SelectiveBackend, impl)
    got = value_and_grads(lambda q, k, v, x: module(x, q, k, v, seg), [q, k, v, x])
    want = value_and_grads(lambda q, k, v, x: selective_reference(q, k, v, seg), [q, k, v, x])
    assert_same(got, want, ["q", "k", "v", "x (no role)"])


@pytest.mark.parametrize("documents", [False, True])
@pytest.mark.parametrize("impl", ["naive", "chunked"])
def test_dcp_backend_matches_the_reference(impl, documents):
    q, k, v, x = inputs(seed=2)
    seg = segments() if documents else None
    module = backend(DcpBackend, impl)
    weight, offset = module.interaction.weight, module.offset
    got = value_and_grads(lambda q, k, v, x: module(x, q, k, v, seg), [q, k, v, x], [weight, offset])
    want = value_and_grads(lambda q, k, v, x: dcp_reference(x, q, k, v, weight, offset, seg), [q, k, v, x],
                           [weight, offset])
    assert_same(got, want, ["q", "k", "v", "x", "interaction weight", "offset"])
    # the case covers every branch of the sparse sigmoid: dropped pairs, kept ones and partial keeps
    r = weight.shape[0] // 2
    z = torch.einsum("btr,bsr->bts", x @ weight[:r].T, x @ weight[r:].T) / math.sqrt(r) + offset[0]
    keep = ((z + 1) / 2).clamp(0, 1)
    assert (keep == 0).any() and (keep == 1).any() and ((keep > 0) & (keep < 1)).float().mean() > 0.3


@pytest.mark.parametrize("documents", [False, True])
def test_fused_functions_match_the_reference_on_cpu(documents):
    """The fast paths' functions (CUDA in a model, but plain SDPA calls) in float64 on the CPU."""
    from fpa_lightning.ops.dcp import dcp_attention_gpu
    from fpa_lightning.ops.selective import selective_attention_gpu

    q, k, v, x = inputs(seed=3)
    seg = segments() if documents else None
    got = value_and_grads(lambda q, k, v: selective_attention_gpu(q, k, v, segment_ids=seg), [q, k, v])
    want = value_and_grads(lambda q, k, v: selective_reference(q, k, v, seg), [q, k, v])
    assert_same(got, want, ["q", "k", "v"])
    module = backend(DcpBackend, "naive")
    weight, offset = module.interaction.weight, module.offset

    def fast(q, k, v, x):
        return dcp_attention_gpu(q, k, v, x @ weight[:R].T, x @ weight[R:].T, offset[0], segment_ids=seg)

    got = value_and_grads(fast, [q, k, v, x], [weight, offset])
    want = value_and_grads(lambda q, k, v, x: dcp_reference(x, q, k, v, weight, offset, seg), [q, k, v, x],
                           [weight, offset])
    assert_same(got, want, ["q", "k", "v", "x", "interaction weight", "offset"])


def test_one_token():
    q, k, v, x = inputs(seed=4, length=1)
    for impl in ("naive", "chunked"):
        module = backend(SelectiveBackend, impl)
        torch.testing.assert_close(module(x, q, k, v), selective_reference(q, k, v), rtol=1e-12, atol=1e-12)
        module = backend(DcpBackend, impl)
        torch.testing.assert_close(module(x, q, k, v), v, rtol=1e-12, atol=1e-12)  # one key: its value
