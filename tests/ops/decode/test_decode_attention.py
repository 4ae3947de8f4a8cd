"""The fused decode attention (ops/decode/fused.py) against the reference ``cached_attention`` (naive.py).

CPU: through Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 without CUDA), tiny odd shapes, chunks of
16 slots in blocks of 8, combined 4 splits at a time (fused._INTERPRETER), so S = 37 and 100 cross chunk and combine
boundaries; fp32 and fp16 (not bf16: the interpreter has no bf16 arithmetic of its own). On a GPU the same tiny tests
run with 32-slot chunks (DECODE_CHUNK); the tests marked `gpu` run bf16 at real sizes. Tolerance rule of the project:
the kernel's error against float64 is at most 2× the error of the same-precision PyTorch reference (cached_attention
on the same inputs in the test dtype) plus 8 fp32 ulps of the output's scale.
"""
from __future__ import annotations

import math

import pytest
import torch

from fpa_lightning.ops import kernel_inputs
from fpa_lightning.ops.decode import cached_attention, decode_attention
from fpa_lightning.ops.decode import fused as fused_mod

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def small_chunks(monkeypatch):
    """On a GPU: 32-slot chunks in 16-slot blocks, so the tiny shapes cross chunks there too (the interpreter's own
    plan is smaller still)."""
    if HAS_CUDA:
        monkeypatch.setenv("DECODE_CHUNK", "32")
        monkeypatch.setenv("DECODE_BLOCK_S", "16")


def make_inputs(B, n, H, S, D, *, bias_heads=None, seed=0, p_visible=0.7, hidden=None, device="cpu"):
    """float64 q (B, n, H, D), k, v (B, H, S, D); bias (B, bias_heads, n, S) of float32-representable values (the
    op takes float32) or None; visible (B, H, n, S) bool, random with at least one visible slot per row, with the
    slots of `hidden` (a slice) invisible everywhere when given."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, n, H, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(B, H, S, D, generator=gen, dtype=torch.float64) for _ in range(2))
    bias = None
    if bias_heads is not None:
        bias = (2.0 * torch.randn(B, bias_heads, n, S, generator=gen, dtype=torch.float64)).float().double()
    visible = torch.rand(B, H, n, S, generator=gen) < p_visible
    if hidden is not None:
        visible[..., hidden] = False
    keep = torch.randint(0, S, (B, H, n, 1), generator=gen)
    if hidden is not None:  # the guaranteed slot outside the hidden range
        outside = [s for s in range(S) if s not in range(*hidden.indices(S))]
        keep = torch.tensor(outside)[keep % len(outside)]
    visible.scatter_(-1, keep, True)
    moved = [None if t is None else t.to(device) for t in (q, k, v, bias, visible)]
    return moved, 1.0 / math.sqrt(D)


def cast(inputs, dtype, device=DEV):
    q, k, v, bias, visible = inputs
    q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
    bias = None if bias is None else bias.to(device=device, dtype=torch.float64 if dtype == torch.float64
                                             else torch.float32)
    return q, k, v, bias, visible.to(device)


def check_against_reference(inputs, scale, dtype, device=DEV, factor=2.0):
    """Kernel error <= factor × the same-precision torch error + 8 fp32 ulps of the output's scale, both against
    the float64 reference on the original inputs. Returns the kernel's output (float64, CPU)."""
    ref = cached_attention(*cast(inputs, torch.float64, "cpu"), scale)
    same = cached_attention(*cast(inputs, dtype, device), scale).double().cpu()
    with torch.no_grad():
        got = decode_attention(*cast(inputs, dtype, device), scale)
    assert got.dtype == dtype and got.shape == ref.shape
    got = got.double().cpu()
    assert torch.isfinite(got).all(), "non-finite values"
    e_k, e_t = (got - ref).abs().max().item(), (same - ref).abs().max().item()
    floor = 8 * torch.finfo(torch.float32).eps * (1.0 + ref.abs().max().item())
    assert e_k <= factor * e_t + floor, f"kernel err {e_k:.3e} > {factor}x torch err {e_t:.3e} + {floor:.1e}"
    return got


# ------------------------------------------------------------------------------------------------
# CPU (interpreter) and GPU alike: tiny odd shapes
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias_heads", [None, 1, 3], ids=["no-bias", "shared-bias", "head-bias"])
@pytest.mark.parametrize("S", [1, 37, 100])
@pytest.mark.parametrize("B, n", [(1, 1), (2, 3)], ids=["B1n1", "B2n3"])
def test_matches_reference_fp32(small_chunks, B, n, S, bias_heads):
    inputs, scale = make_inputs(B, n, 3, S, 16, bias_heads=bias_heads, seed=S + 7 * n)
    check_against_reference(inputs, scale, torch.float32)


