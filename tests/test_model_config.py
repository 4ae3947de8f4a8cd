"""Config checks fire when a config is built (so when YAML is parsed), before any training."""
import pytest

from fpa_lightning import AttentionConfig, Decoder, ModelConfig


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"backend": "linear"}, "attention.backend"),
        ({"positional": "learned"}, "attention.positional"),
        ({"impl": "cuda"}, "attention.impl"),
        ({"fpa_form": "tree"}, "fpa_form"),
        ({"fpa_reduction": "max"}, "fpa_reduction"),
        ({"fpa_level": "value"}, "fpa_level"),
        ({"fpa_form": "stack", "fpa_level": "query"}, "stack"),
        ({"fpa_reduction": "dipsum", "fpa_level": "query"}, "dipsum"),
        ({"skip_threshold": 1.0}, "negative"),
        ({"backend": "fox", "skip_threshold": -10.0}, "fpa backend only"),
        ({"bias_layers": [-1]}, "non-negative"),
        ({"block_size": 0}, "block_size"),
    ],
)
def test_attention_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AttentionConfig(**kwargs)


def test_model_config_errors():
    with pytest.raises(ValueError, match="must divide"):
        ModelConfig(d_model=100, n_head=12)
    with pytest.raises(ValueError, match="out of range"):
        ModelConfig(n_layer=2, attention=AttentionConfig(bias_layers=[0, 2]))
    with pytest.raises(ValueError, match="even head dim"):
        ModelConfig(d_model=15, n_head=5, attention=AttentionConfig(backend="sdpa"))
    with pytest.raises(ValueError, match="n_layer"):
        ModelConfig(n_layer=0)


def test_positional_defaults_follow_the_paper():
    assert AttentionConfig(backend="fpa").positional == "none"
    assert AttentionConfig(backend="fox").positional == "none"
    assert AttentionConfig(backend="sdpa").positional == "rope"
    assert AttentionConfig(backend="selective").positional == "rope"
    assert AttentionConfig(backend="fpa", positional="rope").positional == "rope"


def test_attention_dict_is_accepted_and_110m_size():
    cfg = ModelConfig(attention={"backend": "sdpa"})
    assert isinstance(cfg.attention, AttentionConfig)
    assert cfg.head_dim == 64
    assert 109e6 < Decoder(cfg).num_parameters() < 111e6


def test_the_registry_is_the_one_list_of_backends():
    from fpa_lightning.attention import BACKENDS

    for name, entry in BACKENDS.items():  # every registered name is a valid config, with its default encoding
        assert AttentionConfig(backend=name).positional == entry.default_positional
    with pytest.raises(ValueError, match=r"attention.backend must be one of \('sdpa', 'nope', 'alibi'"):
        AttentionConfig(backend="linear")


def test_checkpoints_from_before_the_backend_rename_load():
    """Layers held their backend as `gates` until the rename to `backend`; old state dicts load unchanged."""
    import torch

    cfg = ModelConfig(vocab_size=20, n_layer=1, d_model=8, n_head=2, d_mlp=8, attention=AttentionConfig(backend="fpa"))
    torch.manual_seed(0)
    source = Decoder(cfg)
    old = {k.replace(".attn.backend.", ".attn.gates."): v for k, v in source.state_dict().items()}
    assert any(".attn.gates." in k for k in old)
    torch.manual_seed(1)
    target = Decoder(cfg)
    target.load_state_dict(old)
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))
