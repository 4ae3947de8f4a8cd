"""The fused Selective Attention kernel against its definition (ops/selective/naive.py).

CPU: through Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 without CUDA), tiny odd shapes, block
size 16, fp32 and fp16 (the interpreter's bf16 dot is wrong). GPU (marked `gpu`): bf16 and fp16 at real sizes.
Tolerance rule: the kernel's error against a float64 reference is at most 2× the error of the same-precision PyTorch
definition (the naive op run on the same low-precision inputs), plus a few fp32 ulps of the tensor's scale, for the
output and the gradients of q, k and v (head 0's q and k include the gradient through the layer-shared F).
"""
from __future__ import annotations

import math

import pytest
import torch

from fpa_lightning.ops.selective import fused as fused_mod
from fpa_lightning.ops.selective import selective_attention_fused, selective_attention_naive, selective_bias
from fpa_lightning.ops.common import dense_attention

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"
NAMES = ("out", "dq", "dk", "dv")


def make_inputs(B, T, H, D, *, seed=0, q_scale=1.0):
    """float64 q, k, v, dO on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, T, H, D, generator=gen, dtype=torch.float64) for _ in range(4))
    return (q * q_scale, k, v), do


def documents(B, T, *, seed=0, mean_length=9, device=DEV):
    """(B, T) int64 ids of packed documents: contiguous runs of random length, non-decreasing along a row, so
    documents start and end inside blocks and cross block boundaries."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.rand(B, T, generator=gen) < 1.0 / mean_length
    starts[:, 0] = False
    return starts.long().cumsum(1).to(device)


def run(fn, inputs, do, dtype, device, **kw):
    """Output and the three gradients, as float64 CPU tensors."""
    args = [t.detach().to(device=device, dtype=dtype).clone().requires_grad_() for t in inputs]
    out = fn(*args, **kw)
    out.backward(do.to(device=device, dtype=out.dtype))
    return [out.detach().double().cpu()] + [a.grad.double().cpu() for a in args]


def max_err(a, b):
    return (a - b).abs().max().item()


def rounded(inputs, do, dtype):
    """The inputs as the low-precision methods see them, back in float64."""
    return [t.to(dtype).double() for t in inputs], do.to(dtype).double()


def check_against_reference(inputs, do, dtype, device, *, factor=2.0, exact_on_rounded=False, **kw):
    """Kernel error <= factor x the same-precision torch error (plus a few fp32 ulps), both against float64 on the
    original inputs, or with `exact_on_rounded` on the rounded ones. `kw` (segment_ids, scale) goes to both ops."""
    ref_inputs = rounded(inputs, do, dtype) if exact_on_rounded else (inputs, do)
    ref = run(selective_attention_naive, *ref_inputs, torch.float64, device, **kw)
    same = run(selective_attention_naive, inputs, do, dtype, device, **kw)
    got = run(selective_attention_fused, inputs, do, dtype, device, **kw)
    for name, r, s, g in zip(NAMES, ref, same, got):
        assert torch.isfinite(g).all(), f"{name}: non-finite values"
        e_k, e_t = max_err(g, r), max_err(s, r)
        floor = 8 * torch.finfo(torch.float32).eps * (1.0 + r.abs().max().item())
        assert e_k <= factor * e_t + floor, f"{name}: kernel err {e_k:.3e} > {factor}x torch err {e_t:.3e}"
    return got, ref


@pytest.fixture
def groups(monkeypatch):
    """Set the backward's head-group count (the heads one program loops over are H / groups)."""
    def set_groups(n):
        monkeypatch.setattr(fused_mod, "_head_groups", lambda B, H, nB, device: n)
    return set_groups


# ------------------------------------------------------------------------------------------------
# CPU (interpreter) and GPU alike: tiny shapes
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("B,T,H", [(2, 1, 2), (2, 5, 2), (2, 16, 2), (2, 37, 2), (1, 70, 3)])
def test_matches_reference(B, T, H):
    inputs, do = make_inputs(B, T, H, 16, seed=T)
    check_against_reference(inputs, do, torch.float32, DEV)


