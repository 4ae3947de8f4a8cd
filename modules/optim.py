"""The optimiser of ``LanguageModel``: AdamW over the decayed and exempt parameters of a ``Decoder``, with a linear
warm-up and a cosine decay (``OptimConfig``, the ``model.optim`` section of the configs)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fpa_lightning.attention import AttentionBackend


@dataclass
class OptimConfig:
    """AdamW with linear warm-up, then cosine decay to ``min_lr_ratio * lr`` at ``trainer.max_steps``."""

    lr: float = 1e-3
    """Peak learning rate, reached at the end of the warm-up."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW (beta1, beta2)."""
    eps: float = 1e-8
    """AdamW epsilon."""
    weight_decay: float = 0.1
    """Decoupled weight decay of the matrices in the blocks (never norms, biases, embeddings or gate parameters)."""
    warmup_steps: int = 250
    """Optimizer steps of linear warm-up from lr/warmup_steps to lr."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of lr, reached at trainer.max_steps."""

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # YAML gives a list
        if self.lr <= 0:
            raise ValueError(f"optim.lr must be positive, got {self.lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"optim.betas must be two numbers in [0, 1), got {self.betas}")
        if self.eps <= 0:
            raise ValueError(f"optim.eps must be positive, got {self.eps}")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be non-negative, got {self.weight_decay}")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be non-negative, got {self.warmup_steps}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step ``step`` (0-based): (step+1)/warmup, then cosine."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps  # never 0, so the first step already moves the weights
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def decayed_parameters(model: torch.nn.Module) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """The parameters of a ``Decoder`` split into (decayed, not decayed), by their owning module's type.

    Only the matrices of the blocks decay (attention qkv/out, MLP). Norm gains and biases (1-D) do
    not: shrinking them towards 0 is not a regulariser. The embedding (an ``nn.Embedding``, tied to the output
    layer) does not: decoupled decay shrinks every row each step, but a rare token's row gets a gradient rarely,
    so it would decay towards 0 between its updates. Parameters owned by an ``AttentionBackend`` (FPA's field
    map and beta, FoX's forget gate, DCP's interaction) do not: decay would pull their biases and scales towards
    a fixed bias strength, i.e. it would regularise the method under study itself.

    Matrices are found as ``nn.Linear`` weights, not by ``ndim``: under FSDP every parameter is a flat 1-D shard
    when the optimizer is built.
    """
    exempt = {id(p) for m in model.modules() if isinstance(m, (AttentionBackend, torch.nn.Embedding))
              for p in m.parameters()}
    matrices = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    params = [p for p in model.parameters() if p.requires_grad]  # a tied weight appears once
    decayed = [p for p in params if id(p) in matrices and id(p) not in exempt]
    chosen = {id(p) for p in decayed}
    return decayed, [p for p in params if id(p) not in chosen]


def fused_adamw_applies(device_type: str, precision: str) -> bool:
    """Fused AdamW on CUDA, except under fp16 mixed precision, whose gradient scaler it would unscale
    internally, after gradient clipping has already seen the scaled gradients."""
    return device_type == "cuda" and not precision.startswith("16")


def build_optimizer(model: torch.nn.Module, optim: OptimConfig, total_steps: int | None, fused: bool) -> dict:
    """AdamW over ``decayed_parameters(model)`` and its per-step schedule, as ``configure_optimizers`` returns them."""
    if total_steps is None or total_steps < 1:
        raise ValueError("set trainer.max_steps: the cosine schedule ends there (the train stream is endless)")
    decayed, not_decayed = decayed_parameters(model)
    groups = [{"params": decayed, "weight_decay": optim.weight_decay}, {"params": not_decayed, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, eps=optim.eps, fused=fused)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, optim.warmup_steps, total_steps, optim.min_lr_ratio))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
