"""The folder of ``eval.py export``: a transformers model folder that loads three ways.

* ``AutoModelForCausalLM.from_pretrained(path)`` after ``import fpa_lightning.hf`` (the registered classes);
* ``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)`` anywhere (``auto_map`` and the copied
  source, ``fpa_lightning.hf.remote``);
* ``fpa_lightning.export.load_hf(path)`` (the bare ``Decoder``) and ``LanguageModel(init_from=path)``.

Files: ``model.safetensors`` (the Decoder's weights under ``model.``; tied embeddings once), ``config.json``
(``FPAConfig``), ``generation_config.json``, the remote-code modules, ``tokenizer.json`` with
``tokenizer_config.json`` (``AutoTokenizer``: BOS added by default, as every training document began with it) and
the model card ``README.md``.

Every file is written to a temp name inside the folder and renamed into place, so a reader never sees a half-written
file; a folder that already holds files is refused unless ``overwrite`` (which replaces the files named here and
leaves any other file as it is).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

from tokenizers import Tokenizer, processors

from fpa_lightning.config import ModelConfig
from fpa_lightning.hf.config import FPAConfig
from fpa_lightning.hf.modeling import FPAForCausalLM
from fpa_lightning.hf.remote import atomic_write, write_remote_code
from fpa_lightning.model import Decoder

CARD, TOKENIZER, TOKENIZER_CONFIG = "README.md", "tokenizer.json", "tokenizer_config.json"


class ExportExistsError(ValueError):
    """The export folder already holds files and overwriting was not asked for."""


def check_target(out_dir: str, overwrite: bool) -> None:
    """Refuse a folder that holds files unless ``overwrite``."""
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not overwrite:
        raise ExportExistsError(f"{out_dir} already holds files; pass --overwrite to replace them")


def hf_model(decoder: Decoder, cfg: ModelConfig, bos_id: int | None, eos_id: int | None) -> FPAForCausalLM:
    """The transformers model holding ``decoder``'s weights, configured by ``cfg`` (the same architecture, e.g.
    with the implementation it was trained with)."""
    model = FPAForCausalLM(FPAConfig.from_model_config(cfg, bos_token_id=bos_id, eos_token_id=eos_id))
    model.model.load_state_dict(decoder.state_dict())
    return model.eval()


def tokenizer_files(tokenizer: Tokenizer, bos_id: int, eos_id: int) -> dict[str, str]:
    """tokenizer.json and tokenizer_config.json for ``AutoTokenizer``: our tokenizer unchanged but for a
    post-processor that puts BOS first when special tokens are asked for (transformers' default; our pipeline always
    passes ``add_special_tokens=False``). The special tokens are named in the config only, not added to the
    tokenizer itself, and ``split_special_tokens`` keeps a literal "<s>" in text as characters, so ids match ours."""
    bos, eos = tokenizer.id_to_token(bos_id), tokenizer.id_to_token(eos_id)
    with_bos = Tokenizer.from_str(tokenizer.to_str())
    with_bos.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                            special_tokens=[(bos, bos_id)])
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
              "unk_token": getattr(tokenizer.model, "unk_token", None), "split_special_tokens": True,
              "clean_up_tokenization_spaces": False}
    return {TOKENIZER: with_bos.to_str(pretty=True), TOKENIZER_CONFIG: json.dumps(config, indent=2) + "\n"}


def save_export(decoder: Decoder, out_dir: str, card: str, tokenizer: Tokenizer, bos_id: int, eos_id: int,
                cfg: ModelConfig | None = None, overwrite: bool = False) -> dict[str, str]:
    """Write the export folder (see the module docstring); returns {file name: path}. ``cfg`` replaces the
    decoder's config (the same model, e.g. with the implementation it was trained with)."""
    check_target(out_dir, overwrite)
    os.makedirs(out_dir, exist_ok=True)
    staging = tempfile.mkdtemp(dir=out_dir, prefix=".tmp-export-")  # same filesystem: every rename is atomic
    try:
        hf_model(decoder, cfg or decoder.cfg, bos_id, eos_id).save_pretrained(staging)
        write_remote_code(staging)
        for name, text in {**tokenizer_files(tokenizer, bos_id, eos_id), CARD: card}.items():
            atomic_write(os.path.join(staging, name), text)
        paths = {}
        for name in sorted(os.listdir(staging)):
            paths[name] = os.path.join(out_dir, name)
            os.replace(os.path.join(staging, name), paths[name])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return paths
