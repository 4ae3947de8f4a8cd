"""The folder of ``eval.py export``: a transformers model folder that loads three ways.

* ``AutoModelForCausalLM.from_pretrained(path)`` after ``import fpa_lightning.hf`` (the registered classes);
* ``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)`` anywhere (``auto_map`` and the copied
  source, ``fpa_lightning.hf.remote``);
* ``fpa_lightning.export.load_hf(path)`` (the bare ``Decoder``) and ``LanguageModel(init_from=path)``.

Files: ``model.safetensors`` (the Decoder's weights under ``model.``; tied embeddings once), ``config.json``
(``FPAConfig``), ``generation_config.json``, the remote-code modules, ``tokenizer.json`` with
``tokenizer_config.json`` (``AutoTokenizer``: BOS added by default, as every training document began with it) and
the model card ``README.md``.

With ``eval.py export`` also ``checkpoint.json`` (``fpa_lightning.export.PROVENANCE``: the checkpoint it came from,
its step and hyper-parameters), so that the folder is evaluated as that checkpoint would be.

Every file is written into a staging folder inside the folder and renamed into place, so a reader never sees a
half-written file, each with the permissions a plain ``open`` gives under the user's umask. A folder that already
holds files is refused, naming the files the export would replace, unless ``overwrite``: that replaces the files the
export writes and leaves any other file as it is, but never a README.md the export did not write (its model card
ends with ``CARD_MARKER``): the user's own README.md is refused by name.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile

from tokenizers import Tokenizer, processors

from fpa_lightning.atomic import plain_file_mode
from fpa_lightning.config import ModelConfig
from fpa_lightning.export import CARD_MARKER, PROVENANCE, is_export_card
from fpa_lightning.hf.config import FPAConfig
from fpa_lightning.hf.modeling import FPAForCausalLM
from fpa_lightning.hf.remote import atomic_write, write_remote_code
from fpa_lightning.model import Decoder

CARD, TOKENIZER, TOKENIZER_CONFIG = "README.md", "tokenizer.json", "tokenizer_config.json"
STAGING = ".tmp-export-"  # the prefix of the staging folder inside the export folder


class ExportExistsError(ValueError):
    """The export folder already holds files and overwriting was not asked for."""


def check_target(out_dir: str, names: list[str], overwrite: bool) -> list[str]:
    """Refuse a folder that already holds files unless ``overwrite``, naming the ones among ``names`` (the files the
    export writes) it would replace; with ``overwrite`` still refuse a README.md that is not an export's model card.
    Returns the files that will be replaced."""
    existing = sorted(n for n in os.listdir(out_dir) if not n.startswith(STAGING)) if os.path.isdir(out_dir) else []
    replaced = [n for n in names if n in existing]
    if existing and not overwrite:
        kept = [n for n in existing if n not in names]
        if replaced:
            others = f" (the other files, {_listed(kept)}, would stay as they are)" if kept else ""
            raise ExportExistsError(f"{out_dir} already holds files that the export would replace: "
                                    f"{_listed(replaced, len(replaced))}{others}; pass --overwrite to replace them")
        raise ExportExistsError(f"{out_dir} already holds files ({_listed(kept)}), none of which the export would "
                                "replace; pass --overwrite to write the export beside them")
    card = os.path.join(out_dir, CARD)
    if CARD in replaced and not _export_card(card):
        raise ExportExistsError(f"{card} is not a model card that eval.py export wrote, and the export writes its "
                                f"model card there: move it away (--overwrite replaces only the export's own files)")
    return replaced


def _listed(names: list[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def _export_card(path: str) -> bool:
    """Whether the README.md at ``path`` is a model card an export wrote (``fpa_lightning.export.is_export_card``)."""
    try:
        with open(path, encoding="utf-8") as f:
            return is_export_card(f.read())
    except (OSError, UnicodeDecodeError):  # a folder, or not text: not ours
        return False


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
                cfg: ModelConfig | None = None, overwrite: bool = False,
                provenance: dict | None = None) -> dict[str, str]:
    """Write the export folder (see the module docstring); returns {file name: path}. ``cfg`` replaces the
    decoder's config (the same model, e.g. with the implementation it was trained with); ``provenance``: what
    checkpoint.json records (the source checkpoint's path, step and hyper-parameters), None to write none."""
    os.makedirs(out_dir, exist_ok=True)
    staging = tempfile.mkdtemp(dir=out_dir, prefix=STAGING)  # same filesystem: every rename is atomic
    try:
        hf_model(decoder, cfg or decoder.cfg, bos_id, eos_id).save_pretrained(staging)
        write_remote_code(staging)
        texts = {**tokenizer_files(tokenizer, bos_id, eos_id), CARD: card.rstrip("\n") + f"\n\n{CARD_MARKER}\n"}
        if provenance is not None:
            texts[PROVENANCE] = json.dumps(provenance, indent=1, default=str) + "\n"
        for name, text in texts.items():
            atomic_write(os.path.join(staging, name), text)
        names = sorted(os.listdir(staging))
        check_target(out_dir, names, overwrite)  # here the names are known exactly, and nothing is renamed yet
        mode = plain_file_mode()
        paths = {}
        for name in names:
            paths[name] = os.path.join(out_dir, name)
            os.chmod(os.path.join(staging, name), mode)  # safetensors writes model.safetensors 0600
            os.replace(os.path.join(staging, name), paths[name])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return paths
