"""Reading the folders of ``eval.py export`` and of transformers' ``save_pretrained`` (``fpa_lightning.hf``)
without transformers, and the model card of an export.

A folder holds ``config.json`` (``fpa_lightning.hf.FPAConfig``: the ``ModelConfig`` fields at the top level;
exports written before the transformers classes kept them under ``fpa_lightning``) and ``model.safetensors`` (the
Decoder's weights under ``model.``, or unprefixed in the older exports; tied embeddings stored once). ``load_hf``
rebuilds the identical Decoder: bit-identical logits on the same device and attention implementation.
``init_from_export`` loads such a folder's weights into a Decoder built from a training config, for further
training (``LanguageModel(init_from=...)``, ``train.py fit --model.init_from=DIR``).

An export by ``eval.py export`` also holds ``checkpoint.json`` (``PROVENANCE``: the checkpoint it was written from,
its global step and hyper-parameters), so that ``fpa_lightning.evaluation.checkpoint.load_decoder`` reports an export
folder as it reports that checkpoint, and a model card that ends with ``CARD_MARKER``, by which a later
``--overwrite`` knows that README.md as its own.
"""
from __future__ import annotations

import dataclasses
import json
import os

import torch

from fpa_lightning.config import ModelConfig
from fpa_lightning.model import Decoder

WEIGHTS, CONFIG, PROVENANCE = "model.safetensors", "config.json", "checkpoint.json"
CARD_MARKER = "<!-- model card written by fpa-lightning's eval.py export: --overwrite may replace it -->"
LEGACY_CARD = "Exported by `eval.py export` from"  # the cards written before CARD_MARKER open with this line
MODEL_TYPE = "fpa_lightning"  # config.json's model_type (``fpa_lightning.hf.FPAConfig``)
# the Decoder's weights in a state dict: FPAForCausalLM and modules.LanguageModel hold it as .model
PREFIX = "model."
# fields that choose how the same function is computed or trained, not which function: they may differ between an
# export and the config that continues training it
RUNTIME_FIELDS = {"max_seq_len", "init_std"}
RUNTIME_ATTENTION_FIELDS = {"impl", "block_size", "skip_threshold", "document_mask"}


def export_config(path: str, impl: str | None = None) -> ModelConfig:
    """The ``ModelConfig`` of an export folder; ``impl`` overrides the attention implementation it stores."""
    with open(os.path.join(path, CONFIG), encoding="utf-8") as f:
        config = json.load(f)
    if config.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{path} is not an fpa-lightning export (config.json model_type {config.get('model_type')!r})")
    stored = config.get(MODEL_TYPE, config)  # the older exports nest the fields
    fields = {f.name: stored[f.name] for f in dataclasses.fields(ModelConfig) if f.name in stored}
    if impl is not None:
        fields["attention"] = {**fields["attention"], "impl": impl}
    return ModelConfig(**fields)


def is_export_folder(path: str) -> bool:
    """Whether ``path`` is a folder holding an export's (or ``save_pretrained``'s) config.json."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, CONFIG))


def export_provenance(path: str) -> dict:
    """checkpoint.json of an export folder: {"path", "global_step", "hyper_parameters",
    "datamodule_hyper_parameters", "attention_impls"} of the checkpoint it was written from; {} where the folder has
    none (an export older than the file, or a save_pretrained folder)."""
    record = os.path.join(path, PROVENANCE)
    if not os.path.isfile(record):
        return {}
    with open(record, encoding="utf-8") as f:
        return json.load(f)


def is_export_card(text: str) -> bool:
    """Whether a README.md is a model card an export wrote (so ``--overwrite`` may replace it)."""
    return CARD_MARKER in text or LEGACY_CARD in text


def export_weights(path: str) -> dict[str, torch.Tensor]:
    """The Decoder's state dict stored in an export folder (float32 as saved, on the CPU)."""
    from safetensors.torch import load_file  # imported on use: only exports need it

    weights_path = os.path.join(path, WEIGHTS)
    if not os.path.isfile(weights_path):
        raise FileNotFoundError(f"{path} has no {WEIGHTS} (a sharded save_pretrained folder: save it with "
                                "max_shard_size larger than the model)")
    state = load_file(weights_path)
    return {k[len(PREFIX):] if k.startswith(PREFIX) else k: v for k, v in state.items()}


def load_weights(decoder: Decoder, state: dict[str, torch.Tensor], path: str) -> None:
    """Copy an export's state dict into ``decoder``; every weight must match (the tied output layer is stored once)."""
    missing, unexpected = decoder.load_state_dict(state, strict=False)
    tied = ["lm_head.weight"] if decoder.cfg.tie_embeddings else []
    if missing != tied or unexpected:
        raise ValueError(f"{path}: weights do not match config.json: missing {missing}, unexpected {unexpected}")


