"""The decoding step's fused ops (ops/decode/step/fused.py) against their definitions (naive.py).

CPU: through Triton's interpreter, tiny odd shapes (fused._INTERPRETER: attention chunks of 16 slots in blocks of 8,
a slot scan of 8, a gate-map block of 16, so S = 37 and 100 and C = 24 and 40 cross every boundary); fp32 and fp16
(the interpreter has no bf16 arithmetic of its own). The tests marked `gpu` run the same in bf16 at the 110M model's
sizes. Tolerance rule of the project: the kernel's error against the float64 definition is at most 2x the error of
the same-precision definition (naive.py in the test dtype) plus 8 fp32 ulps of the result's scale; slots, positions
and evictions must be equal to the same-precision definition's. Inference only: the ops have no gradients.
"""
from __future__ import annotations

import math

import pytest
import torch

from fpa_lightning.attention.layer import RotaryEmbedding
from fpa_lightning.ops.common import FAR, FREE
from fpa_lightning.ops.decode.step import fused, naive

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if HAS_CUDA else [])


def assert_bound(got, same, ref, what):
    got, same, ref = (t.double().cpu() for t in (got, same, ref))
    assert torch.isfinite(got).all(), f"{what}: non-finite values"
    e_k, e_t = (got - ref).abs().max().item(), (same - ref).abs().max().item()
    floor = 8 * torch.finfo(torch.float32).eps * (1.0 + ref.abs().max().item())
    assert e_k <= 2 * e_t + floor, f"{what}: kernel err {e_k:.3e} > 2x torch err {e_t:.3e} + {floor:.1e}"


def on(tensors, dtype, device=DEV):
    """Copies of float64 CPU tensors: floating ones in `dtype` unless marked fp32 (a (tensor, "fp32") pair keeps
    float32, float64 in a float64 run), integer ones as they are."""
    out = []
    for t in tensors:
        keep32 = isinstance(t, tuple)
        t = t[0] if keep32 else t
        if t is None or not t.is_floating_point():
            out.append(None if t is None else t.to(device).clone())
        else:
            out.append(t.to(device=device, dtype=torch.float64 if dtype == torch.float64 else
                            torch.float32 if keep32 else dtype).clone())
    return out


# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 37), (2, 5, 48)])
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm_matches_its_definition(dtype, shape, with_delta):
    gen = torch.Generator().manual_seed(0)
    x, delta = (torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(2))
    weight = 1 + 0.3 * torch.randn(shape[-1], generator=gen, dtype=torch.float64)
    delta = delta if with_delta else None
    ref = naive.add_rms_norm(x, delta, weight, 1e-5)
    same = naive.add_rms_norm(*on((x, delta, weight), dtype), 1e-5)
    with torch.no_grad():
        got = fused.add_rms_norm(*on((x, delta, weight), dtype), 1e-5)
    for name, g, s, r in zip(("sum", "norm"), got, same, ref):
        assert g.dtype == dtype and g.shape == r.shape
        assert_bound(g, s, r, name)
    if with_delta:  # the sum rounds once, as torch's add does
        torch.testing.assert_close(got[0].cpu(), same[0].cpu(), atol=0, rtol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 74), (2, 3, 80)])
def test_silu_mul_matches_its_definition(dtype, shape):
    gate_up = 3 * torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    ref, same = naive.silu_mul(gate_up), naive.silu_mul(*on((gate_up,), dtype))
    with torch.no_grad():
        got = fused.silu_mul(*on((gate_up,), dtype))
    assert got.dtype == dtype and got.shape == ref.shape
    assert_bound(got, same, ref, "silu_mul")


# ------------------------------------------------------------------------------------------------------------------
def cache_inputs(B, H, S, D, *, t, append, seed, p_free=0.4):
    """float64 k, v caches (B, H, S, D) and int32 key_pos (B, H, S): without eviction (append) positions 0..t−1 in
    their own slots, the rest free; with eviction random distinct positions below t in random slots, about p_free of
    them free (at least one per (row, head)). t: (B,) positions of the new tokens."""
    gen = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(B, H, S, D, generator=gen, dtype=torch.float64) for _ in range(2))
    key_pos = torch.full((B, H, S), FREE, dtype=torch.int32)
    for b in range(B):
        for h in range(H):
            if append:
                key_pos[b, h, : t[b]] = torch.arange(t[b], dtype=torch.int32)
                continue
            held = torch.rand(S, generator=gen) > p_free
            held[torch.randint(0, S, (1,), generator=gen)] = False
            count = int(held.sum())
            key_pos[b, h, held] = torch.randperm(max(t[b], count), generator=gen)[:count].sort().values.int()
    return k, v, key_pos