@pytest.mark.parametrize("T", [37, 70])
def test_documents_match_reference(T):
    # several documents per row (mean length 9), starting mid-tile and at tile starts alike
    B, H = 2, 2 if T == 37 else 3
    inputs, do = make_inputs(B, T, H, 16, seed=100 + T)
    seg = documents(B, T, seed=T)
    seg[1, 32:] += 1  # a document that starts exactly at a block boundary (block 16)
    assert (seg[:, 1:] != seg[:, :-1]).sum(1).min() >= 3
    check_against_reference(inputs, do, torch.float32, DEV, segment_ids=seg)


def test_documents_with_any_ids_match_reference(monkeypatch):
    # ids that repeat after other documents (not contiguous runs): the definition still applies, F of a pair sums
    # the queries between them whatever their documents; the tile walks stay exact for any ids. Scratch buffers
    # start as NaN: the query-major walk reaches pairs beyond the key-major walk's, whose carry entries are unwritten
    monkeypatch.setattr(fused_mod, "TEST_HOOK_POISON_OUTPUTS", True)
    B, T, H = 2, 61, 2
    inputs, do = make_inputs(B, T, H, 16, seed=7)
    # by blocks of 16. Row 0: ids {5, 6} | 0 | {5, 3} | 1: document 5 resumes two blocks later, and key block 1
    # shares no document with any later query block, although those blocks still reach it in the dq walk. Row 1:
    # 0 | 1 | 1 | 0: query blocks 1 and 2 share no document with key block 0, yet their selection gradient there
    # is not 0 (block 3's queries see block 0's keys)
    rows = [[(5, 10), (6, 6), (0, 16), (5, 7), (3, 9), (1, 13)], [(0, 16), (1, 32), (0, 13)]]
    seg = torch.stack([torch.cat([torch.full((n,), i) for i, n in row]) for row in rows]).to(DEV)
    check_against_reference(inputs, do, torch.float32, DEV, segment_ids=seg)


@pytest.mark.parametrize("n_groups", [1, 2, 4])
def test_head_groups_match_reference(groups, n_groups):
    # the backward kernels loop over H / n_groups heads per program; head 0's slot is summed over the groups
    groups(n_groups)
    inputs, do = make_inputs(1, 45, 4, 16, seed=11)
    check_against_reference(inputs, do, torch.float32, DEV, segment_ids=documents(1, 45, seed=3, mean_length=12))


@pytest.mark.parametrize("fwd,bwd", [((32, 16), (16, 32, 32)), ((16, 32), (32, 16, 64))],
                         ids=["fwd32x16-bwd16x32x32", "fwd16x32-bwd32x16x64"])
@pytest.mark.parametrize("docs", [False, True], ids=["dense", "docs"])
def test_mixed_tile_sizes_match_reference(monkeypatch, fwd, bwd, docs):
    # query tiles and key tiles of different sizes (as on the GPU: the key-major backward walks 32-query tiles under
    # 64-key tiles, the query-major one reads its tables at every other row); scratch buffers start as NaN
    monkeypatch.setattr(fused_mod, "_tiles", lambda: {"fwd": fwd, "bwd": bwd})
    monkeypatch.setattr(fused_mod, "TEST_HOOK_POISON_OUTPUTS", True)
    B, T, H = 2, 70, 2
    inputs, do = make_inputs(B, T, H, 16, seed=31)
    seg = documents(B, T, seed=31, mean_length=11) if docs else None
    check_against_reference(inputs, do, torch.float32, DEV, segment_ids=seg)


def test_bad_tile_sizes_raise(monkeypatch):
    (q, k, v), _ = make_inputs(1, 8, 2, 16)
    q, k, v = (t.float().to(DEV) for t in (q, k, v))
    monkeypatch.setattr(fused_mod, "_tiles", lambda: {"fwd": (16, 16), "bwd": (32, 16, 16)})
    with pytest.raises(ValueError, match="multiple of BT"):
        selective_attention_fused(q, k, v)
    monkeypatch.setattr(fused_mod, "_tiles", lambda: {"fwd": (24, 16), "bwd": (16, 16, 16)})
    with pytest.raises(ValueError, match="powers of two"):
        selective_attention_fused(q, k, v)


