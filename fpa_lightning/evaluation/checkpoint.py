"""Loading a trained Decoder from a Lightning checkpoint, or from an export folder, for evaluation.

The project's LightningModule (``modules.language_model.LanguageModel``) stores its hyper-parameters as
plain dicts (``model`` = ``asdict(ModelConfig)``) and the Decoder as its ``model`` attribute, so the
checkpoint's ``state_dict`` holds the Decoder's weights under the prefix ``model.``. We rebuild the Decoder
from those two entries directly: evaluation needs no optimiser, no training hooks and no module class,
and works the same for any LightningModule that follows the contract.

A folder written by ``eval.py export`` (``fpa_lightning.export``) is accepted wherever a checkpoint is: the same
Decoder (identical logits), and from its ``checkpoint.json`` the source checkpoint's step, hyper-parameters and
training tokenizer; an older export, or a ``save_pretrained`` folder, has only its config.json (step unknown, the
folder's own tokenizer.json).
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field

import torch

from fpa_lightning.config import ModelConfig
from fpa_lightning.export import (CONFIG, PREFIX, export_config, export_provenance, export_weights,
                                  is_export_folder, load_weights)
from fpa_lightning.model import Decoder


class CheckpointError(ValueError):
    """The checkpoint is missing, unreadable, or not a Decoder checkpoint of this project. The message is one line
    that names the file and what to do."""


FROM_TRAIN_PY = ("give a checkpoint written by train.py (Lightning's <run>/checkpoints/*.ckpt) or a folder written by "
                 "eval.py export")
OTHER_CODE = ("it was written by another model class or version of fpa-lightning: evaluate it with the code that "
              "trained it")


def _first_lines(text: str, limit: int = 200) -> str:
    """An exception's text on one line: its first line, and its last one where that says more (torch's
    weights-only refusal explains at length and names the cause last), at most `limit` characters each."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(text).splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return ""
    cause = [line for line in lines if "Unpickler error" in line]  # why torch refused a weights-only load
    picked = cause[:1] if cause else [lines[0]] if len(lines) == 1 else [lines[0], lines[-1]]
    return " ... ".join(line if len(line) <= limit else line[: limit - 3] + "..." for line in picked)


def _names(keys: list[str], shown: int = 3) -> str:
    listed = ", ".join(keys[:shown])
    return f"{len(keys)} ({listed}{', ...' if len(keys) > shown else ''})"


@dataclass
class LoadedModel:
    path: str
    decoder: Decoder
    global_step: int | None
    tokenizer: str | None = None
    """The data module's ``tokenizer`` hyper-parameter at training time (None: the offline Mistral tokenizer)."""
    impl_note: str | None = None
    """Why the attention implementation differs from the checkpoint's (a fused checkpoint on a CPU)."""
    training: dict = field(default_factory=dict)
    """The checkpoint's hyper-parameters: ``hyper_parameters`` and ``datamodule_hyper_parameters``."""
    source: str | None = None
    """For an export folder: the checkpoint it was exported from, where the folder records it (None otherwise)."""

    @property
    def backend(self) -> str:
        return self.decoder.cfg.attention.backend

    @property
    def impl_at_training(self) -> str | None:
        """The attention implementation the checkpoint's config asked for."""
        return ((self.training.get("hyper_parameters") or {}).get("model") or {}).get("attention", {}).get("impl")

    def describe(self, device: torch.device) -> dict:
        """What the JSON result records about this checkpoint."""
        attention = self.decoder.cfg.attention
        return {
            "path": os.path.abspath(self.path),
            "backend": attention.backend,
            "positional": attention.positional,
            "impl_at_training": self.impl_at_training,
            "impl_requested": attention.impl,
            "impl_per_layer": self.decoder.attention_impls(device),
            "impl_note": self.impl_note,
            "tokenizer_at_training": self.tokenizer or "offline Mistral-7B v0.1 (default)",
            "global_step": self.global_step,
            "parameters": self.decoder.num_parameters(),
            "max_seq_len": self.decoder.cfg.max_seq_len,
            **({"exported_from": self.source} if self.source else {}),
        }


