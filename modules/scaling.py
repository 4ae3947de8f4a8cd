"""Beyond one GPU: the plumbing ``LanguageModel`` and the callbacks need under DDP, FSDP and ``torch.compile``.

- ``shard_by_block``: under FSDP (``--trainer.strategy=fsdp``) every transformer ``Block`` becomes its own FSDP unit
  unless the strategy was given an ``auto_wrap_policy`` of its own; the root unit holds the embedding and final norm.
  Without it FSDP would gather the whole model for every forward (one unit). With ``model.activation_checkpointing``
  the strategy also checkpoints every ``Block`` (its ``activation_checkpointing_policy``, applied inside the FSDP
  units after wrapping), and the Decoder, whose blocks are then FSDP units rather than ``Block``s, does not again.
- ``clip_gradients``: clipping through the strategy: FSDP's own ``clip_grad_norm_`` (the norm over every shard of
  every rank; ``torch.nn.utils.clip_grad_norm_`` would see this rank's shards only), and the fused-AdamW case.
- ``compile_blocks``: ``model.compile`` compiles each ``Block`` (regional compilation: one graph reused by every
  layer; the parameter names, hence checkpoints, do not change).
- ``whole_decoder``: the callbacks' probe forwards under any strategy: the module's own Decoder when nothing is
  sharded, a gathered full copy on rank 0 under FSDP (a collective: every rank enters it).
"""
from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import FSDPStrategy
from torch._functorch import config as functorch_config

from fpa_lightning import Decoder
from fpa_lightning.export import PREFIX
from fpa_lightning.model import Block


def shard_by_block(trainer: Trainer) -> None:
    """Give an FSDP strategy without a wrapping policy one FSDP unit per ``Block``, and, when the model asks for
    activation checkpointing and the strategy has no checkpointing policy, a policy that checkpoints every ``Block``
    (before it wraps the model)."""
    strategy = trainer.strategy
    if not isinstance(strategy, FSDPStrategy):
        return
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    if "auto_wrap_policy" not in strategy.kwargs:
        strategy.kwargs["auto_wrap_policy"] = ModuleWrapPolicy({Block})
    decoder = getattr(trainer.lightning_module, "model", None)
    if isinstance(decoder, Decoder) and decoder.cfg.activation_checkpointing and \
            not strategy._activation_checkpointing_kwargs:
        # What FSDPStrategy(activation_checkpointing_policy={Block}) stores; the strategy exists before the model's
        # config is read, and Lightning has no public setter. _setup_model applies it after wrapping: each unit holds
        # CheckpointWrapper(Block) (non-reentrant), the pattern FSDP documents, instead of a checkpoint around a unit.
        strategy._activation_checkpointing_kwargs = {"auto_wrap_policy": ModuleWrapPolicy({Block})}


def is_sharded(trainer: Trainer) -> bool:
    """True when the model's parameters are split across ranks (FSDP)."""
    return isinstance(trainer.strategy, FSDPStrategy)


def clip_gradients(module: LightningModule, optimizer, clip_val: float | None, algorithm: str | None) -> bool:
    """Clip the gradients where Lightning's own clipping would be wrong or refused; False: leave it to Lightning.

    FSDP: by norm with the root FSDP module's ``clip_grad_norm_``; by value elementwise on the local shards (exact).
    Fused AdamW (CUDA, bf16-mixed or full precision): Lightning refuses to clip for any fused optimizer under
    mixed precision, for fear of fp16's gradient scaler; under bf16 there is none, the gradients are the true ones and
    clipping them here is exact.
    """
    if not clip_val or not (is_sharded(module.trainer) or optimizer.defaults.get("fused")):
        return False
    if algorithm == "value":
        torch.nn.utils.clip_grad_value_(module.parameters(), clip_val)
    elif is_sharded(module.trainer):
        module.trainer.strategy.model.clip_grad_norm_(clip_val)
    else:
        torch.nn.utils.clip_grad_norm_(module.parameters(), clip_val)
    return True


def compile_blocks(decoder: Decoder, options: bool | dict) -> None:
    """``torch.compile`` each Block in place (``options``: True for the defaults, or torch.compile's keyword arguments,
    e.g. ``{"mode": "max-autotune"}``). Idempotent. Graph breaks: the FPA Triton kernel and FoX's FlexAttention
    (compiled on its own) run between graphs, once per layer (docs/training.md, "torch.compile")."""
    kwargs = {} if options is True else dict(options)
    # Lightning runs the backward outside autocast, as eager PyTorch does; AOTAutograd otherwise traces a compiled
    # block's backward under the forward's autocast, which computes the float32 gate maps' gradients in bf16
    # (docs/training.md, "torch.compile"). Older torch lacks the switch and keeps that behaviour.
    if hasattr(functorch_config, "backward_pass_autocast"):
        functorch_config.backward_pass_autocast = "off"
    else:
        warnings.warn(f"torch {torch.__version__} traces a compiled block's backward under the forward's autocast: "
                      "float32 regions (the gate maps) get bf16 gradients under bf16-mixed", stacklevel=2)
    for block in decoder.blocks:
        if getattr(block, "_compiled_call_impl", None) is None:
            block.compile(**kwargs)


@contextmanager
def whole_decoder(trainer: Trainer, module: LightningModule) -> Iterator[Decoder | None]:
    """The whole Decoder on global rank 0, None on the other ranks; enter it on every rank.

    Not sharded (one device, DDP): the module's own Decoder, no collective. FSDP: a probe forward through the sharded
    units outside the training step would hang (the other ranks never join its all-gathers), so the full state dict
    is gathered to rank 0 (every rank takes part) and loaded into a copy there, freed on exit.
    """
    if not is_sharded(trainer):
        yield module.model if trainer.is_global_zero else None
        return
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    wrapped = trainer.strategy.model
    with FSDP.state_dict_type(wrapped, StateDictType.FULL_STATE_DICT,
                              FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
        state = wrapped.state_dict()
    if not trainer.is_global_zero:
        yield None
        return
    with torch.device(module.device):
        copy = Decoder(module.model.cfg)
    missing, unexpected = copy.load_state_dict(
        {k.removeprefix(PREFIX): v for k, v in state.items() if k.startswith(PREFIX)}, strict=False)
    tied = {"lm_head.weight"} if module.model.cfg.tie_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"gathering the FSDP model failed: missing {missing}, unexpected {unexpected}")
    copy.eval()
    try:
        yield copy
    finally:
        del copy, state
