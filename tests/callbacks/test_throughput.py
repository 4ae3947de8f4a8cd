"""ThroughputCallback in a tiny CPU fit under gradient accumulation: the tokens it counts, the model TFLOP/s and MFU
it logs through the trainer's logger (consistent with LanguageModel's train/tokens_per_s over the same window), and
the unknown-device path (one warning, no MFU, no crash)."""
import warnings

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader

from callbacks import ThroughputCallback
from fpa_lightning.analysis.flops import training_flops_per_token
from fpa_lightning.attention import AttentionConfig
from fpa_lightning.config import ModelConfig
from modules.language_model import LanguageModel, OptimConfig

VOCAB, CONTEXT, ROWS = 64, 32, 2


class Recorder(Logger):
    """Keeps every log_metrics call: [(step, metrics)]."""

    def __init__(self):
        super().__init__()
        self.calls = []

    name, version = "recorder", 0

    @property
    def experiment(self):
        return None

    def log_metrics(self, metrics, step=None):
        self.calls.append((step, dict(metrics)))

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def series(self, tag: str) -> list[tuple[int, float]]:
        return [(step, metrics[tag]) for step, metrics in self.calls if tag in metrics]


def batches(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, VOCAB, (ROWS, CONTEXT + 1), generator=g) for _ in range(n)]
    return [{"input_ids": x[:, :-1], "labels": x[:, 1:]} for x in ids]


def fit(callback: ThroughputCallback, max_steps: int = 4, log_every_n_steps: int = 2, validate: bool = False) -> Recorder:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, n_layer=2, d_model=32, n_head=2, d_mlp=64, max_seq_len=CONTEXT,
                      attention=AttentionConfig(backend="fpa"))
    logger = Recorder()
    validation = dict(val_check_interval=4, limit_val_batches=1, num_sanity_val_steps=0) if validate else dict(
        limit_val_batches=0)  # val_check_interval counts micro-batches: 4 / 2 = every 2 optimizer steps
    trainer = L.Trainer(max_steps=max_steps, accumulate_grad_batches=2, log_every_n_steps=log_every_n_steps,
                        logger=logger, callbacks=[callback], accelerator="cpu", enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, **validation)
    trainer.fit(LanguageModel(cfg, OptimConfig(warmup_steps=1)), train_dataloaders=DataLoader(batches(20), batch_size=None),
                val_dataloaders=DataLoader(batches(1), batch_size=None) if validate else None)
    return logger


def flops_per_token() -> float:
    return training_flops_per_token(ModelConfig(vocab_size=VOCAB, n_layer=2, d_model=32, n_head=2, d_mlp=64,
                                                max_seq_len=CONTEXT), CONTEXT)


def test_tokens_tflops_and_mfu_under_gradient_accumulation():
    callback = ThroughputCallback(every_n_steps=2, peak_tflops=0.5)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*MFU not reported.*")  # a given peak: no warning
        logger = fit(callback)
    # 4 optimizer steps × 2 micro-batches × 2 rows × 32 tokens; logged at steps 2 and 4
    assert callback.tokens == 4 * 2 * ROWS * CONTEXT == 512
    assert logger.series("throughput/tokens") == [(2, 256.0), (4, 512.0)]
    tflops = dict(logger.series("throughput/tflops_per_s"))
    mfu = dict(logger.series("throughput/mfu"))
    assert sorted(tflops) == sorted(mfu) == [2, 4]
    for step in (2, 4):
        assert 0 < tflops[step] < 10  # a CPU
        assert mfu[step] == pytest.approx(tflops[step] / 0.5)
    assert not logger.series("throughput/peak_memory_gib")  # CPU: no GPU memory to report


def test_the_window_is_train_tokens_per_s():
    """every_n_steps None: the trainer's log_every_n_steps, the window of LanguageModel's train/tokens_per_s, so the
    FLOP rate is that tokens/s times the FLOPs per token (the hooks run microseconds apart); validation (after steps
    2, 4 and 6) is left out of both windows."""
    callback = ThroughputCallback(peak_tflops=1.0)
    logger = fit(callback, max_steps=6, log_every_n_steps=3, validate=True)
    assert len(logger.series("val/loss")) == 3
    tokens_per_s = [value for _, value in logger.series("train/tokens_per_s")]
    tflops = [value for _, value in logger.series("throughput/tflops_per_s")]
    assert [step for step, _ in logger.series("throughput/tflops_per_s")] == [3, 6]
    assert len(tokens_per_s) == len(tflops) == 2
    for rate, achieved in zip(tokens_per_s, tflops):
        assert achieved * 1e12 == pytest.approx(rate * flops_per_token(), rel=0.05)
    assert not logger.series("throughput/tokens_per_s")  # tokens/s is logged once, by the module


def test_unknown_device_warns_once_and_reports_no_mfu():
    callback = ThroughputCallback(every_n_steps=2)
    with pytest.warns(UserWarning, match=r"unknown device 'cpu'.*MFU not reported, pass peak_tflops") as record:
        logger = fit(callback)
    assert sum("MFU not reported" in str(w.message) for w in record) == 1
    assert callback.device_peak_tflops is None
    assert len(logger.series("throughput/tflops_per_s")) == 2 and not logger.series("throughput/mfu")


class FakeTrainer:
    def __init__(self):
        self.strategy = type("Strategy", (), {"root_device": torch.device("cuda", 0)})()


@pytest.mark.parametrize("name, peak", [("NVIDIA H200", 989.5), ("NVIDIA A100-SXM4-80GB", 312.0),
                                        ("NVIDIA H100 NVL", None), ("Some Future GPU", None)])
def test_the_peak_comes_from_the_device_name_or_the_override(monkeypatch, name, peak):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    callback = ThroughputCallback()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        callback.setup(FakeTrainer(), None, "fit")
        callback.setup(FakeTrainer(), None, "fit")  # a second fit of the same callback: no second warning
    assert callback.device_peak_tflops == peak
    assert sum("MFU not reported" in str(w.message) for w in record) == (0 if peak else 1)
    override = ThroughputCallback(peak_tflops=123.0)
    override.setup(FakeTrainer(), None, "fit")
    assert override.device_peak_tflops == 123.0


def test_bad_arguments_and_resume_state():
    with pytest.raises(ValueError, match="every_n_steps"):
        ThroughputCallback(every_n_steps=0)
    with pytest.raises(ValueError, match="peak_tflops"):
        ThroughputCallback(peak_tflops=0)
    callback = ThroughputCallback()
    callback.tokens = 1234
    resumed = ThroughputCallback()
    resumed.load_state_dict(callback.state_dict())
    assert resumed.tokens == 1234
