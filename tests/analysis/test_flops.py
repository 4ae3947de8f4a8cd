"""FLOPs per training token (fpa_lightning/analysis/flops.py) against a count by hand of a small model for every
backend, the MFU they give at the H200's peak for plausible measured speeds, and the device table's matching (an
unknown device has no peak, never a guessed one)."""
import pytest

from fpa_lightning import AttentionConfig, ModelConfig
from fpa_lightning.analysis.flops import (
    PEAK_BF16_TFLOPS,
    mfu,
    pairs_per_query,
    peak_tflops,
    training_flop_terms,
    training_flops_per_token,
)

# The small model: V = 10, L = 2, C = 8, H = 2 heads of D = 4, F = 12, DCP's r = 4, rows of T = 4 tokens.
SMALL = dict(vocab_size=10, n_layer=2, d_model=8, n_head=2, d_mlp=12, max_seq_len=4)
T = 4


def small(backend: str, **attention) -> ModelConfig:
    return ModelConfig(**SMALL, attention=AttentionConfig(backend=backend, **{"dcp_dim": 4, **attention}))


def causal_pairs(T: int) -> int:
    """(query, key) pairs with key ≤ query, counted one by one."""
    return sum(1 for t in range(T) for s in range(T) if s <= t)


# By hand, per token, training = 3 × forward for every matmul (a matmul m×k·k×n is 2mkn):
#   blocks: per layer qkv 2·8·24 = 384, out 2·8·8 = 128, gate/up 2·8·24 = 384, down 2·12·8 = 192 -> 1088;
#           2 layers -> 2176; × 3 = 6528
#   lm_head: 2·8·10 = 160; × 3 = 480
#   attention: 10 causal pairs per head in a row of 4 -> 2.5 per token; q·k 2·4 + p·v 2·4 = 16 per pair and head;
#           2 heads × 2.5 × 16 = 80 per layer; 2 layers -> 160; × 3 = 480
SOFTMAX = 6528 + 480 + 480  # 7488
HAND = {
    "sdpa": SOFTMAX,
    "nope": SOFTMAX,
    # gate map 3H = 6 outputs: 2·8·6 = 96 per layer, × 2 layers × 3 = 576; bias ops per pair and head 6 forward + 19
    # backward = 25: 2.5 pairs × 2 heads × 2 layers × 25 = 250
    "fpa": SOFTMAX + 576 + 250,
    # forget gate H = 2 outputs: 2·8·2 = 32, × 2 × 3 = 192; bias ops 2 + 2 per pair and head: 2.5 × 2 × 2 × 4 = 40
    "fox": SOFTMAX + 192 + 40,
    # q0·k0 of one head, 2·4 = 8 per pair: 2.5 × 2 layers × 8 × 3 = 120; a layer-shared bias, 3 + 3 ops per pair and
    # 2H = 4 to add it to both heads and sum their gradients: 2.5 × 2 layers × 10 = 50
    "selective": SOFTMAX + 120 + 50,
    # interaction 2r = 8 outputs: 2·8·8 = 128, × 2 × 3 = 768; qi·ki 2·4 = 8 per pair: 2.5 × 2 × 8 × 3 = 120;
    # 9 + 9 + 2H = 22 ops per pair: 2.5 × 2 × 22 = 110
    "dcp": SOFTMAX + 768 + 120 + 110,
    # ALiBi: 2 forward ops per pair and head (no gradient): 2.5 × 2 heads × 2 layers × 2 = 20
    "alibi": SOFTMAX + 20,
}


def test_pairs_are_the_causal_half_of_the_square_with_its_diagonal():
    for n in (1, 4, 7, 2048):
        assert pairs_per_query(n) * n == causal_pairs(n) == n * (n + 1) // 2
    with pytest.raises(ValueError):
        pairs_per_query(0)


@pytest.mark.parametrize("backend", sorted(HAND))
def test_small_model_by_hand(backend):
    assert training_flops_per_token(small(backend), T) == HAND[backend]


