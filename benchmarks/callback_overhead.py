"""Overhead of HeadSurvivalCallback at its default frequency, measured in one run on the CPU.

The quickstart model's shapes, with a 512-token vocabulary and 4 rows per batch: a cheaper training step, so the
ratio is pessimistic. Overhead = time per call ÷ (every_n_steps × mean training step time); the goal is < 3%.

    python benchmarks/callback_overhead.py [--every N]
"""
import argparse
import inspect
import tempfile
import time

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch.utils.data import DataLoader

from callbacks import HeadSurvivalCallback
from fpa_lightning.attention import AttentionConfig
from fpa_lightning.config import ModelConfig
from modules.language_model import LanguageModel, OptimConfig

SEQ, ROWS, VOCAB = 256, 4, 512  # configs/quickstart.yaml: seq_len 256 (its batch is 8, its vocabulary 32,000)
DEFAULT_EVERY = inspect.signature(HeadSurvivalCallback).parameters["every_n_steps"].default


class StepTimer(L.Callback):
    """Wall time from batch start to batch end (forward, backward, optimizer step); listed before the callback
    under test, so its end hook runs first and the step time excludes the measurement."""

    def __init__(self):
        self.times, self._start = [], 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.times.append(time.perf_counter() - self._start)


class TimedHeads(HeadSurvivalCallback):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.times = []

    def _measure_and_log(self, trainer, pl_module):
        start = time.perf_counter()
        super()._measure_and_log(trainer, pl_module)
        self.times.append(time.perf_counter() - start)


def random_batches(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (n, ROWS, SEQ + 1), generator=g)
    segments = (torch.arange(SEQ) // 64).expand(ROWS, -1)  # a document start every 64 tokens
    return [{"input_ids": r[:, :-1], "labels": r[:, 1:], "segment_ids": segments} for r in ids]


def measure_overhead(every: int, log_dir: str) -> float:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, n_layer=3, d_model=192, n_head=3, d_mlp=512, max_seq_len=SEQ,
                      attention=AttentionConfig(backend="fpa", impl="chunked"))
    timer = StepTimer()
    heads = TimedHeads(every_n_steps=2, batch=random_batches(1)[0])  # every 2nd step here; the ratio uses the default
    trainer = L.Trainer(max_steps=5, limit_val_batches=0, logger=TensorBoardLogger(log_dir), accelerator="cpu",
                        callbacks=[timer, heads], enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(LanguageModel(cfg, OptimConfig(warmup_steps=1)),
                train_dataloaders=DataLoader(random_batches(5), batch_size=None))
    step = sum(timer.times[1:]) / len(timer.times[1:])  # the first step pays one-off warm-up costs
    call = sum(heads.times[1:]) / len(heads.times[1:])  # so does the first call (matplotlib import, layout)
    overhead = call / (every * step)
    print(f"step {step * 1e3:.0f} ms, callback {call * 1e3:.0f} ms per call, every {every} steps: "
          f"overhead {100 * overhead:.3f}% (call = {call / step:.2f} steps; goal < 3%)")
    return overhead


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--every", type=int, default=DEFAULT_EVERY, help="every_n_steps to evaluate the ratio at")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as log_dir:
        measure_overhead(args.every, log_dir)
