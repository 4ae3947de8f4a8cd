"""FPA piece attention: the fused kernel (ops/fpa/piece/fused.py) against its definition (naive.py).

CPU: through Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1 without CUDA), tiny odd shapes in
16 × 16 tiles, so n = 19 and 40 cross query tiles and S = 23 and 70 cross slot blocks; fp32 and fp16 (the interpreter
has no bf16 arithmetic of its own). The tests marked `gpu` run bf16 at the sizes of scoring a 110M model's document.
Tolerance rule of the project: the kernel's error against float64 is at most 2× the error of the same-precision
PyTorch reference (naive.py on the same inputs in the test dtype) plus 8 fp32 ulps of the output's scale. The fields
are multiples of 1/8 and β a power of two, so every bias is exact in float32 and the kept counts must agree exactly.
"""
from __future__ import annotations

import math

import pytest
import torch

from fpa_lightning.ops import kernel_inputs
from fpa_lightning.ops.common import FAR
from fpa_lightning.ops.fpa.piece import fused as fused_mod
from fpa_lightning.ops.fpa.piece import naive, path_min_after

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"


def make_cache(B, n, H, S, D, *, seed=0, start=None, free=0.3, device="cpu"):
    """A cache as a decoding session holds it: per (b, h) the older keys (positions < start[b]) in random slots, some
    slots free, the piece's n keys written into the first free slots; float64 q, k, v; path minima of the older keys
    and levels as multiples of 1/8, FAR for the piece's own keys; the piece's φ a walk of eighths; β in
    {0.5, 1, 2}."""
    gen = torch.Generator().manual_seed(seed)
    start = torch.tensor(start if start is not None else [S - n - 2 - b for b in range(B)], dtype=torch.int64)
    key_pos = torch.full((B, H, S), -1, dtype=torch.int32)
    for b in range(B):
        for h in range(H):
            slots = torch.randperm(S, generator=gen)
            older = torch.randperm(int(start[b]), generator=gen)[: int((S - n) * (1 - free))]  # kept older keys
            key_pos[b, h, slots[: len(older)]] = older.sort().values.to(torch.int32)
            free_slots = slots[len(older):].sort().values[:n]
            key_pos[b, h, free_slots] = (start[b] + torch.arange(n)).to(torch.int32)
    eighths = lambda *shape: torch.randint(-24, 24, shape, generator=gen).double() / 8  # noqa: E731
    path_min = torch.where(key_pos < start[:, None, None], eighths(B, H, S), FAR)
    level = eighths(B, H, S)
    phi = eighths(B, H, n).cumsum(-1) / 4  # a walk (quarters of eighths stay exact)
    beta = torch.tensor([0.5, 1.0, 2.0] * H, dtype=torch.float64)[:H]
    q = torch.randn(B, n, H, D, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(B, H, S, D, generator=gen, dtype=torch.float64) for _ in range(2))
    fields = [t.float() for t in (path_min, level, phi, beta)]
    return [t.to(device) for t in (q, k, v, key_pos, *fields, start)], 1.0 / math.sqrt(D)