def test_scan_prefix_matches_dot_prefix(monkeypatch):
    # the in-tile prefix/suffix over queries as a scan instead of a triangular matmul: the same result up to rounding
    inputs, do = make_inputs(2, 37, 2, 16, seed=12)
    seg = documents(2, 37, seed=12)
    want = run(selective_attention_fused, inputs, do, torch.float32, DEV, segment_ids=seg)
    monkeypatch.setattr(fused_mod, "_prefix_by_dot", lambda: False)
    got, _ = check_against_reference(inputs, do, torch.float32, DEV, segment_ids=seg)
    for name, w, g in zip(NAMES, want, got):
        assert max_err(w, g) <= 1e-5 * (1 + w.abs().max().item()), name


@pytest.mark.parametrize("exact_on_rounded", [False, True])
def test_fp16_matches_reference(exact_on_rounded):
    # Not bf16: Triton 3.9's interpreter computes a bf16 tl.dot wrongly, so bf16 is checked on the GPU only
    inputs, do = make_inputs(1, 37, 2, 16, seed=9)
    check_against_reference(inputs, do, torch.float16, DEV, exact_on_rounded=exact_on_rounded,
                            segment_ids=documents(1, 37, seed=9))


def test_custom_scale():
    inputs, do = make_inputs(2, 29, 2, 16, seed=13)
    check_against_reference(inputs, do, torch.float32, DEV, scale=0.7)


def test_gradient_through_f_is_checked():
    # The selection's gradient into head 0's q and k is far above the tolerance of the checks above: a kernel that
    # dropped it (F treated as a constant) would fail them. Reference without it: F computed from detached q0, k0.
    inputs, do = make_inputs(2, 37, 2, 16, seed=14)
    got, ref = check_against_reference(inputs, do, torch.float32, DEV)

    def f_constant(q, k, v):
        return dense_attention(q, k, v, selective_bias(q.detach(), k.detach()))

    no_f = run(f_constant, inputs, do, torch.float64, DEV)
    for i in (1, 2):  # dq, dk
        through_f = max_err(no_f[i][:, :, 0], ref[i][:, :, 0])
        assert through_f > 1e3 * max_err(got[i], ref[i]), NAMES[i]
        assert torch.allclose(no_f[i][:, :, 1:], ref[i][:, :, 1:], atol=1e-12)  # other heads: no F path


def test_every_element_written_and_rerun_deterministic(monkeypatch, groups):
    # every output and scratch buffer starts as NaN: an element a kernel forgets to write, or a read of a scratch
    # entry never written (the carry tables' unused halves), shows up as NaN
    monkeypatch.setattr(fused_mod, "TEST_HOOK_POISON_OUTPUTS", True)
    groups(2)
    inputs, do = make_inputs(2, 35, 2, 16, seed=15)
    seg = documents(2, 35, seed=15, mean_length=7)
    a = run(selective_attention_fused, inputs, do, torch.float32, DEV, segment_ids=seg)
    b = run(selective_attention_fused, inputs, do, torch.float32, DEV, segment_ids=seg)
    for name, x, y in zip(NAMES, a, b):
        assert torch.isfinite(x).all(), name
        assert torch.equal(x, y), name


def test_strided_inputs_match_contiguous():
    # q, k, v as views of one packed (B, T, 3, H, D) projection: other strides, the same result
    inputs, do = make_inputs(1, 21, 2, 16, seed=16)
    want = run(selective_attention_fused, inputs, do, torch.float32, DEV)

    def packed(q, k, v):
        qkv = torch.stack([q, k, v], dim=2)  # (B, T, 3, H, D)
        assert not qkv[:, :, 0].is_contiguous()
        return selective_attention_fused(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])

    got = run(packed, inputs, do, torch.float32, DEV)
    for name, w, g in zip(NAMES, want, got):
        assert torch.equal(w, g), name