def load_hf(path: str, device: torch.device | str = "cpu", impl: str | None = None) -> Decoder:
    """The Decoder of an export folder, in eval mode on ``device``; ``impl`` overrides the attention implementation
    stored in the config (e.g. ``chunked`` on a CPU for a model trained with ``fused``)."""
    decoder = Decoder(export_config(path, impl))
    load_weights(decoder, export_weights(path), path)
    return decoder.to(device).eval()


def architecture_differences(a: ModelConfig, b: ModelConfig) -> list[str]:
    """The fields, other than runtime choices, in which two configs describe different functions."""
    left, right = dataclasses.asdict(a), dataclasses.asdict(b)
    out = [f"{k}: {left[k]!r} vs {right[k]!r}" for k in left
           if k not in RUNTIME_FIELDS | {"attention"} and left[k] != right[k]]
    return out + [f"attention.{k}: {left['attention'][k]!r} vs {right['attention'][k]!r}" for k in left["attention"]
                  if k not in RUNTIME_ATTENTION_FIELDS and left["attention"][k] != right["attention"][k]]


def init_from_export(decoder: Decoder, path: str) -> None:
    """Load the weights of an export (or ``save_pretrained``) folder into ``decoder``, in place. The folder's model
    must be the one ``decoder.cfg`` describes, up to runtime choices (implementation, block size, context length)."""
    differences = architecture_differences(decoder.cfg, export_config(path))
    if differences:
        raise ValueError(f"init_from={path}: the model config differs from the folder's: {'; '.join(differences)}")
    load_weights(decoder, export_weights(path), path)


def model_card(decoder: Decoder, source: str, step: int | None, training: dict, impls: list[str] | None,
               tokenizer: str) -> str:
    """README.md of an export: what the model is, how it was trained (the checkpoint's hyper-parameters) and
    which attention implementation ran, and how to load it."""
    cfg = decoder.cfg
    attention = cfg.attention
    ran = ", ".join(sorted(set(impls))) if impls else "not recorded in the checkpoint"
    evict = ", prune_threshold=-10" if decoder.has_bias() else ""  # eviction needs a bias
    sections = [
        "---\nlibrary_name: transformers\ntags:\n- causal-lm\n- custom_code\n- " + attention.backend + "\n---\n",
        f"# {attention.backend} decoder, {decoder.num_parameters() / 1e6:.1f}M parameters\n",
        f"Exported by `eval.py export` from `{source}` (global step {step}).\n",
        "## Architecture\n",
        f"Decoder-only transformer: {cfg.n_layer} layers, d_model {cfg.d_model}, {cfg.n_head} heads, SwiGLU MLP of "
        f"{cfg.d_mlp}, RMSNorm, vocabulary {cfg.vocab_size}, training context {cfg.max_seq_len}, "
        f"tied embeddings: {cfg.tie_embeddings}.\n",
        "## Attention implementation\n",
        f"- backend: `{attention.backend}`, positional encoding: `{attention.positional}`\n"
        f"- requested at training: `impl: {attention.impl}`; ran at training (per layer): {ran}\n"
        "- every implementation computes the same function (naive reference, chunked PyTorch, fused GPU kernel); "
        "`load_hf(path, impl=...)` chooses one at load time, and so does `config.attention[\"impl\"]` in "
        "transformers\n",
        "## Tokenizer\n",
        f"{tokenizer} (`tokenizer.json` in this folder; `AutoTokenizer` puts BOS first, as every training document "
        "began).\n",
        "## Training configuration\n",
        "The checkpoint's hyper-parameters (model, optimiser, data module):\n\n```json\n"
        + json.dumps(training, indent=1, default=str) + "\n```\n",
        "## Loading\n",
        "With transformers alone (the model's code is in this folder; it needs torch and transformers, and triton "
        "only for the fused GPU kernels):\n\n"
        "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        "model = AutoModelForCausalLM.from_pretrained(\"PATH\", trust_remote_code=True)\n"
        "tokenizer = AutoTokenizer.from_pretrained(\"PATH\", trust_remote_code=True)\n"
        "ids = model.generate(**tokenizer(\"The LORD is\", return_tensors=\"pt\"), max_new_tokens=20"
        f"{evict})\n```\n\n"
        "With fpa-lightning installed: `import fpa_lightning.hf` registers the same classes (no remote code), and "
        "`fpa_lightning.export.load_hf(\"PATH\")` gives the bare Decoder.\n",
    ]
    return "\n".join(sections)
