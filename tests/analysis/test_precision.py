"""The statistics are float32 under mixed precision: the analysis functions switch autocast off around their work."""
import torch

from fpa_lightning.analysis.positions import loss_by_position, uniform_edges
from fpa_lightning.analysis.survival import measure_heads
from fpa_lightning.attention import AttentionConfig
from fpa_lightning.config import ModelConfig
from fpa_lightning.model import Decoder


def test_bf16_autocast_does_not_change_the_statistics():
    torch.manual_seed(0)
    # selective: its bias is a q·k matmul, which bf16 autocast would otherwise round
    cfg = ModelConfig(vocab_size=50, n_layer=1, d_model=16, n_head=2, d_mlp=32, max_seq_len=32,
                      attention=AttentionConfig(backend="selective"))
    model = Decoder(cfg)
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.normal_(0.0, 1.0)
    ids = torch.randint(0, 50, (2, 32))
    segments = (torch.arange(32) >= 20).long().expand(2, -1)
    docs = [torch.randint(0, 50, (80,))]
    plain = measure_heads(model, ids, segments, query_start=16, block_size=8)
    plain_loss = loss_by_position(model, docs, uniform_edges(64, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = measure_heads(model, ids, segments, query_start=16, block_size=8)
        mixed_loss = loss_by_position(model, docs, uniform_edges(64, 16))
        assert model(ids[:, :8]).dtype == torch.bfloat16  # autocast is really on here
    assert torch.equal(plain.layers[0].alive_fraction, mixed.layers[0].alive_fraction)
    assert torch.equal(plain.layers[0].nonsuffix_fraction, mixed.layers[0].nonsuffix_fraction)
    assert torch.equal(plain_loss[0], mixed_loss[0]) and plain_loss[1].tolist() == [16.0] * 4
