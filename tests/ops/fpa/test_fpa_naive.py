"""naive_fpa_attention against a brute-force loop over the definition in docs/method.md, in float64: outputs and all gradients."""
import math

import pytest
import torch

from fpa_lightning.ops import fpa_bias, naive_fpa_attention

DT = torch.float64


def brute_force_fpa(q, k, v, phi, psi, beta, dropped=None):
    """One (batch, head, query) at a time, one key at a time: the formula of docs/method.md read literally.

    Range minimum: exact value, soft-minimum gradient (τ = 1) through a straight-through estimator. `dropped`: a
    (B, H, T, T) bool of pairs left out of the softmax (skipping).
    """
    B, T, H, D = q.shape
    out = torch.zeros(B, T, H, D, dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                logits = []
                for s in range(t + 1):
                    if dropped is not None and dropped[b, h, t, s]:
                        logits.append(torch.tensor(-math.inf, dtype=q.dtype))
                        continue
                    bias = torch.zeros((), dtype=q.dtype)
                    if s < t:
                        path = phi[b, s + 1 : t + 1, h]
                        soft = -torch.logsumexp(-path, dim=0)
                        range_min = soft + (path.min() - soft).detach()
                        depth = range_min - psi[b, s, h]
                        if depth < 0:
                            bias = beta[h] * depth
                    logits.append(q[b, t, h] @ k[b, s, h] / math.sqrt(D) + bias)
                weights = torch.stack(logits).softmax(dim=0)
                out[b, t, h] = weights @ v[b, : t + 1, h]
    return out


def random_inputs(T, walk, B=2, H=3, D=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=DT) for _ in range(3))
    phi = walk(B, T, H, g)
    psi = phi + torch.randn(B, T, H, generator=g, dtype=DT) * 2
    beta = torch.rand(H, generator=g, dtype=DT) + 0.1
    return [x.requires_grad_() for x in (q, k, v, phi, psi, beta)]


WALKS = {
    "random": lambda B, T, H, g: (torch.randn(B, T, H, generator=g, dtype=DT) * 2).cumsum(1),
    "drift+1000": lambda B, T, H, g: torch.linspace(0, 1000, T, dtype=DT)[None, :, None]
    + torch.randn(B, T, H, generator=g, dtype=DT),
    "drift-1000": lambda B, T, H, g: torch.linspace(0, -1000, T, dtype=DT)[None, :, None]
    + torch.randn(B, T, H, generator=g, dtype=DT),
    "oscillating": lambda B, T, H, g: 300 * torch.sin(torch.arange(T, dtype=DT) * 2.1)[None, :, None]
    + torch.randn(B, T, H, generator=g, dtype=DT),
}


@pytest.mark.parametrize("walk", sorted(WALKS))
@pytest.mark.parametrize("T", [1, 2, 11])
def test_naive_matches_brute_force(walk, T):
    inputs = random_inputs(T, WALKS[walk], seed=T)
    ours = naive_fpa_attention(*inputs)
    reference = brute_force_fpa(*inputs)
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    grad_out = torch.randn_like(ours)
    ours_grads = torch.autograd.grad(ours, inputs, grad_out, allow_unused=True)
    ref_grads = torch.autograd.grad(reference, inputs, grad_out, allow_unused=True)
    for name, a, b in zip("q k v phi psi beta".split(), ours_grads, ref_grads):
        a = torch.zeros_like(inputs[0]) if a is None else a
        b = torch.zeros_like(a) if b is None else b
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"gradient of {name}")


def test_key_at_its_level_is_alive_and_gets_no_gradient():
    """A flat walk with φ = ψ: every range minimum equals the level, so every key stays alive."""
    q, k, v, _, _, beta = random_inputs(9, WALKS["random"])
    phi = torch.full((2, 9, 3), 3.0, dtype=DT, requires_grad=True)
    psi = torch.full((2, 9, 3), 3.0, dtype=DT, requires_grad=True)
    out = naive_fpa_attention(q, k, v, phi, psi, beta)
    assert (fpa_bias(phi, psi, beta).tril() == 0).all()
    d_phi, d_psi, d_beta = torch.autograd.grad(out.sum(), [phi, psi, beta])
    assert (d_phi == 0).all() and (d_psi == 0).all() and (d_beta == 0).all()


