"""Guards of ``LanguageModel`` against non-finite numbers: a NaN/inf loss stops the run before the step that would
write it into the weights, and no checkpoint holding non-finite weights or optimizer state is ever written.

Cost on a healthy run: one host sync per *optimizer* step (the losses of its micro-batches are checked together,
in ``on_before_optimizer_step``), plus one small all-reduce under DDP/FSDP so that every rank stops at the same step;
nothing changes in the numbers computed.
"""
from __future__ import annotations

import math
import os

import torch

_SPLIT_NAMES = {"val": "validation"}


class NonFiniteLossError(RuntimeError):
    """A loss, the validation/test mean, or the state to be checkpointed is NaN or infinite."""


def last_good_checkpoint(trainer) -> str:
    """The checkpoint written most recently by this run's ``ModelCheckpoint``s (each one was checked finite when it
    was written), else the one the run resumed from; a sentence when there is none."""
    candidates = {getattr(cb, attr, "") for cb in trainer.checkpoint_callbacks
                  for attr in ("last_model_path", "best_model_path", "_last_checkpoint_saved")}
    candidates.add(str(trainer.ckpt_path or ""))
    existing = [path for path in candidates if path and os.path.isfile(path)]
    if not existing:
        return "none (no checkpoint was written before this point)"
    return max(existing, key=os.path.getmtime)


def check_step_losses(module, checks: list[tuple[torch.Tensor, object]]) -> None:
    """Raise ``NonFiniteLossError`` on every rank when any rank's loss of this optimizer step is not finite.

    ``checks`` holds ``(loss, position in the data stream)`` of each micro-batch of the step on this rank.
    """
    if not checks:
        return
    losses = torch.stack([loss.detach().float().reshape(()) for loss, _ in checks])
    bad = (~torch.isfinite(losses)).sum()
    if _distributed():
        torch.distributed.all_reduce(bad)  # every rank learns of any rank's bad loss, so that all stop together
    if not bad.item():  # the one host sync per optimizer step
        return
    mine = [f"loss {value} at {position or 'an unknown position (no TextDataModule)'}"
            for value, (_, position) in zip(losses.tolist(), checks) if not math.isfinite(value)]
    reports = _gather((module.trainer.global_rank, mine))
    where = "; ".join(f"rank {rank}: {', '.join(found)}" for rank, found in reports if found)
    step = module.trainer.global_step + 1
    raise NonFiniteLossError(
        f"train/loss is not finite at optimizer step {step} ({where}). The run stops before that step changes the "
        f"weights; last good checkpoint: {last_good_checkpoint(module.trainer)}. Lower model.optim.lr (or raise "
        f"warmup_steps, set trainer.gradient_clip_val), or check the data at that position")


def check_mean_loss(module, split: str, loss: torch.Tensor) -> None:
    """``loss`` is the mean over every rank (the same value on each), so every rank raises together."""
    if not torch.isfinite(loss):
        raise NonFiniteLossError(
            f"{split}/loss is {loss.item()} at step {module.trainer.global_step}: some {_SPLIT_NAMES.get(split, split)} "
            f"tokens gave a non-finite loss, so the mean (which picks the best checkpoint) would be wrong. No "
            f"checkpoint is written for it; last good checkpoint: {last_good_checkpoint(module.trainer)}")


def check_state_finite(module) -> None:
    """Refuse to write a checkpoint whose weights or optimizer state hold NaN/inf (decided on every rank together:
    under FSDP each rank checks its own shard)."""
    tensors = [p.detach() for p in module.parameters()]
    for optimizer in module.trainer.optimizers:
        for state in optimizer.state.values():
            tensors.extend(v for v in state.values() if torch.is_tensor(v) and v.is_floating_point())
    tensors = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]  # DTensor shards: the local part
    flags = [torch.isfinite(t).all() for t in tensors]  # one host sync per device below, not per tensor
    local = all(bool(torch.stack([f for f in flags if f.device == d]).all()) for d in {f.device for f in flags})
    if module.trainer.strategy.reduce_boolean_decision(local, all=True):
        return
    raise NonFiniteLossError(
        f"refusing to write a checkpoint at step {module.trainer.global_step}: the weights or the optimizer state hold "
        f"NaN/inf values; last good checkpoint: {last_good_checkpoint(module.trainer)}")


def _distributed() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _gather(obj) -> list:
    if _distributed():
        gathered = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, obj)
        return gathered
    return [obj]