def load_decoder(path: str, device: torch.device, impl: str | None = None) -> LoadedModel:
    """The Decoder of a checkpoint, in eval mode on ``device``; ``impl`` overrides the attention implementation
    (e.g. ``naive`` to check a result against the reference). A checkpoint trained with ``impl: fused`` runs the
    chunked path where the fused kernel cannot run (a CPU), and ``impl_note`` says so. Raises CheckpointError
    with the reason."""
    if os.path.isdir(path):
        return _load_export(path, device, impl)
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist: {FROM_TRAIN_PY}")
    try:
        # weights_only: a checkpoint holds tensors and plain containers; nothing in it needs unpickling code
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a corrupt / foreign file
        raise CheckpointError(f"cannot read checkpoint {path!r} ({type(err).__name__}: {_first_lines(err)}): "
                              f"{FROM_TRAIN_PY}") from err
    model_hparams = _model_hparams(ckpt, path)
    decoder, note = _build(model_hparams, impl, device, path)
    weights = {k[len(PREFIX):]: v for k, v in ckpt["state_dict"].items() if k.startswith(PREFIX)}
    shapes = {k: tuple(v.shape) for k, v in decoder.state_dict().items()}
    wrong = [k for k, v in weights.items() if k in shapes and tuple(getattr(v, "shape", ())) != shapes[k]]
    if wrong:  # load_state_dict would raise a multi-line RuntimeError
        first = wrong[0]
        raise CheckpointError(
            f"checkpoint {path!r}: its weights do not fit the model its hyper-parameters describe: {_names(wrong)} "
            f"tensors of another shape ({first}: {tuple(weights[first].shape)} in the file, {shapes[first]} in the "
            f"model); {OTHER_CODE}")
    missing, unexpected = decoder.load_state_dict(weights, strict=False)
    # tied embeddings store lm_head.weight too (same tensor); any other mismatch means a different model
    if missing or unexpected:
        found = [f"{what} {_names(keys)}" for what, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
        raise CheckpointError(f"checkpoint {path!r} does not match its ModelConfig: {', '.join(found)} weights; "
                              f"{OTHER_CODE}")
    decoder.attention_impls(device)  # raises now (not mid-task) when the implementation cannot run there
    datamodule = ckpt.get("datamodule_hyper_parameters") or {}
    training = {"hyper_parameters": ckpt.get("hyper_parameters") or {}, "datamodule_hyper_parameters": datamodule,
                "attention_impls": ckpt.get("attention_impls")}
    return LoadedModel(path, decoder.to(device).eval(), ckpt.get("global_step"), datamodule.get("tokenizer"), note,
                       training)


def _build(model_hparams: dict, impl: str | None, device: torch.device, path: str) -> tuple[Decoder, str | None]:
    """The Decoder the hyper-parameters describe (``impl`` overriding theirs), and the note of a fused model that runs
    the chunked path because the fused kernel cannot run on ``device``."""
    cfg = _config(model_hparams, impl, path)
    try:
        decoder, note = Decoder(cfg), None
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path!r}: its model hyper-parameters build no Decoder "
                              f"({_first_lines(err)}); {OTHER_CODE}") from err
    if impl is None and cfg.attention.impl == "fused" and not _can_run(decoder, device):
        decoder = Decoder(_config(model_hparams, "chunked", path))
        note = (f"trained with impl=fused, which needs a CUDA GPU: the chunked path runs on {device.type} "
                "(the same function, block-wise in PyTorch; --impl naive runs the reference)")
    return decoder, note


def _load_export(path: str, device: torch.device, impl: str | None) -> LoadedModel:
    """``load_decoder`` for a folder: an export (or save_pretrained) folder, read by ``fpa_lightning.export``."""
    if not is_export_folder(path):
        raise CheckpointError(f"{path!r} is a folder without {CONFIG}, not an export folder: {FROM_TRAIN_PY}")
    try:
        model_hparams = dataclasses.asdict(export_config(path))
    except (OSError, ValueError, TypeError, KeyError) as err:  # not ours, or a config this code cannot read
        raise CheckpointError(f"export folder {path!r}: {_first_lines(err)}; {FROM_TRAIN_PY}") from err
    decoder, note = _build(model_hparams, impl, device, path)
    try:
        load_weights(decoder, export_weights(path), path)
    except (OSError, ValueError, RuntimeError) as err:  # no weights file, a foreign one, or weights of other shapes
        raise CheckpointError(f"export folder {path!r}: {_first_lines(err)}; {OTHER_CODE}") from err
    decoder.attention_impls(device)  # raises now (not mid-task) when the implementation cannot run there
    try:
        record = export_provenance(path)
    except (OSError, ValueError) as err:  # a checkpoint.json cut short or edited by hand
        raise CheckpointError(f"export folder {path!r}: unreadable checkpoint.json ({_first_lines(err)}): write the "
                              "export again, or delete the file to evaluate the folder without its record") from err
    datamodule = record.get("datamodule_hyper_parameters") or {}
    training = {"hyper_parameters": record.get("hyper_parameters") or {"model": model_hparams},
                "datamodule_hyper_parameters": datamodule, "attention_impls": record.get("attention_impls")}
    return LoadedModel(path, decoder.to(device).eval(), record.get("global_step"), _export_tokenizer(path, record),
                       note, training, record.get("path"))


def _export_tokenizer(path: str, record: dict) -> str | None:
    """The tokenizer an export folder is evaluated with: the one its checkpoint was trained with, as for that
    checkpoint (None: the offline Mistral tokenizer), so that ``--compare`` against it reads the same items; but the
    folder's own tokenizer.json (the same tokenizer) where the recorded one is a file that is not here (a path relative
    to the training directory), and for a folder without checkpoint.json."""
    own = os.path.join(path, "tokenizer.json")
    if "datamodule_hyper_parameters" in record:
        trained = (record["datamodule_hyper_parameters"] or {}).get("tokenizer")
        if trained is None or os.path.isfile(trained) or not os.path.isfile(own):
            return trained
    return own if os.path.isfile(own) else None


def _config(model_hparams: dict, impl: str | None, path: str) -> ModelConfig:
    if impl is not None:
        model_hparams = {**model_hparams, "attention": {**dict(model_hparams.get("attention") or {}), "impl": impl}}
    try:
        return ModelConfig(**model_hparams)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"checkpoint {path!r}: invalid model hyper-parameters ({_first_lines(err)}); "
                              f"{OTHER_CODE}") from err


def _can_run(decoder: Decoder, device: torch.device) -> bool:
    try:
        decoder.attention_impls(device)
    except RuntimeError:  # a fused kernel without a GPU
        return False
    return True


def _model_hparams(ckpt: object, path: str) -> dict:
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise CheckpointError(f"{path!r} is not a Lightning checkpoint (no 'state_dict'): {FROM_TRAIN_PY}")
    hparams = ckpt.get("hyper_parameters") or {}
    model = hparams.get("model") if isinstance(hparams, dict) else None
    if not isinstance(model, dict):
        found = sorted(map(str, hparams)) if isinstance(hparams, dict) else type(hparams).__name__
        raise CheckpointError(
            f"checkpoint {path!r} has no 'model' hyper-parameters dict (asdict(ModelConfig)); found hyper-parameters "
            f"{_first_lines(found)}: eval.py reads checkpoints of train.py's LanguageModel, {FROM_TRAIN_PY}"
        )
    return dict(model)
