"""The fused DCP attention kernel against its definition (ops/dcp/naive.py).

CPU: through Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 without CUDA), tiny odd shapes, tiles
of 16, fp32 and fp16 (the interpreter's bf16 dot is wrong). GPU (marked `gpu`): bf16 at real sizes.
Tolerance rule (test_selective_fused.py's): the kernel's error against a float64 reference is at most 2× the error of
the same-precision PyTorch definition (the naive op run on the same low-precision inputs), plus a few fp32 ulps of
the tensor's scale, for the output and the gradients of q, k, v, qi, ki and the offset.
"""
from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from _backend_checks import check_fused_path_matches_dense_bias
from _carry_table_tests import *  # noqa: F401,F403 (the tests Selective and DCP share, run here on DCP)
from _ops_helpers import DEV, HAS_CUDA, FusedOp, check_against_reference, check_common_value_errors
from _ops_helpers import check_written_and_deterministic, documents, max_err, run, set_head_groups
from _ops_helpers import test_non_cuda_tensors_rejected_outside_interpreter  # noqa: F401 (run here, on DCP)
from fpa_lightning.ops.dcp import dcp_attention_fused, dcp_attention_naive, dcp_bias
from fpa_lightning.ops.dcp import fused as fused_mod
from fpa_lightning.ops.common import dense_attention
from fpa_lightning.ops.selective.kernels import _online_softmax, _prefix_rows, _split_tf32


