"""The fused Selective Attention kernel against its definition (ops/selective/naive.py).

CPU: through Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 without CUDA), tiny odd shapes, block
size 16, fp32 and fp16 (the interpreter's bf16 dot is wrong). GPU (marked `gpu`): bf16 and fp16 at real sizes.
Tolerance rule: the kernel's error against a float64 reference is at most 2× the error of the same-precision PyTorch
definition (the naive op run on the same low-precision inputs), plus a few fp32 ulps of the tensor's scale, for the
output and the gradients of q, k and v (head 0's q and k include the gradient through the layer-shared F).
"""
from __future__ import annotations

import pytest
import torch

from _carry_table_tests import *  # noqa: F401,F403 (the tests Selective and DCP share, run here on Selective)
from _ops_helpers import DEV, FusedOp, check_against_reference, check_common_value_errors, documents, max_err, run
from _ops_helpers import check_written_and_deterministic, set_head_groups
from _ops_helpers import test_non_cuda_tensors_rejected_outside_interpreter  # noqa: F401 (run here, on Selective)
from fpa_lightning.ops.selective import fused as fused_mod
from fpa_lightning.ops.selective import selective_attention_fused, selective_attention_naive, selective_bias
from fpa_lightning.ops.common import dense_attention


def make_inputs(B, T, H, D, *, seed=0, q_scale=1.0):
    """float64 q, k, v, dO on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(B, T, H, D, generator=gen, dtype=torch.float64) for _ in range(4))
    return (q * q_scale, k, v), do


SELECTIVE = FusedOp(selective_attention_fused, selective_attention_naive, fused_mod, make_inputs,
                    names=("out", "dq", "dk", "dv"),
                    custom_ops=(fused_mod.selective_forward_op, fused_mod.selective_backward_op))
NAMES = SELECTIVE.names


@pytest.fixture
def op():
    """The op the shared tests (imported from _carry_table_tests and _ops_helpers) check."""
    return SELECTIVE


# ------------------------------------------------------------------------------------------------
# CPU (interpreter) and GPU alike: tiny shapes
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("B,T,H", [(2, 1, 2), (2, 5, 2), (2, 16, 2), (2, 37, 2), (1, 70, 3)])
def test_matches_reference(B, T, H):
    inputs, do = make_inputs(B, T, H, 16, seed=T)
    check_against_reference(SELECTIVE, inputs, do, torch.float32, DEV)


def test_scan_prefix_matches_reference(monkeypatch):
    # the scan prefix (test_scan_prefix_matches_dot_prefix: the dot path's result up to rounding) meets the 2x rule
    # as well
    monkeypatch.setattr(fused_mod, "_prefix_by_dot", lambda: False)
    inputs, do = make_inputs(2, 37, 2, 16, seed=12)
    check_against_reference(SELECTIVE, inputs, do, torch.float32, DEV, segment_ids=documents(2, 37, seed=12))


def test_gradient_through_f_is_checked():
    # The selection's gradient into head 0's q and k is far above the tolerance of the checks above: a kernel that
    # dropped it (F treated as a constant) would fail them. Reference without it: F computed from detached q0, k0.
    inputs, do = make_inputs(2, 37, 2, 16, seed=14)
    got, ref = check_against_reference(SELECTIVE, inputs, do, torch.float32, DEV)

    def f_constant(q, k, v):
        return dense_attention(q, k, v, selective_bias(q.detach(), k.detach()))

    no_f = run(f_constant, inputs, do, torch.float64, DEV)
    for i in (1, 2):  # dq, dk
        through_f = max_err(no_f[i][:, :, 0], ref[i][:, :, 0])
        assert through_f > 1e3 * max_err(got[i], ref[i]), NAMES[i]
        assert torch.allclose(no_f[i][:, :, 1:], ref[i][:, :, 1:], atol=1e-12)  # other heads: no F path


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
    check_common_value_errors(SELECTIVE)
    with pytest.raises(ValueError, match="head dim"):
        selective_attention_fused(*(torch.zeros(1, 8, 2, 256, device=DEV) for _ in range(3)))


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
    check_against_reference(SELECTIVE, inputs, do, torch.bfloat16, "cuda", segment_ids=seg)


@pytest.mark.gpu
@pytest.mark.parametrize("docs", [False, True], ids=["dense", "docs"])
def test_gpu_bf16_2048_exact_on_rounded(docs):
    inputs, do = make_inputs(2, 2048, 4, 64, seed=21)
    seg = documents(2, 2048, seed=21, mean_length=300, device="cuda") if docs else None
    check_against_reference(SELECTIVE, inputs, do, torch.bfloat16, "cuda", exact_on_rounded=True, segment_ids=seg)


@pytest.mark.gpu
def test_gpu_fp16_and_fp32():
    inputs, do = make_inputs(2, 600, 2, 64, seed=22)
    check_against_reference(SELECTIVE, inputs, do, torch.float16, "cuda", exact_on_rounded=True)
    check_against_reference(SELECTIVE, inputs, do, torch.float32, "cuda",
                            segment_ids=documents(2, 600, seed=22, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("n_groups", [1, 3, 12])
def test_gpu_head_groups(monkeypatch, n_groups):
    set_head_groups(monkeypatch, SELECTIVE, n_groups)
    inputs, do = make_inputs(1, 1000, 12, 64, seed=23)
    check_against_reference(SELECTIVE, inputs, do, torch.bfloat16, "cuda", exact_on_rounded=True)


@pytest.mark.gpu
def test_gpu_every_element_written_and_deterministic(monkeypatch):
    inputs, do = make_inputs(2, 1001, 4, 64, seed=24)
    seg = documents(2, 1001, seed=24, mean_length=200, device="cuda")
    check_written_and_deterministic(monkeypatch, SELECTIVE, inputs, do, torch.bfloat16, "cuda", segment_ids=seg)


@pytest.mark.gpu
def test_gpu_scan_prefix(monkeypatch):
    monkeypatch.setattr(fused_mod, "_prefix_by_dot", lambda: False)
    inputs, do = make_inputs(2, 2048, 4, 64, seed=25)
    check_against_reference(SELECTIVE, inputs, do, torch.bfloat16, "cuda", exact_on_rounded=True)
