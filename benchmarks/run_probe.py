"""A callback for measurement runs of ``train.py`` (benchmarks/multi_gpu.sh): per rank, tokens/s after a warm-up and
the peak GPU memory, written to ``<out>/rank<r>.json``. Added with
``--trainer.callbacks+=benchmarks.run_probe.RunProbe --trainer.callbacks.out=<folder>``."""
from __future__ import annotations

import json
import pathlib
import time

import lightning as L
import torch


class RunProbe(L.Callback):
    def __init__(self, out: str, warmup: int = 10):
        self.out, self.warmup = pathlib.Path(out), warmup
        self.start: float | None = None
        self.timed_steps, self.tokens, self.last_step = 0, 0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == self.last_step:
            return  # inside gradient accumulation
        self.last_step = step
        torch.cuda.synchronize()
        if step == self.warmup:
            self.start = time.perf_counter()
            torch.cuda.reset_peak_memory_stats()
        elif step > self.warmup:
            self.timed_steps += 1
        self.micro_batch = batch["input_ids"].numel()

    def on_train_end(self, trainer, pl_module):
        torch.cuda.synchronize()
        seconds = time.perf_counter() - self.start if self.start else float("nan")
        tokens = self.timed_steps * self.micro_batch * trainer.accumulate_grad_batches
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"rank{trainer.global_rank}.json").write_text(json.dumps({
            "rank": trainer.global_rank, "world_size": trainer.world_size, "strategy": type(trainer.strategy).__name__,
            "timed_steps": self.timed_steps, "tokens_per_s": tokens / seconds,
            "peak_mem_GiB": torch.cuda.max_memory_allocated() / 2**30,
            "params": sum(p.numel() for p in pl_module.parameters()),
        }))