def make_inputs(B, T, H, D, r=16, *, seed=0, i_scale=0.5, offset=0.6):
    """float64 (q, k, v, qi, ki, offset) and dO on the CPU. With the defaults z = qi·ki/√r + offset spreads over
    about offset ± 0.5: keep = (z + 1)/2 stays inside (0, 1) for most pairs."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, T, H, D, generator=gen, dtype=torch.float64) for _ in range(4))
    qi, ki = (torch.randn(B, T, r, generator=gen, dtype=torch.float64) * i_scale for _ in range(2))
    return (q, k, v, qi, ki, torch.tensor(offset, dtype=torch.float64)), do


# the offset stays fp32 in low-precision runs (as the backend passes it); everything else is cast
DCP = FusedOp(dcp_attention_fused, dcp_attention_naive, fused_mod, make_inputs,
              names=("out", "dq", "dk", "dv", "dqi", "dki", "doffset"), fp32_args=(5,),
              custom_ops=(fused_mod.dcp_forward_op, fused_mod.dcp_backward_op))
NAMES = DCP.names


@pytest.fixture
def op():
    """The op the shared tests (imported from _carry_table_tests and _ops_helpers) check."""
    return DCP


# ------------------------------------------------------------------------------------------------
# CPU (interpreter) and GPU alike: tiny shapes
# ------------------------------------------------------------------------------------------------
@triton.jit
def _one_tile(S, V, O, BM: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, SPLIT_P: tl.constexpr):
    # one tile of the forward's online softmax: O = softmax(S in log2 units) · V, through _online_softmax
    rm, rn, rd = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, D)
    s = tl.load(S + rm[:, None] * BN + rn[None, :])
    v = tl.load(V + rn[:, None] * D + rd[None, :])
    m_i = tl.full([BM], -float("inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    m_i, l_i, acc = _online_softmax(s, m_i, l_i, acc, v, "ieee", SPLIT_P)
    tl.store(O + rm[:, None] * D + rd[None, :], acc / l_i[:, None])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16] if HAS_CUDA else [torch.float16])
def test_split_p_gives_the_fp32_output_the_backwards_p(dtype):
    """Δ = rowsum(dO·O) must use an O whose P matches the backward's fp32 P (fused.py, "Precision"): with SPLIT_P the
    fp32 output of a tile is P·V to near fp32, without it P·V carries P's rounding to v's dtype (DCP d2's failure)."""
    gen = torch.Generator().manual_seed(5)
    s = (torch.randn(16, 16, generator=gen, dtype=torch.float64) * 3).float().to(DEV)
    v = torch.randn(16, 16, generator=gen, dtype=torch.float64).to(dtype).to(DEV)
    ref = torch.softmax(s.double() * math.log(2), dim=-1) @ v.double()
    errors = []
    for split in (False, True):
        o = torch.empty(16, 16, dtype=torch.float32, device=DEV)
        _one_tile[(1,)](s, v, o, BM=16, BN=16, D=16, SPLIT_P=split)
        errors.append((o.double() - ref).abs().max().item())
    plain, split = errors
    rounding = torch.finfo(dtype).eps * ref.abs().max().item()
    assert plain > rounding / 64  # P's rounding shows without the split
    assert split < plain / 30 and split < 1e-5, errors


@triton.jit
def _split_and_prefix(X, HI, LO, P, N: tl.constexpr, PREC: tl.constexpr):
    # the split of an (N, N) fp32 tile and its exclusive prefix down the rows through _prefix_rows' tensor-core path
    r = tl.arange(0, N)
    x = tl.load(X + r[:, None] * N + r[None, :])
    hi, lo = _split_tf32(x)
    tl.store(HI + r[:, None] * N + r[None, :], hi)
    tl.store(LO + r[:, None] * N + r[None, :], lo)
    tri = tl.where(r[:, None] > r[None, :], 1.0, 0.0)
    tl.store(P + r[:, None] * N + r[None, :], _prefix_rows(x, tri, True, PREC))


@pytest.mark.parametrize("prec", ["tf32x2", "tf32x3", "ieee"])
def test_tf32x2_split_is_exact_and_its_prefix_near_fp32(prec):
    """The bias path's two-term sums (fused.py, "Precision"): x = hi + lo exactly, hi exact in tf32 (the low 13
    mantissa bits clear), |lo| ≤ 2^-11 |x| (hi is x rounded, either sign, across magnitudes); and the exclusive prefix
    through the dots is within 2^-17 of the float64 sum of magnitudes, tf32x3's order with fp32 accumulation and 64×
    inside a plain tf32 product's 2^-11 (on a GPU; the interpreter's dots are exact)."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(32, 32, generator=gen, dtype=torch.float64) * torch.logspace(-20, 20, 32, dtype=torch.float64)
    x = x.float().to(DEV)
    hi, lo, prefix = (torch.empty_like(x) for _ in range(3))
    _split_and_prefix[(1,)](x, hi, lo, prefix, N=32, PREC=prec)
    assert torch.equal(hi + lo, x) and not (hi.view(torch.int32) & 0x1FFF).any()
    assert (lo.abs() <= x.abs() * 2.0**-11).all()
    exact = torch.tril(torch.ones(32, 32, dtype=torch.float64), -1) @ x.double().cpu()
    scale = torch.tril(torch.ones(32, 32, dtype=torch.float64), -1) @ x.double().abs().cpu()
    assert ((prefix.double().cpu() - exact).abs() <= scale * 2.0**-17).all()  # plain tf32: ~2^-11 of the scale


@pytest.mark.parametrize("B,T,H,r", [(2, 1, 2, 16), (2, 5, 2, 32), (2, 16, 2, 16), (2, 37, 2, 16), (1, 70, 3, 64),
                                     (1, 23, 1, 128)])
def test_matches_reference(B, T, H, r):
    inputs, do = make_inputs(B, T, H, 16, r, seed=T + r)
    check_against_reference(DCP, inputs, do, torch.float32, DEV)


def test_fp32_interaction_with_fp16_qkv():
    # the backend's mix: qi, ki (and the offset) in fp32, q, k, v in fp16; z runs in tf32 (the interpreter: fp32)
    inputs, do = make_inputs(1, 29, 2, 16, seed=19)
    ref = run(dcp_attention_naive, inputs, do, torch.float64, DEV)

    def mixed(fn):
        def call(q, k, v, qi, ki, off):
            return fn(q.half(), k.half(), v.half(), qi, ki, off)
        return call

    same = run(mixed(dcp_attention_naive), inputs, do, torch.float32, DEV)
    got = run(mixed(dcp_attention_fused), inputs, do, torch.float32, DEV)
    for name, r, s, g in zip(NAMES, ref, same, got):
        floor = 8 * torch.finfo(torch.float32).eps * (1.0 + r.abs().max().item())
        assert max_err(g, r) <= 2 * max_err(s, r) + floor, name


def test_clamps_active_match_reference():
    # z spread wide: keep clamps to 0 (log floor, gradient 0) and to 1 (log 0, gradient 0) for many pairs. The
    # boundaries themselves (x = 0 or 1 exactly) have measure zero and are not hit by random inputs.
    inputs, do = make_inputs(2, 37, 2, 16, seed=17, i_scale=1.5, offset=0.3)
    qi, ki, off = inputs[3:]
    x = ((qi @ ki.transpose(1, 2)) / 4 + off + 1) / 2
    below = torch.ones(37, 37, dtype=torch.bool).tril(-1)  # the pairs that enter the bias
    assert (x[:, below] <= 0).float().mean() > 0.1 and (x[:, below] >= 1).float().mean() > 0.1
    assert not ((x == 0) | (x == 1)).any()
    seg = documents(2, 37, seed=17, mean_length=15)
    check_against_reference(DCP, inputs, do, torch.float32, DEV, segment_ids=seg)


def test_gradient_through_bias_is_checked():
    # The bias's gradient into qi, ki and the offset, and its share of dq, dk, dv, are far above the tolerance of
    # the checks above: a kernel that dropped them would fail. Reference without the bias path: the bias from
    # detached qi, ki, offset.
    inputs, do = make_inputs(2, 37, 2, 16, seed=14)
    got, ref = check_against_reference(DCP, inputs, do, torch.float32, DEV)
    for i in (4, 5, 6):  # dqi, dki, doffset
        assert ref[i].abs().max() > 1e3 * max_err(got[i], ref[i]), NAMES[i]

    def no_bias(q, k, v, qi, ki, off):
        return dense_attention(q, k, v, None) + 0 * (qi.sum() + ki.sum() + off)

    plain = run(no_bias, inputs, do, torch.float64, DEV)
    for i in (0, 1, 2, 3):
        assert max_err(plain[i], ref[i]) > 1e3 * max_err(got[i], ref[i]), NAMES[i]


def test_strided_inputs_match_contiguous():
    # q, k, v as views of one packed (B, T, 3, H, D) projection, qi, ki as halves of one (B, T, 2r) projection (the
    # backend's chunk): other strides, the same result
    inputs, do = make_inputs(1, 21, 2, 16, seed=16)
    want = run(dcp_attention_fused, inputs, do, torch.float32, DEV)

    def packed(q, k, v, qi, ki, off):
        qkv = torch.stack([q, k, v], dim=2)  # (B, T, 3, H, D)
        qi, ki = torch.cat([qi, ki], dim=-1).chunk(2, dim=-1)  # (B, T, r) views with row stride 2r
        assert not qkv[:, :, 0].is_contiguous() and not qi.is_contiguous()
        return dcp_attention_fused(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], qi, ki, off)

    got = run(packed, inputs, do, torch.float32, DEV)
    for name, w, g in zip(NAMES, want, got):
        assert torch.equal(w, g), name


def test_matches_sdpa_path_bias():
    # the SDPA path's bias (dcp_bias) is the one the kernel reproduces: with the bias fed to dense attention
    inputs, do = make_inputs(1, 19, 2, 16, seed=18)
    q, k, v, qi, ki, off = inputs
    want = dense_attention(q, k, v, dcp_bias(qi, ki, off))
    got = dcp_attention_fused(*(t.float().to(DEV) for t in inputs)).double().cpu()
    assert max_err(got, want) < 1e-5


def test_backend_fused_path_runs_the_kernel():
    # DcpBackend.fused calls the kernel (the interpreter here): output and the interaction map's and offset's
    # gradients equal the materialised bias's, in float32; its fused path refuses an interaction width the kernel
    # is not built for
    from fpa_lightning import AttentionConfig, Decoder, ModelConfig

    cfg = AttentionConfig(backend="dcp", dcp_dim=16)
    model = Decoder(ModelConfig(vocab_size=50, n_layer=1, d_model=32, n_head=2, d_mlp=40, attention=cfg)).to(DEV)
    check_fused_path_matches_dense_bias(model.blocks[0].attn.backend, DEV)
    odd = Decoder(ModelConfig(vocab_size=50, n_layer=1, d_model=32, n_head=2, d_mlp=40,
                              attention=AttentionConfig(backend="dcp", dcp_dim=6, impl="fused")))
    assert "dcp_dim" in odd.blocks[0].attn.backend.fused_unsupported_reason()


def test_value_errors():
    check_common_value_errors(DCP)
    (q, k, v, qi, ki, off), _ = make_inputs(1, 8, 2, 16)
    q, k, v, qi, ki, off = (t.float().to(DEV) for t in (q, k, v, qi, ki, off))
    with pytest.raises(ValueError, match="interaction width"):
        dcp_attention_fused(q, k, v, qi[..., :8], ki[..., :8], off)
    with pytest.raises(ValueError, match=r"\(B, T, r\)"):
        dcp_attention_fused(q, k, v, qi[:, :4], ki[:, :4], off)
    with pytest.raises(ValueError, match="share one shape"):
        dcp_attention_fused(q, k, v, qi, torch.cat([ki, ki], -1), off)
    with pytest.raises(ValueError, match="qi, ki must share one dtype"):
        dcp_attention_fused(q, k, v, qi.double(), ki.double(), off)
    with pytest.raises(ValueError, match="qi, ki must share one dtype"):
        dcp_attention_fused(q, k, v, qi, ki.half(), off)
    with pytest.raises(ValueError, match="offset"):
        dcp_attention_fused(q, k, v, qi, ki, off.expand(2))
    with pytest.raises(ValueError, match="offset"):
        dcp_attention_fused(q, k, v, qi, ki, off.double())
    with pytest.raises(ValueError, match="offset must be a torch.Tensor"):
        dcp_attention_fused(q, k, v, qi, ki, 0.5)


# ------------------------------------------------------------------------------------------------
# GPU: real sizes, bf16, judged against float64 on the bf16-rounded inputs as well as on the originals.
# ------------------------------------------------------------------------------------------------
GPU_SHAPES = [  # (B, T, H, D, r)
    (1, 1, 2, 64, 32), (2, 17, 3, 64, 32), (2, 2048, 4, 64, 32), (2, 2048, 4, 64, 64), (1, 2049, 2, 64, 16),
    (2, 63, 2, 16, 128), (1, 130, 3, 32, 32), (1, 1000, 2, 128, 64), (1, 777, 12, 64, 32),
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("docs", [False, True], ids=["dense", "docs"])
def test_gpu_bf16_shapes(shape, docs):
    B, T, H, D, r = shape
    inputs, do = make_inputs(B, T, H, D, r, seed=T + H)
    seg = documents(B, T, seed=T, mean_length=max(9, T // 8), device="cuda") if docs else None
    check_against_reference(DCP, inputs, do, torch.bfloat16, "cuda", segment_ids=seg)


@pytest.mark.gpu
@pytest.mark.parametrize("r", [32, 64])
@pytest.mark.parametrize("docs", [False, True], ids=["dense", "docs"])
def test_gpu_bf16_2048_exact_on_rounded(r, docs):
    inputs, do = make_inputs(2, 2048, 4, 64, r, seed=21)
    seg = documents(2, 2048, seed=21, mean_length=300, device="cuda") if docs else None
    check_against_reference(DCP, inputs, do, torch.bfloat16, "cuda", exact_on_rounded=True, segment_ids=seg)


@pytest.mark.gpu
def test_gpu_bf16_4096_exact_on_rounded():
    inputs, do = make_inputs(1, 4096, 4, 64, 32, seed=26)
    check_against_reference(DCP, inputs, do, torch.bfloat16, "cuda", exact_on_rounded=True)


@pytest.mark.gpu
def test_gpu_bf16_clamps_active():
    inputs, do = make_inputs(2, 1000, 4, 64, 32, seed=27, i_scale=1.5, offset=0.3)
    check_against_reference(DCP, inputs, do, torch.bfloat16, "cuda", exact_on_rounded=True)


@pytest.mark.gpu
def test_gpu_fp16_and_fp32():
    inputs, do = make_inputs(2, 600, 2, 64, 32, seed=22)
    check_against_reference(DCP, inputs, do, torch.float16, "cuda", exact_on_rounded=True)
    check_against_reference(DCP, inputs, do, torch.float32, "cuda", segment_ids=documents(2, 600, seed=22,
                                                                                         device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("n_groups", [1, 3, 12])
def test_gpu_head_groups(monkeypatch, n_groups):
    set_head_groups(monkeypatch, DCP, n_groups)
    inputs, do = make_inputs(1, 1000, 12, 64, 32, seed=23)
    check_against_reference(DCP, inputs, do, torch.bfloat16, "cuda", exact_on_rounded=True)


@pytest.mark.gpu
def test_gpu_every_element_written_and_deterministic(monkeypatch):
    inputs, do = make_inputs(2, 1001, 4, 64, 32, seed=24)
    seg = documents(2, 1001, seed=24, mean_length=200, device="cuda")
    check_written_and_deterministic(monkeypatch, DCP, inputs, do, torch.bfloat16, "cuda", segment_ids=seg)
