"""What both verbs of ``eval.py`` load before any work: the device, the tokenizer the checkpoints were trained with,
and the data, which come from outside (``eval.py`` passes ``datamodules.EvalCorpus`` as the factory)."""
from __future__ import annotations

from collections.abc import Callable

import torch

from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.data import EvalData

DataFactory = Callable[[str | None, str | None], EvalData]
"""``factory(--data, tokenizer)``: the data of a run, tokenised with that tokenizer (None: the offline default)."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: no CUDA device is available")
    return device


def tokenizer_source(tokenizer: str | None, models: list[LoadedModel]) -> str | None:
    """--tokenizer, else the tokenizer the checkpoint(s) were trained with (compared checkpoints must agree)."""
    if tokenizer is not None:
        return tokenizer
    sources = {m.tokenizer for m in models}
    if len(sources) > 1:
        raise ValueError(f"the checkpoints were trained with different tokenizers {sorted(map(str, sources))}: "
                         "paired items need one; choose it with --tokenizer")
    return models[0].tokenizer


def load_data(data_factory: DataFactory, data: str | None, tokenizer: str | None,
              models: list[LoadedModel]) -> EvalData:
    """The data (--data) with the checkpoints' tokenizer (or --tokenizer), which is loaded now so that a missing file
    fails early."""
    source = tokenizer_source(tokenizer, models)
    loaded = data_factory(data, source)
    try:
        loaded.tokenizer
    except (FileNotFoundError, ModuleNotFoundError, ConnectionError) as err:
        origin = "--tokenizer" if tokenizer else f"the checkpoint's training tokenizer ({source or 'default'})"
        raise ValueError(f"cannot load {origin}: {err}; give --tokenizer PATH/tokenizer.json (a relative path in a "
                         "checkpoint is relative to the training directory)") from err
    return loaded