def fpa_state(B, H, S, C, G, *, seed):
    """FPA's gate map (G·H, C) and bias, the walk (B, H) and the per-key level and path minimum (B, H, S), float64
    values of float32 (the ops take float32), some path minima FAR (keys whose range is still empty)."""
    gen = torch.Generator().manual_seed(seed)
    f32 = lambda t: t.float().double()  # noqa: E731
    weight = f32(0.3 * torch.randn(G * H, C, generator=gen, dtype=torch.float64))
    bias = f32(torch.randn(G * H, generator=gen, dtype=torch.float64))
    walk = f32(torch.randn(B, H, generator=gen, dtype=torch.float64))
    level = f32(2 * torch.randn(B, H, S, generator=gen, dtype=torch.float64))
    path_min = f32(2 * torch.randn(B, H, S, generator=gen, dtype=torch.float64))
    path_min[torch.rand(B, H, S, generator=gen) < 0.2] = FAR
    return weight, bias, walk, level, path_min


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("append", [True, False], ids=["append", "evicting"])
@pytest.mark.parametrize("rope", [True, False], ids=["rope", "norope"])
@pytest.mark.parametrize("maps", [0, 1, 2, 3], ids=["softmax", "fpa-stack", "fpa-2maps", "fpa-3maps"])
def test_store_token_matches_its_definition(dtype, append, rope, maps):
    B, H, S, D, C = 3, 2, 37, 16, 40
    t = [5, 36, 0]
    gen = torch.Generator().manual_seed(2)
    k_cache, v_cache, key_pos = cache_inputs(B, H, S, D, t=t, append=append, seed=3)
    qkv = torch.randn(B, 3 * H * D, generator=gen, dtype=torch.float64)
    positions = torch.tensor(t)
    tables = RotaryEmbedding(D, 10000.0).tables(64, torch.device("cpu")) if rope else (None, None)
    x = torch.randn(B, C, generator=gen, dtype=torch.float64)
    gate = fpa_state(B, H, S, C, maps, seed=4) if maps else (None,) * 5
    weight, bias, walk, level, path_min = gate

    def run(op, dtype, device):
        tabs = [(table, "fp32") for table in tables] if rope else [None, None]
        fpa = [(weight, "fp32"), (bias, "fp32"), x, (walk, "fp32"), (level, "fp32"), (path_min, "fp32")] if maps else []
        args = on([qkv, positions, *tabs, k_cache, v_cache, key_pos, *fpa], dtype, device)
        with torch.no_grad():
            q, k, slots, phi = op(*args[:7], append, *args[7:])
        return [q, k, slots, phi, *args[4:7], *args[10:13]]  # the caches after the write

    ref = run(naive.store_token, torch.float64, "cpu")
    same = run(naive.store_token, dtype, DEV)
    got = run(fused.store_token, dtype, DEV)
    names = ["q", "k", "slots", "phi", "k_cache", "v_cache", "key_pos", "walk", "level", "path_min"]
    for name, g, s, r in zip(names, got, same, ref):
        if r is None:
            assert g is None, name
        elif not r.is_floating_point():
            assert torch.equal(g.cpu().long(), s.cpu().long()), name
        else:
            assert_bound(g, s, r, name)
    expected = positions[:, None].expand(B, H) if append else (key_pos == FREE).int().argmax(-1)
    assert torch.equal(got[2].cpu(), expected)