def test_value_errors():
    (q, k, v), _ = make_inputs(1, 8, 2, 16)
    q, k, v = (t.float().to(DEV) for t in (q, k, v))
    with pytest.raises(ValueError, match="head dim"):
        selective_attention_fused(q[..., :12], k[..., :12], v[..., :12])
    with pytest.raises(ValueError, match="head dim"):
        selective_attention_fused(*(torch.zeros(1, 8, 2, 256, device=DEV) for _ in range(3)))
    with pytest.raises(ValueError, match="dtype"):
        selective_attention_fused(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match="share one dtype"):
        selective_attention_fused(q, k.half(), v)
    with pytest.raises(ValueError, match="one shape"):
        selective_attention_fused(q, k[:, :4], v)
    with pytest.raises(ValueError, match=r"\(B, T, H, D\)"):
        selective_attention_fused(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="scale"):
        selective_attention_fused(q, k, v, scale=float("nan"))
    with pytest.raises(ValueError, match="segment_ids"):
        selective_attention_fused(q, k, v, segment_ids=torch.zeros(1, 7, dtype=torch.long, device=DEV))
    with pytest.raises(ValueError, match="integer"):
        selective_attention_fused(q, k, v, segment_ids=torch.zeros(1, 8, device=DEV))


def test_non_cuda_tensors_rejected_outside_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    (q, k, v), _ = make_inputs(1, 8, 2, 16)
    with pytest.raises(ValueError, match="CUDA"):
        selective_attention_fused(q.float(), k.float(), v.float())


# ------------------------------------------------------------------------------------------------
# GPU: real sizes. bf16 is judged against float64 on the bf16-rounded inputs as well as on the originals where
# rounding alone moves the exact result (the same reason as in test_fpa_fused.py).
# ------------------------------------------------------------------------------------------------
GPU_SHAPES = [  # (B, T, H, D)
    (1, 1, 2, 64), (2, 17, 3, 64), (2, 2048, 4, 64), (1, 2049, 2, 64), (2, 63, 2, 16), (1, 130, 3, 32),
    (1, 1000, 2, 128), (1, 777, 12, 64),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("docs", [False, True], ids=["dense", "docs"])
def test_gpu_bf16_shapes(shape, docs):
    B, T, H, D = shape
    inputs, do = make_inputs(B, T, H, D, seed=T + H)
    seg = documents(B, T, seed=T, mean_length=max(9, T // 8), device="cuda") if docs else None
    check_against_reference(inputs, do, torch.bfloat16, "cuda", segment_ids=seg)


@pytest.mark.gpu
@pytest.mark.parametrize("docs", [False, True], ids=["dense", "docs"])
def test_gpu_bf16_2048_exact_on_rounded(docs):
    inputs, do = make_inputs(2, 2048, 4, 64, seed=21)
    seg = documents(2, 2048, seed=21, mean_length=300, device="cuda") if docs else None
    check_against_reference(inputs, do, torch.bfloat16, "cuda", exact_on_rounded=True, segment_ids=seg)


@pytest.mark.gpu
def test_gpu_fp16_and_fp32():
    inputs, do = make_inputs(2, 600, 2, 64, seed=22)
    check_against_reference(inputs, do, torch.float16, "cuda", exact_on_rounded=True)
    check_against_reference(inputs, do, torch.float32, "cuda", segment_ids=documents(2, 600, seed=22, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("n_groups", [1, 3, 12])
def test_gpu_head_groups(groups, n_groups):
    groups(n_groups)
    inputs, do = make_inputs(1, 1000, 12, 64, seed=23)
    check_against_reference(inputs, do, torch.bfloat16, "cuda", exact_on_rounded=True)


@pytest.mark.gpu
def test_gpu_every_element_written_and_deterministic(monkeypatch):
    monkeypatch.setattr(fused_mod, "TEST_HOOK_POISON_OUTPUTS", True)
    inputs, do = make_inputs(2, 1001, 4, 64, seed=24)
    seg = documents(2, 1001, seed=24, mean_length=200, device="cuda")
    a = run(selective_attention_fused, inputs, do, torch.bfloat16, "cuda", segment_ids=seg)
    b = run(selective_attention_fused, inputs, do, torch.bfloat16, "cuda", segment_ids=seg)
    for name, x, y in zip(NAMES, a, b):
        assert torch.isfinite(x).all(), name
        assert torch.equal(x, y), name


@pytest.mark.gpu
def test_gpu_scan_prefix(monkeypatch):
    monkeypatch.setattr(fused_mod, "_prefix_by_dot", lambda: False)
    inputs, do = make_inputs(2, 2048, 4, 64, seed=25)
    check_against_reference(inputs, do, torch.bfloat16, "cuda", exact_on_rounded=True)
