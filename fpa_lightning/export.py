"""Hugging Face-style export of a trained Decoder: ``model.safetensors``, ``config.json``, ``README.md`` (model card)
and ``tokenizer.json`` in one folder, and the loader that rebuilds the identical Decoder from it.

The architecture is this project's, so ``transformers`` cannot instantiate it; ``config.json`` carries the standard
keys that hub tools read (sizes, vocabulary, special ids) and, under ``fpa_lightning``, the complete ``ModelConfig``
that ``load_hf`` rebuilds the model from. Weights are stored as saved (float32); tied embeddings are stored once,
under ``embed.weight``. Reloading gives bit-identical logits on the same device and attention implementation.
"""
from __future__ import annotations

import dataclasses
import json
import os

import torch

from fpa_lightning.config import ModelConfig
from fpa_lightning.model import Decoder

WEIGHTS, CONFIG, CARD, TOKENIZER = "model.safetensors", "config.json", "README.md", "tokenizer.json"
MODEL_TYPE = "fpa_lightning"


def hf_config(cfg: ModelConfig, bos_id: int | None, eos_id: int | None) -> dict:
    """The config.json of an export: the usual hub keys plus the ModelConfig that rebuilds the model."""
    return {
        "model_type": MODEL_TYPE,
        "architectures": ["Decoder"],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "intermediate_size": cfg.d_mlp,
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
        MODEL_TYPE: dataclasses.asdict(cfg),
    }


def save_hf(decoder: Decoder, out_dir: str, card: str, tokenizer=None, bos_id: int | None = None,
            eos_id: int | None = None, cfg: ModelConfig | None = None) -> dict[str, str]:
    """Write the export into ``out_dir`` (created); returns {file kind: path}. ``tokenizer`` is a
    ``tokenizers.Tokenizer`` (saved as tokenizer.json) or None; ``cfg`` replaces the decoder's config in
    config.json (the same model, e.g. with the implementation it was trained with)."""
    from safetensors.torch import save_file  # imported on use: only exports need it

    os.makedirs(out_dir, exist_ok=True)
    state = decoder.state_dict()
    if decoder.cfg.tie_embeddings:
        state.pop("lm_head.weight")  # the same tensor as embed.weight; safetensors stores no aliases
    paths = {"weights": os.path.join(out_dir, WEIGHTS), "config": os.path.join(out_dir, CONFIG),
             "card": os.path.join(out_dir, CARD)}
    save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, paths["weights"],
              metadata={"format": "pt"})
    with open(paths["config"], "w", encoding="utf-8") as f:
        json.dump(hf_config(cfg or decoder.cfg, bos_id, eos_id), f, indent=2)
    with open(paths["card"], "w", encoding="utf-8") as f:
        f.write(card)
    if tokenizer is not None:
        paths["tokenizer"] = os.path.join(out_dir, TOKENIZER)
        tokenizer.save(paths["tokenizer"])
    return paths


def load_hf(path: str, device: torch.device | str = "cpu", impl: str | None = None) -> Decoder:
    """The Decoder of an export folder, in eval mode on ``device``; ``impl`` overrides the attention implementation
    stored in the config (e.g. ``chunked`` on a CPU for a model trained with ``fused``)."""
    from safetensors.torch import load_file

    with open(os.path.join(path, CONFIG), encoding="utf-8") as f:
        config = json.load(f)
    if config.get("model_type") != MODEL_TYPE or MODEL_TYPE not in config:
        raise ValueError(f"{path} is not an fpa-lightning export (config.json model_type {config.get('model_type')!r})")
    fields = dict(config[MODEL_TYPE])
    if impl is not None:
        fields["attention"] = {**fields["attention"], "impl": impl}
    decoder = Decoder(ModelConfig(**fields))
    missing, unexpected = decoder.load_state_dict(load_file(os.path.join(path, WEIGHTS)), strict=False)
    tied = ["lm_head.weight"] if decoder.cfg.tie_embeddings else []
    if missing != tied or unexpected:
        raise ValueError(f"{path}: weights do not match config.json: missing {missing}, unexpected {unexpected}")
    return decoder.to(device).eval()


def model_card(decoder: Decoder, source: str, step: int | None, training: dict, impls: list[str] | None,
               tokenizer: str) -> str:
    """README.md of an export: what the model is, how it was trained (the checkpoint's hyper-parameters) and
    which attention implementation ran, and how to load it."""
    cfg = decoder.cfg
    attention = cfg.attention
    ran = ", ".join(sorted(set(impls))) if impls else "not recorded in the checkpoint"
    sections = [
        "---\nlibrary_name: fpa-lightning\ntags:\n- causal-lm\n- " + attention.backend + "\n---\n",
        f"# {attention.backend} decoder, {decoder.num_parameters() / 1e6:.1f}M parameters\n",
        f"Exported by `eval.py --export hf` from `{source}` (global step {step}).\n",
        "## Architecture\n",
        f"Decoder-only transformer: {cfg.n_layer} layers, d_model {cfg.d_model}, {cfg.n_head} heads, SwiGLU MLP of "
        f"{cfg.d_mlp}, RMSNorm, vocabulary {cfg.vocab_size}, training context {cfg.max_seq_len}, "
        f"tied embeddings: {cfg.tie_embeddings}.\n",
        "## Attention implementation\n",
        f"- backend: `{attention.backend}`, positional encoding: `{attention.positional}`\n"
        f"- requested at training: `impl: {attention.impl}`; ran at training (per layer): {ran}\n"
        "- every implementation computes the same function (naive reference, chunked PyTorch, fused GPU kernel); "
        "`load_hf(path, impl=...)` chooses one at load time\n",
        "## Tokenizer\n",
        f"{tokenizer} (`tokenizer.json` in this folder).\n",
        "## Training configuration\n",
        "The checkpoint's hyper-parameters (model, optimiser, data module):\n\n```json\n"
        + json.dumps(training, indent=1, default=str) + "\n```\n",
        "## Loading\n",
        "```python\nfrom fpa_lightning.export import load_hf\n\ndecoder = load_hf(\"PATH\", device=\"cuda\")  "
        "# logits = decoder(input_ids)\n```\n",
    ]
    return "\n".join(sections)