def cast(inputs, dtype, device=DEV):
    q, k, v, key_pos, path_min, level, phi, beta, start = inputs
    q, k, v = (t.to(device=device, dtype=dtype) for t in (q, k, v))
    fields = (t.to(device=device, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
              for t in (path_min, level, phi, beta))
    return (q, k, v, key_pos.to(device), *fields, start.to(device))


def check_against_reference(inputs, scale, threshold, dtype, device=DEV, factor=2.0):
    """out within factor × the same-precision torch error (+ 8 fp32 ulps) of float64; kept exactly float64's."""
    ref, ref_kept = naive.fpa_piece_attention(*cast(inputs, torch.float64, "cpu"), scale, threshold)
    same, _ = naive.fpa_piece_attention(*cast(inputs, dtype, device), scale, threshold)
    with torch.no_grad():
        got, kept = fused_mod.fpa_piece_attention(*cast(inputs, dtype, device), scale, threshold)
    assert got.dtype == dtype and got.shape == ref.shape and kept.shape == ref_kept.shape
    assert torch.equal(kept.cpu(), ref_kept), "kept counts differ from the definition"
    got = got.double().cpu()
    assert torch.isfinite(got).all(), "non-finite values"
    e_k, e_t = (got - ref).abs().max().item(), (same.double().cpu() - ref).abs().max().item()
    floor = 8 * torch.finfo(torch.float32).eps * (1.0 + ref.abs().max().item())
    assert e_k <= factor * e_t + floor, f"kernel err {e_k:.3e} > {factor}x torch err {e_t:.3e} + {floor:.1e}"
    return ref_kept


# ------------------------------------------------------------------------------------------------
# CPU (interpreter) and GPU alike: tiny odd shapes
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("threshold", [float("-inf"), -1.03], ids=["no-eviction", "evict"])
@pytest.mark.parametrize("B, n, S", [(1, 1, 23), (2, 5, 23), (1, 19, 70), (2, 40, 70)])
def test_matches_definition_fp32(B, n, S, threshold):
    inputs, scale = make_cache(B, n, 3, S, 16, seed=S + n)
    kept = check_against_reference(inputs, scale, threshold, torch.float32)
    seen_all = check_against_reference(inputs, scale, float("-inf"), torch.float32) if threshold > -math.inf else kept
    if threshold > -math.inf:  # the threshold really evicted keys, and never a query's own
        assert (kept < seen_all).any() and (kept >= 1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_matches_definition_d64(dtype):
    inputs, scale = make_cache(2, 21, 2, 50, 64, seed=3)
    check_against_reference(inputs, scale, -0.9, dtype)


def test_matches_definition_fp16():
    inputs, scale = make_cache(2, 19, 3, 70, 16, seed=4)
    check_against_reference(inputs, scale, -1.03, torch.float16)


def test_a_threshold_above_every_bias_keeps_only_the_query_s_own_key():
    # every bias is ≤ 0, so 0.5 rejects every key but the one each query has just written (never dropped)
    inputs, scale = make_cache(2, 19, 3, 23, 16, seed=8)
    kept = check_against_reference(inputs, scale, 0.5, torch.float32)
    assert (kept == 1).all()


def pad_with_free_slots(inputs, extra: int, seed: int = 0):
    """The cache of `inputs` with `extra` free slots at the end (garbage K, V and fields), as a cache grown ahead of
    the keys it holds: whole blocks of free slots."""
    q, k, v, key_pos, path_min, level, phi, beta, start = inputs
    gen = torch.Generator().manual_seed(seed)
    B, H, _, D = k.shape
    garbage = lambda *shape: torch.randn(*shape, generator=gen, dtype=k.dtype)  # noqa: E731
    k, v = (torch.cat([t, garbage(B, H, extra, D)], dim=2) for t in (k, v))
    key_pos = torch.cat([key_pos, torch.full((B, H, extra), -1, dtype=key_pos.dtype)], dim=-1)
    path_min, level = (torch.cat([t, garbage(B, H, extra).float()], dim=-1) for t in (path_min, level))
    return [q, k, v, key_pos, path_min, level, phi, beta, start]


@pytest.mark.parametrize("threshold", [float("-inf"), -0.3])
def test_blocks_of_free_slots_and_of_evicted_keys_add_nothing(threshold):
    # 40 slots in use, then 3 blocks of free slots and a partial one; at −0.3 most older keys are evicted, so
    # whole blocks have no key any query of a tile keeps
    inputs, scale = make_cache(2, 19, 3, 40, 16, seed=10, free=0.1)
    padded = pad_with_free_slots(inputs, 57)
    kept = check_against_reference(padded, scale, threshold, torch.float32)
    assert torch.equal(kept, check_against_reference(inputs, scale, threshold, torch.float32))


def test_a_block_holding_only_the_first_key_is_read():
    # the first key (position 0, often the one every head keeps) alone in a block of free slots
    inputs, scale = make_cache(1, 5, 2, 32, 16, seed=11, start=[40], free=0.2)
    q, k, v, key_pos, path_min, level, phi, beta, start = inputs
    key_pos = key_pos.masked_fill(key_pos == 0, -1)
    front = torch.full((1, 2, 16), -1, dtype=key_pos.dtype)
    front[..., 5] = 0
    k, v = (torch.cat([t[:, :, :16], t], dim=2) for t in (k, v))
    path_min, level = (torch.cat([t[..., :16], t], dim=-1) for t in (path_min, level))
    padded = [q, k, v, torch.cat([front, key_pos], dim=-1), path_min, level, phi, beta, start]
    kept = check_against_reference(padded, scale, float("-inf"), torch.float32)
    assert (kept == (padded[3] >= 0).sum(-1, keepdim=True) - 4 + torch.arange(5)).all()  # everything, causally


def test_rows_with_different_starts_and_a_piece_larger_than_the_past():
    # row 0's piece starts at position 3 (most slots free), row 1's at 40; n = 33 crosses three query tiles
    inputs, scale = make_cache(2, 33, 2, 80, 16, seed=5, start=[3, 40], free=0.5)
    check_against_reference(inputs, scale, -0.6, torch.float32)


def test_strided_inputs_match_contiguous():
    # as the session passes them: q a view of the fused qkv projection, start a column of query_pos (B, n), the
    # per-key state and key_pos transposed copies, beta a strided slice
    inputs, scale = make_cache(2, 19, 3, 23, 16, seed=9)
    q, k, v, key_pos, path_min, level, phi, beta, start = cast(inputs, torch.float32)
    with torch.no_grad():
        want = fused_mod.fpa_piece_attention(q, k, v, key_pos, path_min, level, phi, beta, start, scale, -1.03)
        q_view = torch.stack([q, q, q], dim=2).unbind(dim=2)[1]
        start_column = (start[:, None] + torch.arange(19, device=start.device))[:, 0]
        key_pos_t, path_min_t, level_t = (t.transpose(1, 2).contiguous().transpose(1, 2)
                                          for t in (key_pos, path_min, level))
        beta_strided = torch.stack([beta, beta], dim=1)[:, 0]
        assert not (q_view.is_contiguous() or start_column.is_contiguous() or key_pos_t.is_contiguous()
                    or beta_strided.is_contiguous())
        got = fused_mod.fpa_piece_attention(q_view, k, v, key_pos_t, path_min_t, level_t, phi.transpose(1, 2)
                                            .contiguous().transpose(1, 2), beta_strided, start_column, scale, -1.03)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_range_min_table_answers_every_range():
    phi = torch.randn(2, 3, 37, dtype=torch.float32)
    table = fused_mod.range_min_table(phi)  # (6, LEVELS, 37)
    assert table.shape == (6, 6, 37)
    flat = phi.reshape(6, 37)
    for lo in range(37):
        for hi in range(lo, 37):
            level = (hi - lo + 1).bit_length() - 1
            got = torch.minimum(table[:, level, lo], table[:, level, hi - (1 << level) + 1])
            assert torch.equal(got, flat[:, lo : hi + 1].min(dim=-1).values), (lo, hi)


def test_path_min_after_is_the_last_query_s_minimum():
    inputs, _ = make_cache(2, 9, 3, 30, 16, seed=6)
    _, _, _, key_pos, path_min, _, phi, _, start = inputs
    want = path_min.clone()
    for t in range(phi.shape[-1]):  # the definition: query t moves every key older than itself
        older = key_pos < (start + t)[:, None, None]
        want = torch.where(older, torch.minimum(want, phi[..., t : t + 1]), want)
    got = path_min_after(path_min, phi, key_pos, start)
    live = key_pos >= 0
    assert torch.equal(got[live], want[live])


def test_every_element_written_and_rerun_identical(monkeypatch):
    inputs, scale = make_cache(2, 19, 3, 23, 16, seed=7)
    args = cast(inputs, torch.float32)
    with torch.no_grad():
        clean = fused_mod.fpa_piece_attention(*args, scale, -1.03)
        monkeypatch.setattr(kernel_inputs, "TEST_HOOK_POISON_OUTPUTS", True)
        poisoned = fused_mod.fpa_piece_attention(*args, scale, -1.03)
    assert torch.isfinite(poisoned[0]).all() and (poisoned[1] >= 1).all()
    assert torch.equal(poisoned[0], clean[0]) and torch.equal(poisoned[1], clean[1])


def test_value_errors():
    inputs, scale = make_cache(1, 4, 3, 20, 16)
    q, k, v, key_pos, path_min, level, phi, beta, start = cast(inputs, torch.float32)
    good = dict(q=q, k=k, v=v, key_pos=key_pos, path_min=path_min, level=level, phi=phi, beta=beta, start=start,
                scale=scale, threshold=-1.0)
    cases = [
        ("head dim", dict(q=q[..., :12], k=k[..., :12], v=v[..., :12])),
        ("share one dtype", dict(k=k.half())),
        (r"k and v must be \(B, H, S, D\)", dict(k=k[:, :2], v=v[:, :2])),
        (r"q must be \(B, n, H, D\)", dict(q=q[0])),
        ("key_pos must be torch.int32", dict(key_pos=key_pos.long())),
        ("path_min must be torch.float32", dict(path_min=path_min[..., :5])),
        ("phi must be torch.float32", dict(phi=phi.double())),
        ("beta must be", dict(beta=beta[:2])),
        ("start must be torch.int64", dict(start=start.int())),
        ("start must be a torch.Tensor", dict(start=3)),
        ("scale", dict(scale=float("nan"))),
        ("threshold", dict(threshold=float("inf"))),
        ("threshold", dict(threshold=float("nan"))),
    ]
    for message, change in cases:
        with pytest.raises(ValueError, match=message):
            fused_mod.fpa_piece_attention(**{**good, **change})


def test_grad_requiring_inputs_raise():
    inputs, scale = make_cache(1, 3, 3, 20, 16)
    args = list(cast(inputs, torch.float32))
    args[0] = args[0].clone().requires_grad_()
    with pytest.raises(ValueError, match="inference only"):
        fused_mod.fpa_piece_attention(*args, scale, -1.0)
    with torch.no_grad():
        fused_mod.fpa_piece_attention(*args, scale, -1.0)  # fine without grad mode


def test_non_cuda_tensors_rejected_outside_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    inputs, scale = make_cache(1, 3, 3, 20, 16)
    with pytest.raises(ValueError, match="CUDA"):
        fused_mod.fpa_piece_attention(*cast(inputs, torch.float32, "cpu"), scale, -1.0)
    assert "CUDA" in fused_mod.unsupported_reason(torch.device("cpu"), 64, torch.bfloat16)
    assert "head dim" in fused_mod.unsupported_reason(torch.device("cuda"), 8, torch.bfloat16)


# ------------------------------------------------------------------------------------------------
# GPU: bf16 at the sizes of scoring a 110M model's document with real eviction (12 heads of 64)
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("n, S", [(512, 1200), (512, 8704), (2048, 10240), (37, 3001)])
def test_gpu_bf16_real_sizes(n, S):
    inputs, scale = make_cache(1, n, 12, S, 64, seed=n + S, free=0.2, device="cpu")
    check_against_reference(inputs, scale, -2.03, torch.bfloat16, "cuda")
