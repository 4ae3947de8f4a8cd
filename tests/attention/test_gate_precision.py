"""FPA's gate gradients under bf16 autocast (CPU; the GPU version is in tests/gpu/test_fast_path_whole_model.py).

The gate maps, the walk W = cumsum δ and the bias are computed in float32 outside autocast; only q·k, p·v and the
projections run in bf16. At the ALiBi-like init every FPA gate gradient (δ, g and h biases, the gate matrix, β)
then agrees with float32 as closely as the q/k/v gradients do. The one structure to know when reading them: at init
every key is dead (φ = ψ = W strictly decreasing), the range minimum's soft weights sum to 1 over each range, so the
g-bias and h-bias gradients are equal and opposite (g and h shift φ − ψ in opposite directions): their sum carries
no signal, and a comparison of it is a comparison of cancellation noise.
"""
import torch

from fpa_lightning import Decoder, ModelConfig

H = 4


def gradients(model: Decoder, ids: torch.Tensor, bf16: bool) -> dict[str, torch.Tensor]:
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        model.token_losses(ids[:, :-1], ids[:, 1:]).mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_gate_gradients_at_init_agree_with_float32_well_within_batch_noise(one_thread_per_module):
    """bf16's gate-gradient error is small next to the difference between two batches' float32 gradients (the noise
    SGD already has): harmless. Per head it can look large where a head's gradient is itself tiny (the slowest-decay
    heads: entries ~100x smaller than the others), which is where a per-element relative error misleads."""
    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=512, n_layer=3, d_model=64 * H, n_head=H, d_mlp=512, max_seq_len=256,
                                attention={"backend": "fpa", "impl": "chunked", "block_size": 64}))
    batches = torch.randint(0, 512, (2, 2, 257), generator=torch.Generator().manual_seed(1))
    fp32, bf16 = gradients(model, batches[0], bf16=False), gradients(model, batches[0], bf16=True)
    other_batch = gradients(model, batches[1], bf16=False)
    qkv_error = max(relative(bf16[n], fp32[n]) for n in fp32 if n.endswith("attn.qkv.weight"))
    assert qkv_error < 0.02
    for layer in range(3):
        prefix = f"blocks.{layer}.attn.backend."
        bias = fp32[prefix + "gate.bias"]
        torch.testing.assert_close(bias[H:2 * H], -bias[2 * H:], rtol=1e-4, atol=1e-7)  # g = −h at init
        parts = {"beta": (prefix + "beta_raw", slice(None)), "gate matrix": (prefix + "gate.weight", slice(None)),
                 **{f"{p} bias": (prefix + "gate.bias", slice(i * H, (i + 1) * H)) for i, p in enumerate("δgh")}}
        for part, (name, rows) in parts.items():
            error = (bf16[name][rows] - fp32[name][rows]).norm()
            assert error <= 0.05 * fp32[name][rows].norm(), (layer, part)
            assert error <= 0.1 * (other_batch[name][rows] - fp32[name][rows]).norm(), (layer, part)