@pytest.mark.parametrize("B, n, S, bias_heads", [(1, 1, 100, 3), (2, 3, 37, None), (2, 1, 100, 1)])
def test_matches_reference_fp32_d64(small_chunks, B, n, S, bias_heads):
    inputs, scale = make_inputs(B, n, 3, S, 64, bias_heads=bias_heads, seed=S + n)
    check_against_reference(inputs, scale, torch.float32)


@pytest.mark.parametrize("S, bias_heads, D", [(1, 3, 16), (37, 1, 16), (100, 3, 16), (100, None, 16), (100, 3, 64)])
def test_matches_reference_fp16(small_chunks, S, bias_heads, D):
    inputs, scale = make_inputs(2, 3, 3, S, D, bias_heads=bias_heads, seed=S + D)
    check_against_reference(inputs, scale, torch.float16)


# slots 16-31: one whole chunk; 0-63: the first four chunks, a whole block of the combine (the interpreter's plan);
# 48-99: the last chunks, the final one partial
HIDDEN = {"one-chunk": slice(16, 32), "first-combine-block": slice(0, 64), "tail": slice(48, 100)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("hidden", list(HIDDEN), ids=list(HIDDEN))
def test_invisible_chunks(small_chunks, hidden, dtype):
    inputs, scale = make_inputs(2, 3, 3, 100, 16, bias_heads=3, seed=5, hidden=HIDDEN[hidden])
    check_against_reference(inputs, scale, dtype)


def test_single_visible_slot_is_its_value(small_chunks):
    # one visible slot per row, far from the others' chunks: the output is that slot's v, whatever the bias
    inputs, scale = make_inputs(1, 2, 3, 100, 16, bias_heads=3, seed=3, p_visible=0.0)
    q, k, v, bias, visible = cast(inputs, torch.float32)
    with torch.no_grad():
        got = decode_attention(q, k, v, bias, visible, scale)
    slot = visible.int().argmax(dim=-1)  # (B, H, n)
    want = torch.stack([v[0, h, slot[0, h]] for h in range(3)], dim=1)[None]  # (1, n, H, D)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_row_without_visible_slot_is_zero(small_chunks):
    # not a case the decoder produces (the newest key is always visible), but no NaN: the rows are 0
    inputs, scale = make_inputs(1, 2, 3, 37, 16, seed=4)
    q, k, v, bias, visible = cast(inputs, torch.float32)
    visible[0, 1] = False  # head 1: nothing visible
    with torch.no_grad():
        got = decode_attention(q, k, v, bias, visible, scale)
    assert torch.equal(got[:, :, 1], torch.zeros_like(got[:, :, 1]))
    want = cached_attention(q, k, v, bias, visible, scale)
    torch.testing.assert_close(got[:, :, [0, 2]], want[:, :, [0, 2]])


def test_strided_inputs_match_contiguous(small_chunks):
    # q as the session makes it (a view of the fused qkv projection), k, v as head-major views of (B, S, H, D)
    # tensors, bias and visible broadcast views (stride 0) and a transposed copy: the same result, bit for bit
    inputs, scale = make_inputs(2, 2, 3, 37, 16, bias_heads=3, seed=6)
    q, k, v, bias, visible = cast(inputs, torch.float32)
    shared = bias[:, :1].contiguous()
    with torch.no_grad():
        want = decode_attention(q, k, v, bias, visible, scale)
        want_shared = decode_attention(q, k, v, shared.expand(-1, 3, -1, -1).contiguous(), visible[:, :1].expand(
            -1, 3, -1, -1).contiguous(), scale)
        qkv = torch.stack([q, q, q], dim=2)  # (B, n, 3, H, D)
        q_view = qkv.unbind(dim=2)[0]
        k_view, v_view = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
        bias_t = bias.transpose(2, 3).contiguous().transpose(2, 3)
        assert not q_view.is_contiguous() and not k_view.is_contiguous() and not bias_t.is_contiguous()
        got = decode_attention(q_view, k_view, v_view, bias_t, visible, scale)
        got_shared = decode_attention(q, k, v, shared.expand(-1, 3, -1, -1), visible[:, :1].expand(-1, 3, -1, -1),
                                      scale)
        got_one_head = decode_attention(q, k, v, shared, visible[:, :1].expand(-1, 3, -1, -1), scale)
    assert torch.equal(got, want)
    assert torch.equal(got_shared, want_shared) and torch.equal(got_one_head, want_shared)


def test_every_element_written_and_rerun_identical(small_chunks, monkeypatch):
    inputs, scale = make_inputs(1, 2, 3, 100, 16, bias_heads=1, seed=8, hidden=HIDDEN["one-chunk"])
    args = cast(inputs, torch.float32)
    with torch.no_grad():
        clean = decode_attention(*args, scale)
        monkeypatch.setattr(kernel_inputs, "TEST_HOOK_POISON_OUTPUTS", True)
        poisoned = decode_attention(*args, scale)
    assert torch.isfinite(poisoned).all() and torch.equal(poisoned, clean)


def test_value_errors():
    inputs, scale = make_inputs(1, 2, 3, 20, 16, bias_heads=3)
    q, k, v, bias, visible = cast(inputs, torch.float32)
    cases = [
        ("head dim", (q[..., :12], k[..., :12], v[..., :12], bias, visible, scale)),
        ("share one dtype", (q.double(), k.double(), v.double(), bias, visible, scale)),
        ("share one dtype", (q, k.half(), v, bias, visible, scale)),
        (r"k and v must be \(B, H, S, D\)", (q, k[:, :2], v[:, :2], bias, visible, scale)),
        (r"k and v must be \(B, H, S, D\)", (q, k, v[:, :, :10], bias, visible, scale)),
        (r"q must be \(B, n, H, D\)", (q[0], k, v, bias, visible, scale)),
        ("empty", (q, k[:, :, :0], v[:, :, :0], None, visible[..., :0], scale)),
        ("bias must be None or", (q, k, v, bias[:, :2], visible, scale)),
        ("bias must be None or", (q, k, v, bias[..., :10], visible, scale)),
        ("bias must be float32", (q, k, v, bias.double(), visible, scale)),
        ("bias must be a torch.Tensor or None", (q, k, v, 1.0, visible, scale)),
        ("visible must be", (q, k, v, bias, visible[:, :1], scale)),
        ("visible must be a bool", (q, k, v, bias, visible.float(), scale)),
        ("scale", (q, k, v, bias, visible, float("nan"))),
        ("scale", (q, k, v, bias, visible, None)),
    ]
    for message, args in cases:
        with pytest.raises(ValueError, match=message):
            decode_attention(*args)


def test_the_custom_op_is_the_op_and_compiles_without_a_graph_break(small_chunks):
    """decode_attention_op (what DecodeSession calls) returns decode_attention's result bit for bit, passes
    torch.library's checks of its schema and fake, and traces under torch.compile with fullgraph=True: one graph,
    where torch.compiler.disable would break it at every layer."""
    from fpa_lightning.ops.decode import decode_attention_op
    inputs, scale = make_inputs(2, 1, 3, 37, 16, bias_heads=1)
    args = cast(inputs, torch.float32)
    with torch.no_grad():
        want = decode_attention(*args, scale)
        assert torch.equal(decode_attention_op(*args, scale), want)
        no_bias = (*args[:3], None, args[4])
        assert torch.equal(decode_attention_op(*no_bias, scale), decode_attention(*no_bias, scale))
        torch.library.opcheck(decode_attention_op, (*args, scale), test_utils=("test_schema", "test_faketensor"))

        def layer(q, k, v, bias, visible):  # the step's use: the op between elementwise work
            return decode_attention_op(q * 1.0, k, v, bias, visible, scale) + 0.0

        torch._dynamo.reset()
        compiled = torch.compile(layer, fullgraph=True, backend="eager")
        assert torch.equal(compiled(*args), want)


def test_grad_requiring_inputs_raise():
    inputs, scale = make_inputs(1, 1, 3, 20, 16, bias_heads=1)
    q, k, v, bias, visible = cast(inputs, torch.float32)
    for name in ("q", "v", "bias"):
        args = {"q": q, "k": k, "v": v, "bias": bias, "visible": visible}
        args[name] = args[name].clone().requires_grad_()
        with pytest.raises(ValueError, match="inference only"):
            decode_attention(**args, scale=scale)
        with torch.no_grad():
            decode_attention(**args, scale=scale)  # fine without grad mode


def test_non_cuda_tensors_rejected_outside_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    inputs, scale = make_inputs(1, 1, 3, 20, 16)
    with pytest.raises(ValueError, match="CUDA"):
        decode_attention(*cast(inputs, torch.float32, "cpu"), scale)
    assert "CUDA" in fused_mod.unsupported_reason(torch.device("cpu"), 64, torch.bfloat16)


def test_unsupported_reason():
    dev = torch.device(DEV)
    assert fused_mod.unsupported_reason(dev, 64, torch.bfloat16) is None
    assert "head dim" in fused_mod.unsupported_reason(dev, 8, torch.float32)
    assert "bf16" in fused_mod.unsupported_reason(dev, 16, torch.float64)


def test_plan_fills_the_gpu_and_covers_every_slot(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(fused_mod, "_sm_count", lambda index: 132)  # an H200
    cuda = torch.device("cuda", 0)
    for rows, S, D, want_block, want_chunk in [(12, 8192, 64, 64, 256), (12, 16384, 64, 64, 512),
                                               (96, 16384, 64, 64, 4096), (12, 1024, 64, 64, 128),
                                               (1, 64, 16, 64, 128), (96, 8192, 128, 32, 2048)]:
        block, chunk, splits, sb = fused_mod.plan_splits(rows, S, D, cuda)
        assert (block, chunk) == (want_block, want_chunk)
        assert (splits - 1) * chunk < S <= splits * chunk and sb & (sb - 1) == 0 and sb <= min(16, 2 * splits)
        if rows * S >= 2 * 132 * fused_mod.MIN_CHUNK:  # work for two minimal chunks per SM
            assert rows * splits >= 2 * 132
    # the decoding step's attention (ops/decode/step) plans with blocks of 8192 values without FPA's state
    assert [fused_mod.plan_splits(12, 8192, D, cuda, block_values=8192, env="STEP")[0] for D in (16, 64, 128)] == [
        128, 128, 64]
    monkeypatch.setenv("DECODE_CHUNK", "96")
    with pytest.raises(ValueError, match="divide the chunk"):
        fused_mod.plan_splits(12, 8192, 64, cuda)
    monkeypatch.setenv("STEP_CHUNK", "96")
    with pytest.raises(ValueError, match="step_attention: the block must be a power of two and divide the chunk"):
        fused_mod.plan_splits(12, 8192, 64, cuda, block_values=8192, env="STEP", op="step_attention")


# ------------------------------------------------------------------------------------------------
# GPU: bf16 at real sizes (12 heads of 64, the 110M model's), judged by the same rule
# ------------------------------------------------------------------------------------------------
GPU_CASES = [(B, S, bias) for B in (1, 8) for S in (8192, 16384) for bias in (None, 1, 12)]


@pytest.mark.gpu
@pytest.mark.parametrize("B, S, bias_heads", GPU_CASES, ids=lambda c: str(c))
def test_gpu_bf16_real_sizes(B, S, bias_heads):
    # visible mostly true (a decode cache: 95 %), plus one hidden range of 3000 slots (whole chunks at any plan)
    inputs, scale = make_inputs(B, 1, 12, S, 64, bias_heads=bias_heads, seed=B + S + (bias_heads or 0),
                                p_visible=0.95, hidden=slice(2000, 5000), device="cuda")
    check_against_reference(inputs, scale, torch.bfloat16, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("D", [16, 32, 128])
def test_gpu_bf16_head_dims_and_pieces(D):
    # the other head dims, and n = 5 new queries per row (extend), with a layer-shared bias
    inputs, scale = make_inputs(2, 5, 4, 3001, D, bias_heads=1, seed=D, p_visible=0.9, device="cuda")
    check_against_reference(inputs, scale, torch.bfloat16, "cuda")


@pytest.mark.gpu
def test_gpu_fp16_and_fp32():
    inputs, scale = make_inputs(2, 1, 12, 4099, 64, bias_heads=12, seed=1, p_visible=0.9, device="cuda")
    check_against_reference(inputs, scale, torch.float16, "cuda")
    check_against_reference(inputs, scale, torch.float32, "cuda")


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_equals_eager():
    inputs, scale = make_inputs(1, 1, 12, 8192, 64, bias_heads=12, seed=2, p_visible=0.95, device="cuda")
    args = cast(inputs, torch.bfloat16, "cuda")
    with torch.no_grad():
        eager = decode_attention(*args, scale)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            decode_attention(*args, scale)  # warm (compiled) before capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = decode_attention(*args, scale)
        graph.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, eager)
