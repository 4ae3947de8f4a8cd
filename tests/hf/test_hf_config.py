"""FPAConfig: exactly ModelConfig's fields, the hub's names as aliases, and ModelConfig's checks."""
import dataclasses

import pytest

import transformers  # noqa: E402,F401  declared in the dev extra: a broken install fails here rather than skips
from fpa_lightning import AttentionConfig, ModelConfig  # noqa: E402
from fpa_lightning.hf import FPAConfig  # noqa: E402


def test_fields_and_defaults_are_model_configs():
    config = FPAConfig()
    for field in dataclasses.fields(ModelConfig):
        if field.name != "attention":
            assert getattr(config, field.name) == field.default, field.name
    assert config.attention == dataclasses.asdict(AttentionConfig())
    assert config.to_model_config() == ModelConfig()


def test_round_trip_through_json_and_hub_names(tmp_path):
    cfg = ModelConfig(vocab_size=100, n_layer=3, d_model=48, n_head=3, d_mlp=96, max_seq_len=128, tie_embeddings=False,
                      attention={"backend": "dcp", "dcp_dim": 8, "bias_layers": [0, 2]})
    config = FPAConfig.from_model_config(cfg, bos_token_id=1, eos_token_id=2)
    config.save_pretrained(tmp_path)
    loaded = FPAConfig.from_pretrained(tmp_path)
    assert loaded.to_model_config() == cfg
    hub = (loaded.hidden_size, loaded.num_hidden_layers, loaded.num_attention_heads, loaded.intermediate_size,
           loaded.max_position_embeddings, loaded.tie_word_embeddings, loaded.bos_token_id, loaded.eos_token_id)
    assert hub == (48, 3, 3, 96, 128, False, 1, 2)
    assert FPAConfig(hidden_size=64, n_head=4).to_model_config().d_model == 64


def test_checks_are_model_configs_and_a_partial_attention_is_refused():
    with pytest.raises(ValueError, match="must divide model.d_model=33"):
        FPAConfig(d_model=33, n_head=2)
    with pytest.raises(ValueError, match="attention.backend must be one of"):
        FPAConfig(attention={"backend": "mamba"})
    config = FPAConfig(attention={"backend": "fox"})
    assert config.attention["positional"] == "none"  # the backend's default, resolved and stored
    config.attention = {"impl": "naive"}  # what from_pretrained(path, attention={...}) would do
    with pytest.raises(ValueError, match="FPAConfig.attention lacks"):
        config.to_model_config()