# ------------------------------------------------------------------------------------------------------------------
def attention_inputs(B, H, S, D, *, t, seed):
    """q (B, H, D), caches with random distinct positions up to t per (row, head) (the newest, t itself, among them)
    in random slots, some free, and one key in the future of row 0 (invisible)."""
    k, v, key_pos = cache_inputs(B, H, S, D, t=t, append=False, seed=seed, p_free=0.3)
    for b in range(B):
        for h in range(H):
            free = (key_pos[b, h] == FREE).nonzero()[:, 0]
            key_pos[b, h, free[0]] = t[b]  # the new token's key
            if b == 0 and len(free) > 1:
                key_pos[b, h, free[1]] = t[b] + 3  # never visible
    q = torch.randn(B, H, D, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    return q, k, v, key_pos


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("S", [37, 100])
@pytest.mark.parametrize("variant", ["softmax", "fpa", "fpa-evict"])
def test_step_attention_matches_its_definition(dtype, S, variant):
    B, H, D = 2, 3, 16
    t = [S + 3, 2 * S]
    q, k, v, key_pos = attention_inputs(B, H, S, D, t=t, seed=5)
    positions = torch.tensor(t)
    scale = 1 / math.sqrt(D)
    fpa = variant != "softmax"
    _, _, _, level, path_min = fpa_state(B, H, S, 8, 1, seed=6)
    phi = torch.randn(B, H, generator=torch.Generator().manual_seed(7), dtype=torch.float64).float().double()
    beta_raw = torch.tensor([0.5413, -1.0, 1.5], dtype=torch.float64).float().double()
    threshold = -1.0 if variant == "fpa-evict" else float("-inf")

    def run(op, dtype, device):
        state = ((path_min, "fp32"), (level, "fp32"), (phi, "fp32"), (beta_raw, "fp32")) if fpa else (None,) * 4
        args = on((q, k, v, key_pos, positions, *state), dtype, device)
        with torch.no_grad():
            out = op(*args[:5], scale, *args[5:], threshold)
        return out, args[3], args[5]

    ref_out, ref_pos, ref_min = run(naive.step_attention, torch.float64, "cpu")
    same_out, same_pos, same_min = run(naive.step_attention, dtype, DEV)
    got_out, got_pos, got_min = run(fused.step_attention, dtype, DEV)
    assert got_out.dtype == dtype and got_out.shape == (B, H, D)
    assert_bound(got_out, same_out, ref_out, "out")
    assert torch.equal(got_pos.cpu(), same_pos.cpu())  # the same keys evicted
    if fpa:
        assert torch.equal(got_min.cpu(), same_min.cpu())  # minima of the same float32 values
        # and the float64 definition's, FAR apart (float32 rounds 1e30)
        assert torch.equal(got_min.cpu().double().clamp(max=FAR / 2), ref_min.clamp(max=FAR / 2))
    evicted = (got_pos.cpu() != key_pos).sum().item()
    assert (evicted > 0) == (variant == "fpa-evict"), evicted
    assert (got_pos.cpu() == positions[:, None, None]).sum() == B * H  # the newest key is never evicted


def test_the_custom_ops_give_the_functions_results():
    """What a compiled step calls (the torch.library ops) equals the plain functions, the caches' updates included."""
    B, H, S, D, C = 2, 2, 37, 16, 24
    t = [30, 36]
    k_cache, v_cache, key_pos = cache_inputs(B, H, S, D, t=t, append=False, seed=8)
    weight, bias, walk, level, path_min = fpa_state(B, H, S, C, 3, seed=9)
    gen = torch.Generator().manual_seed(10)
    qkv, x = torch.randn(B, 3 * H * D, generator=gen), torch.randn(B, C, generator=gen)
    state = [t_.float().to(DEV) for t_ in (weight, bias)]
    results = []
    for store, attend in ((fused.store_token, fused.step_attention), (fused.store_token_op, fused.step_attention_op)):
        caches = [t_.to(DEV).clone() for t_ in (k_cache.float(), v_cache.float(), key_pos, walk.float(),
                                                 level.float(), path_min.float())]
        with torch.no_grad():
            q, k, slots, phi = store(qkv.to(DEV), torch.tensor(t, device=DEV), None, None, *caches[:3], False,
                                     *state, x.to(DEV), *caches[3:])
            out = attend(q, *caches[:3], torch.tensor(t, device=DEV), 0.25, caches[5], caches[4], phi,
                         torch.zeros(H, device=DEV), -0.5)
        results.append([q, k, slots, phi, out, *caches])
    for a, b in zip(*results):
        assert torch.equal(a, b)


# ------------------------------------------------------------------------------------------------------------------
def test_the_ops_refuse_what_they_cannot_run():
    B, H, S, D = 1, 2, 8, 16
    k = torch.zeros(B, H, S, D, device=DEV)
    key_pos = torch.zeros(B, H, S, dtype=torch.int32, device=DEV)
    positions = torch.zeros(B, dtype=torch.int64, device=DEV)
    q = torch.zeros(B, H, D, device=DEV)
    qkv = torch.zeros(B, 3 * H * D, device=DEV)
    with pytest.raises(ValueError, match="step_attention: key_pos must be int32"):
        fused.step_attention(q, k, k, key_pos.long(), positions, 0.25)
    with pytest.raises(ValueError, match="needs all of path_min, level, phi, beta_raw"):
        fused.step_attention(q, k, k, key_pos, positions, 0.25, path_min=torch.zeros(B, H, S, device=DEV))
    with pytest.raises(ValueError, match="a threshold evicts by FPA's bias"):
        fused.step_attention(q, k, k, key_pos, positions, 0.25, threshold=-1.0)
    with pytest.raises(ValueError, match="head dim D must be one of"):
        fused.step_attention(q[..., :8], k[..., :8], k[..., :8], key_pos, positions, 0.25)
    with pytest.raises(ValueError, match="inference only"):
        fused.step_attention(q.requires_grad_(), k, k, key_pos, positions, 0.25)
    with pytest.raises(ValueError, match="store_token: qkv must be"):
        fused.store_token(qkv.half(), positions, None, None, k, k, key_pos, True)
    with pytest.raises(ValueError, match="cos and sin go together"):
        fused.store_token(qkv, positions, torch.zeros(4, D, device=DEV), None, k, k, key_pos, True)
    with pytest.raises(ValueError, match="needs all of gate_weight"):
        fused.store_token(qkv, positions, None, None, k, k, key_pos, True, gate_weight=torch.zeros(H, 4))
    gate = dict(gate_weight=torch.zeros(H, 4, device=DEV), gate_bias=torch.zeros(H, device=DEV),
                x=torch.zeros(B, 4, device=DEV, dtype=torch.float64), walk=torch.zeros(B, H, device=DEV),
                level=torch.zeros(B, H, S, device=DEV), path_min=torch.zeros(B, H, S, device=DEV))
    with pytest.raises(ValueError, match="store_token: x must be bf16, fp16 or fp32"):
        fused.store_token(qkv, positions, None, None, k, k, key_pos, True, **gate)
    with pytest.raises(ValueError, match="store_token: walk must be"):
        fused.store_token(qkv, positions, None, None, k, k, key_pos, True,
                          **{**gate, "x": gate["x"].float(), "walk": torch.zeros(B, H + 1, device=DEV)})
    with pytest.raises(ValueError, match="add_rms_norm: weight must have shape"):
        fused.add_rms_norm(torch.zeros(2, 8, device=DEV), None, torch.ones(7, device=DEV), 1e-5)
    with pytest.raises(ValueError, match="add_rms_norm: x must be"):
        fused.add_rms_norm(torch.zeros(2, 8, device=DEV, dtype=torch.float64), None, torch.ones(8, device=DEV), 1e-5)
    with pytest.raises(ValueError, match="silu_mul: gate_up must be"):
        fused.silu_mul(torch.zeros(2, 7, device=DEV))


# ------------------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["softmax", "fpa", "fpa-evict"])
@pytest.mark.parametrize("S", [1024, 8192 + 37])
def test_gpu_step_ops_at_the_110m_sizes_in_bf16(variant, S):
    """bf16, 12 heads of 64, C = 768, F = 2048: every op against its float64 definition under the 2x rule."""
    B, H, D, C = 2, 12, 64, 768
    t = [S - 1, S // 2]
    q, k, v, key_pos = attention_inputs(B, H, S, D, t=t, seed=11)
    fpa = variant != "softmax"
    _, _, _, level, path_min = fpa_state(B, H, S, 8, 1, seed=12)
    phi = torch.randn(B, H, generator=torch.Generator().manual_seed(13), dtype=torch.float64).float().double()
    beta_raw = torch.zeros(H, dtype=torch.float64)
    threshold = -2.0 if variant == "fpa-evict" else float("-inf")

    def run(op, dtype, device):
        state = ((path_min, "fp32"), (level, "fp32"), (phi, "fp32"), (beta_raw, "fp32")) if fpa else (None,) * 4
        args = on((q, k, v, key_pos, torch.tensor(t), *state), dtype, device)
        with torch.no_grad():
            return op(*args[:5], 1 / math.sqrt(D), *args[5:], threshold), args[3]

    ref, _ = run(naive.step_attention, torch.float64, "cpu")
    same, same_pos = run(naive.step_attention, torch.bfloat16, "cuda")
    got, got_pos = run(fused.step_attention, torch.bfloat16, "cuda")
    assert_bound(got, same, ref, "step_attention")
    assert torch.equal(got_pos, same_pos)
    gen = torch.Generator().manual_seed(14)
    x, delta = (torch.randn(B, C, generator=gen, dtype=torch.float64) for _ in range(2))
    weight = 1 + 0.3 * torch.randn(C, generator=gen, dtype=torch.float64)
    ref = naive.add_rms_norm(x, delta, weight, 1e-5)
    same = naive.add_rms_norm(*on((x, delta, weight), torch.bfloat16, "cuda"), 1e-5)
    with torch.no_grad():
        got = fused.add_rms_norm(*on((x, delta, weight), torch.bfloat16, "cuda"), 1e-5)
    for name, g, s, r in zip(("sum", "norm"), got, same, ref):
        assert_bound(g, s, r, name)
    gate_up = 3 * torch.randn(B, 2 * 2048, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        got = fused.silu_mul(*on((gate_up,), torch.bfloat16, "cuda"))
    assert_bound(got, naive.silu_mul(*on((gate_up,), torch.bfloat16, "cuda")), naive.silu_mul(gate_up), "silu_mul")