def test_terms_follow_the_config():
    # FPA's gate map: 2H outputs at level none, H in the stack form (gate maps 2·8·4·2·3 = 384, 2·8·2·2·3 = 192)
    assert training_flop_terms(small("fpa", fpa_level="none"), T)["gate_maps"] == 384
    assert training_flop_terms(small("fpa", fpa_form="stack"), T)["gate_maps"] == 192
    # bias_layers [1]: the backend's own work in one layer of two, the shared parts unchanged
    one = training_flop_terms(small("fox", bias_layers=[1]), T)
    assert (one["gate_maps"], one["bias_ops"], sum(one.values())) == (96, 20, SOFTMAX + 96 + 20)
    # ALiBi as the positional encoding of FPA adds its own 20 to FPA's
    assert training_flops_per_token(small("fpa", positional="alibi"), T) == HAND["fpa"] + 20
    # DCP's interaction width r
    assert training_flop_terms(small("dcp", dcp_dim=8), T)["pair_products"] == 2.5 * 2 * 16 * 3


def test_110m_is_six_n_plus_attention():
    """At the 110M shape the count is the usual 6·N (N: the matmul weights, the tied output layer included) plus
    attention's 6·L·C·(T + 1) (12·L·C·T/2 in the usual "half the square" form), and each backend's own work on top."""
    sdpa = ModelConfig(attention=AttentionConfig(backend="sdpa"))
    n_matmul = 12 * (4 * 768 * 768 + 3 * 768 * 2048) + 768 * 32000
    assert training_flops_per_token(sdpa, 2048) == 6 * n_matmul + 6 * 12 * 768 * 2049
    for backend in ("fpa", "fox", "selective", "dcp"):
        extra = training_flops_per_token(ModelConfig(attention=AttentionConfig(backend=backend)), 2048) - \
            training_flops_per_token(sdpa, 2048)
        assert 0 < extra < 0.01 * training_flops_per_token(sdpa, 2048)  # a bias costs under 1 % of the model


# Plausible measured speeds on one H200 (BENCHMARKS.md, "Whole-model training throughput": 222k FPA, 219k FoX,
# 241k softmax at 16 × 2048; Selective 168k, DCP 111k), raised by half for headroom.
MEASURED_110M = {"fpa": 222_062, "fox": 218_826, "sdpa": 240_791, "selective": 167_784, "dcp": 111_210}


@pytest.mark.parametrize("backend", sorted(MEASURED_110M))
def test_mfu_at_the_h200_peak_is_a_fraction(backend):
    flops = training_flops_per_token(ModelConfig(attention=AttentionConfig(backend=backend)), 2048)
    value = mfu(1.5 * MEASURED_110M[backend], flops, PEAK_BF16_TFLOPS["H200"])
    assert 0.05 < value < 0.5
    # the speed at which MFU would reach 1 is far above anything measured: 1.27M tokens/s
    assert 1.2e6 < PEAK_BF16_TFLOPS["H200"] * 1e12 / flops < 1.3e6
    # all devices' tokens over all devices' peak
    assert mfu(2 * MEASURED_110M[backend], flops, PEAK_BF16_TFLOPS["H200"], n_devices=2) == pytest.approx(
        mfu(MEASURED_110M[backend], flops, PEAK_BF16_TFLOPS["H200"]))


def test_mfu_refuses_a_missing_peak():
    with pytest.raises(ValueError):
        mfu(1000.0, 1e9, 0.0)
    with pytest.raises(ValueError):
        mfu(1000.0, 1e9, 989.5, n_devices=0)


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.5), ("NVIDIA H100 PCIe", 756.5), ("NVIDIA H200", 989.5),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100-SXM4-40GB", 312.0), ("NVIDIA A100 80GB PCIe", 312.0),
    ("NVIDIA L40S", 362.05), ("NVIDIA GeForce RTX 4090", 165.2), ("NVIDIA GeForce RTX 3090", 71.0),
])
def test_device_table(name, peak):
    assert peak_tflops(name) == peak


@pytest.mark.parametrize("name", [
    "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA L40", "NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 3090 Ti",
    "NVIDIA A10", "Tesla V100-SXM2-16GB", "AMD Instinct MI300X", "cpu", "",
])
def test_an_unknown_device_has_no_peak(name):
    assert peak_tflops(name) is None
