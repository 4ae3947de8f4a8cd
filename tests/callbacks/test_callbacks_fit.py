"""Both callbacks in a tiny CPU fit; the event files are read back with TensorBoard's EventAccumulator."""
import math

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from torch.utils.data import DataLoader

from callbacks import HeadSurvivalCallback, LongContextLossCallback
from fpa_lightning.attention import AttentionConfig
from fpa_lightning.config import ModelConfig
from modules.language_model import LanguageModel, OptimConfig

VOCAB, CONTEXT = 64, 32
DOC_LENGTHS = (4 * CONTEXT + 1, 70)  # one document fills the 4-context window, one stops inside bucket 4


def batches(n: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (2, CONTEXT + 1), generator=g)
        segments = (torch.arange(CONTEXT) >= 12).long() + (torch.arange(CONTEXT) >= 25).long()  # starts at 12, 25
        out.append({"input_ids": ids[:, :-1], "labels": ids[:, 1:], "segment_ids": segments.expand(2, -1).clone()})
    return out


def documents() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, VOCAB, (n,), generator=g) for n in DOC_LENGTHS]


class TinyData(L.LightningDataModule):
    """The TextDataModule contract in miniature: loaders plus probe_batch and long_documents."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def train_dataloader(self):
        return DataLoader(batches(4, 0), batch_size=None)

    def val_dataloader(self):
        return DataLoader(batches(1, 1), batch_size=None)

    def probe_batch(self, n_rows, seq_len):
        self.calls.append(("probe_batch", n_rows, seq_len))
        return batches(1, 2)[0]

    def long_documents(self, split="test", max_tokens=None, min_tokens=0, limit=None):
        self.calls.append(("long_documents", split, max_tokens, min_tokens, limit))
        yield from (d[:max_tokens] for d in documents() if len(d) >= min_tokens)


def tiny_model(backend: str = "fpa") -> LanguageModel:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, n_layer=2, d_model=32, n_head=2, d_mlp=64, max_seq_len=CONTEXT,
                      attention=AttentionConfig(backend=backend, bias_layers=[1]))  # layer 0 has no bias
    return LanguageModel(cfg, OptimConfig(lr=3e-3, warmup_steps=1))


def fit(tmp_path, callbacks, backend: str = "fpa", **fit_kwargs) -> tuple[LanguageModel, TensorBoardLogger]:
    model = tiny_model(backend)
    logger = TensorBoardLogger(tmp_path, name="run")
    trainer = L.Trainer(max_steps=4, val_check_interval=2, limit_val_batches=1, logger=logger, callbacks=callbacks,
                        accelerator="cpu", enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, **fit_kwargs)
    return model, logger


def read_events(logger: TensorBoardLogger) -> EventAccumulator:
    logger.experiment.flush()
    acc = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0, "images": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_fit_logs_heads_and_long_context(tmp_path):
    data = TinyData()
    heads = HeadSurvivalCallback(every_n_steps=2)
    long_ctx = LongContextLossCallback(context_multiple=4, n_documents=2, min_tokens=2)
    model, logger = fit(tmp_path, [heads, long_ctx], datamodule=data)
    acc = read_events(logger)
    scalars = set(acc.Tags()["scalars"])

    # the datamodule contract: probe batch of the model's context, documents up to window + 1 tokens, fetched once
    assert data.calls == [("probe_batch", 2, CONTEXT), ("long_documents", "validation", 4 * CONTEXT + 1, 2, 2)]

    # heads/: only the layer with a bias; measured at steps 2 and 4, not in the sanity check, once per step
    for kind in ("alive_fraction", "nonsuffix_fraction", "beta", "walk/field_step_mean", "walk/level_step_std"):
        for h in (0, 1):
            assert f"heads/{kind}/layer_01/head_{h:02d}" in scalars
    assert not any("layer_00" in tag for tag in scalars)
    # val/loss of the same weights shares the step (Lightning alone logged it one step before, at 1 and 3)
    assert [e.step for e in acc.Scalars("val/loss")] == [2, 4]
    for h in (0, 1):
        events = acc.Scalars(f"heads/alive_fraction/layer_01/head_{h:02d}")
        assert [e.step for e in events] == [2, 4]
        assert all(0.0 <= e.value <= 1.0 for e in events)
        assert all(e.value > 0 for e in acc.Scalars(f"heads/beta/layer_01/head_{h:02d}"))
    assert [e.value for e in acc.Scalars("heads/summary/heads_with_bias")] == [2.0, 2.0]
    assert all(0.0 <= e.value <= 1.0 for e in acc.Scalars("heads/summary/median_alive_fraction"))
    assert all(e.value in (0.0, 1.0, 2.0) for e in acc.Scalars("heads/summary/nonsuffix_heads"))
    # what was logged is what the last measurement found
    last = heads.latest.layers[1].alive_fraction
    for h in (0, 1):
        assert acc.Scalars(f"heads/alive_fraction/layer_01/head_{h:02d}")[-1].value == pytest.approx(last[h].item())
    assert {"heads/hist/alive_fraction", "heads/hist/nonsuffix_fraction"} <= set(acc.Tags()["histograms"])
    assert {"heads/image/alive_fraction_map", "heads/image/example_bias",
            "long_context/image/loss_vs_position"} <= set(acc.Tags()["images"])

    # long_context/: bucket means of per-position losses, recomputed here from the final model (= step 4's)
    with torch.no_grad():
        losses = [model.model.token_losses(d[None, :-1], d[None, 1:])[0] for d in documents()]
    bucket = CONTEXT // 2
    for k in range(8):
        pieces = torch.cat([l[k * bucket : (k + 1) * bucket] for l in losses])
        events = acc.Scalars(f"long_context/loss/pos_{k * bucket:03d}")
        assert [e.step for e in events] == [2, 4]
        assert events[-1].value == pytest.approx(pieces.mean().item(), rel=1e-5)
    within = torch.cat([l[:CONTEXT] for l in losses]).mean().item()
    beyond = torch.cat([l[CONTEXT:] for l in losses]).mean().item()
    assert acc.Scalars("long_context/summary/within_context")[-1].value == pytest.approx(within, rel=1e-5)
    assert acc.Scalars("long_context/summary/beyond_context")[-1].value == pytest.approx(beyond, rel=1e-5)
    assert abs(within - math.log(VOCAB)) < 1.0  # a 4-step model on random tokens is near uniform

    # the custom layout groups the charts
    config = acc.Tensors("custom_scalars__config__")
    assert len(config) == 1
    layout = layout_pb2.Layout()
    layout.ParseFromString(config[0].tensor_proto.string_val[0])
    titles = {c.title for c in layout.category}
    assert {"heads: summary", "long context", "heads: alive fraction by layer"} <= titles


def test_explicit_batch_and_documents_without_a_datamodule(tmp_path):
    heads = HeadSurvivalCallback(every_n_steps=4, batch=batches(1, 2)[0], log_images=False)
    long_ctx = LongContextLossCallback(context_multiple=2, documents=documents(), log_image=False)
    _, logger = fit(tmp_path, [heads, long_ctx], train_dataloaders=DataLoader(batches(4, 0), batch_size=None),
                    val_dataloaders=DataLoader(batches(1, 1), batch_size=None))
    acc = read_events(logger)
    scalars = set(acc.Tags()["scalars"])
    assert "heads/summary/median_alive_fraction" in scalars
    assert {f"long_context/loss/pos_{s:02d}" for s in (0, 16, 32, 48)} <= scalars  # window 64, buckets of 16
    assert acc.Tags()["images"] == []


def test_a_softmax_model_trains_with_the_head_callback_which_says_it_is_off(tmp_path):
    # one config for every backend: sdpa has no bias to measure; the run must not fail at its first validation
    heads = HeadSurvivalCallback(every_n_steps=2)
    with pytest.warns(UserWarning, match="no attention layer of this model \\(sdpa\\) has a bias"):
        _, logger = fit(tmp_path, [heads], backend="sdpa", datamodule=TinyData())
    assert heads.latest is None
    assert not any(tag.startswith("heads/") for tag in read_events(logger).Tags()["scalars"])


@pytest.mark.parametrize("callback, message", [
    (HeadSurvivalCallback(every_n_steps=1), "needs a probe batch"),
    (LongContextLossCallback(), "needs documents"),
])
def test_missing_inputs_raise_a_clear_error(tmp_path, callback, message):
    with pytest.raises(RuntimeError, match=message):
        fit(tmp_path, [callback], train_dataloaders=DataLoader(batches(4, 0), batch_size=None),
            val_dataloaders=DataLoader(batches(1, 1), batch_size=None))


def test_long_context_documents_from_a_data_module_of_its_own(tmp_path):
    """E.g. PG-19 books from a local folder instead of the training run's validation split."""
    import json

    from datamodules import TextDataModule

    books = tmp_path / "books"
    books.mkdir()
    text = " ".join(f"word{i % 50}" for i in range(400))
    (books / "test.jsonl").write_text("\n".join(json.dumps({"text": text}) for _ in range(3)))
    callback = LongContextLossCallback(context_multiple=2, n_documents=2, split="test",
                                       data=TextDataModule(source=str(books), num_workers=0))
    documents = callback._load_documents(trainer=None, context=16, window=32)
    assert len(documents) == 2 and all(len(d) == 33 for d in documents)