def test_bias_is_depth_not_duration():
    """docs/method.md: a dead key's bias is set by the deepest dip, whatever its length."""
    T = 8
    short_dip = torch.zeros(1, T, 1, dtype=DT)
    short_dip[0, 3] = -2.0  # one step at depth 2
    long_dip = torch.zeros(1, T, 1, dtype=DT)
    long_dip[0, 2:6] = -2.0  # four steps at depth 2
    level = torch.zeros(1, T, 1, dtype=DT)
    beta = torch.ones(1, dtype=DT)
    short_bias = fpa_bias(short_dip, level, beta)[0, 0, 7, 0]
    long_bias = fpa_bias(long_dip, level, beta)[0, 0, 7, 0]
    assert short_bias == long_bias == -2.0
    # the dip-sum ablation confuses the two
    assert fpa_bias(short_dip, level, beta, reduction="dipsum")[0, 0, 7, 0] == -2.0
    assert fpa_bias(long_dip, level, beta, reduction="dipsum")[0, 0, 7, 0] == -8.0


def test_stack_form_erases_newer_keys_and_keeps_older_ones():
    """g = h = 0: a dip to between two keys' levels kills the newer key and keeps the older one alive."""
    walk = torch.tensor([0.0, 5.0, 2.0, 3.0], dtype=DT)[None, :, None]  # key 0 at 0, key 1 at 5, dip to 2
    bias = fpa_bias(walk, walk, torch.ones(1, dtype=DT))[0, 0]
    assert bias[3, 0] == 0  # older key alive: the field never went below 0
    assert bias[3, 1] == -3.0  # newer key dead: deepest dip 2 − 5


def test_bad_variant_raises():
    x = torch.zeros(1, 3, 1)
    with pytest.raises(ValueError, match="reduction"):
        fpa_bias(x, x, torch.ones(1), reduction="max")
    with pytest.raises(ValueError, match="level"):
        fpa_bias(x, x, torch.ones(1), level="value")
    with pytest.raises(ValueError, match="dipsum"):
        fpa_bias(x, x, torch.ones(1), reduction="dipsum", level="query")


def test_skipping_drops_the_tiles_whose_largest_bias_is_below_the_threshold():
    # tiles of 4 over T = 11 (a partial last block); a random walk whose off-diagonal tiles fall below -1 in 7 of
    # 18 (batch, head, tile) cases
    inputs = random_inputs(11, WALKS["random"], seed=7)
    q, k, v, phi, psi, beta = inputs
    bias = fpa_bias(phi, psi, beta).detach()  # (B, H, T, T)
    dropped = torch.zeros_like(bias, dtype=torch.bool)
    for i0 in range(0, 11, 4):
        for j0 in range(0, i0, 4):  # off-diagonal tiles only
            tile = bias[:, :, i0:i0 + 4, j0:j0 + 4]
            dropped[:, :, i0:i0 + 4, j0:j0 + 4] = (tile.amax(dim=(2, 3)) < -1.0)[:, :, None, None]
    off_diagonal = torch.zeros(11, 11, dtype=torch.bool)
    for i0 in range(4, 11, 4):
        off_diagonal[i0:i0 + 4, :i0] = True
    assert dropped.any() and (off_diagonal & ~dropped).any(), "no mix of kept and dropped off-diagonal tiles"
    ours = naive_fpa_attention(*inputs, skip_threshold=-1.0, skip_tile=4)
    reference = brute_force_fpa(*inputs, dropped=dropped)
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    grad_out = torch.randn_like(ours)
    for name, a, b in zip("q k v phi psi beta".split(), torch.autograd.grad(ours, inputs, grad_out),
                          torch.autograd.grad(reference, inputs, grad_out)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=f"gradient of {name}")


@pytest.mark.parametrize("threshold", [0.0, 1.0, float("nan"), float("-inf")])
def test_skip_threshold_must_be_finite_and_negative(threshold):
    with pytest.raises(ValueError, match="skip_threshold"):
        naive_fpa_attention(*random_inputs(5, WALKS["random"]), skip_threshold=threshold)
