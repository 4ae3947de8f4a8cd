"""The verb ``eval.py export``: a checkpoint written as a transformers model folder (``fpa_lightning.hf.save_export``),
reloaded with our loader and with transformers, which must give the checkpoint's logits exactly.

``python eval.py export --ckpt CKPT --out DIR [--overwrite] [--impl IMPL] [--tokenizer PATH] [--device DEVICE]``
"""
from __future__ import annotations

import argparse
import dataclasses
import os

import torch

from fpa_lightning.attention.config import IMPLS
from fpa_lightning.evaluation.checkpoint import CheckpointError, LoadedModel, load_decoder
from fpa_lightning.evaluation.data import EvalData
from fpa_lightning.export import load_hf, model_card
from modules.evaluation.inputs import DataFactory, load_data, resolve_device

MOVED = ("--export is now a verb of its own: python eval.py export --ckpt CKPT --out DIR (eval.py export --help "
         "lists its options)")
"""The one-line error of the old ``eval.py --export hf``."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval.py export",
        description="Write a checkpoint as a transformers model folder into --out: safetensors, config.json, the "
        "model's code for trust_remote_code, the tokenizer and a model card (needs the hf extra); then reload it and "
        "check that it gives the checkpoint's logits exactly.")
    p.add_argument("--ckpt", required=True, help="the Lightning checkpoint to export (or an export folder)")
    p.add_argument("--out", required=True, help="the folder to write")
    p.add_argument("--overwrite", action="store_true", help="write into an --out folder that already holds files, "
                   "replacing the export's own files there and leaving the others (default: refuse, naming them); a "
                   "README.md that no export wrote is still refused")
    p.add_argument("--impl", choices=IMPLS, help="the attention implementation to load the checkpoint with and to "
                   "name in the exported config (default: the one the checkpoint was trained with)")
    p.add_argument("--tokenizer", help="tokenizer.json (or SentencePiece .model) to export with the model (default: "
                   "the one the checkpoint was trained with, recorded in it)")
    p.add_argument("--device", default="auto", help="where the reloaded models are compared: auto (cuda if "
                   "available), cpu, cuda, cuda:N")
    return p


def main(argv: list[str], data_factory: DataFactory) -> str:
    """Run the verb; returns the export folder. Errors in arguments or checkpoints exit with a message."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        model = load_decoder(args.ckpt, resolve_device(args.device), args.impl)
        return export(model, load_data(data_factory, None, args.tokenizer, [model]), args.out, args.impl,
                      args.overwrite)
    except (CheckpointError, ValueError, RuntimeError) as err:
        parser.error(str(err))


def export(model: LoadedModel, data: EvalData, out_dir: str, impl: str | None, overwrite: bool) -> str:
    """Write the transformers folder, reload it with our loader and with transformers and check that both give
    identical logits; returns ``out_dir``. The exported config keeps the implementation the model was trained with
    (``impl`` overrides it)."""
    try:
        from fpa_lightning.hf.save_export import save_export
        from fpa_lightning.hf.modeling import FPAForCausalLM
    except ImportError as err:
        raise ValueError(f"eval.py export needs transformers: pip install -e \".[hf]\" ({err})") from err
    tokenizer = data.describe()["tokenizer"]
    card = model_card(model.decoder, model.source or os.path.abspath(model.path), model.global_step, model.training,
                      model.training.get("attention_impls"), tokenizer)
    trained = model.training["hyper_parameters"]["model"]["attention"]["impl"]
    cfg = model.decoder.cfg
    cfg = dataclasses.replace(cfg, attention=dataclasses.replace(cfg.attention, impl=impl or trained))
    provenance = {"path": model.source or os.path.abspath(model.path), "global_step": model.global_step,
                  **model.training}
    existing = set(os.listdir(out_dir)) if os.path.isdir(out_dir) else set()
    paths = save_export(model.decoder, out_dir, card, data.tokenizer, data.bos_id, data.eos_id, cfg, overwrite,
                        provenance)
    device = next(model.decoder.parameters()).device
    ids = torch.randint(3, cfg.vocab_size, (1, min(64, cfg.max_seq_len)), device=device)
    ours = load_hf(out_dir, device, model.decoder.cfg.attention.impl)
    config = FPAForCausalLM.config_class.from_pretrained(out_dir)
    config.attention["impl"] = model.decoder.cfg.attention.impl
    theirs = FPAForCausalLM.from_pretrained(out_dir, config=config).to(device).eval()
    with torch.no_grad():
        logits = model.decoder(ids)
        if not (torch.equal(logits, ours(ids)) and torch.equal(logits, theirs(ids).logits)):
            raise RuntimeError(f"{out_dir}: the reloaded export gives different logits")  # a bug: stop loudly
    code = [p for name, p in paths.items() if name.endswith(".py")]
    for name, path in paths.items():
        if not name.endswith(".py"):
            print(f"export: {path}")
    print(f"export: {len(code)} source files for trust_remote_code=True, copied from the installed fpa_lightning")
    replaced = sorted(set(paths) & existing)
    if replaced:
        print(f"export: --overwrite replaced {len(replaced)} files: {', '.join(replaced)}")
    print(f"export: reloaded with fpa_lightning.export.load_hf and with transformers (FPAForCausalLM): identical "
          f"logits on {ids.shape[1]} tokens")
    return out_dir
