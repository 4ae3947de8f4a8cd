"""LanguageModel: optimizer groups, LR schedule, learning on a fixed batch, recorded attention impls, checkpoints."""
import math

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from fpa_lightning import AttentionConfig, ModelConfig
from fpa_lightning.attention.backends import FpaBackend
from fpa_lightning.ops.kernel_inputs import interpreting
from modules import LanguageModel, OptimConfig
from modules.optim import fused_adamw_applies, lr_factor

VOCAB = 97


def tiny_config(backend: str = "fpa", impl: str = "chunked", n_layer: int = 2, **attention) -> ModelConfig:
    return ModelConfig(vocab_size=VOCAB, n_layer=n_layer, d_model=32, n_head=2, d_mlp=64, max_seq_len=32,
                       attention=AttentionConfig(backend=backend, impl=impl, block_size=8, **attention))


def fixed_batch_loader(steps: int, batch: int = 4, seq_len: int = 32) -> DataLoader:
    """The same random batch ``steps`` times (batch_size=None: items are whole batches)."""
    tokens = torch.randint(0, VOCAB, (batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    item = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}
    return DataLoader([item] * steps, batch_size=None)


class LossRecorder(L.Callback):
    def __init__(self):
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(outputs["loss"].item())


def fit(lm: LanguageModel, steps: int, tmp_path, batch: int = 4, **trainer_kwargs) -> tuple[L.Trainer, LossRecorder]:
    recorder = LossRecorder()
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=CSVLogger(tmp_path),
                        callbacks=[recorder], enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, log_every_n_steps=1, **trainer_kwargs)
    trainer.fit(lm, train_dataloaders=fixed_batch_loader(steps, batch))
    return trainer, recorder


def configured_optimizer(lm: LanguageModel, max_steps: int):
    lm.trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", logger=False)
    config = lm.configure_optimizers()
    return config["optimizer"], config["lr_scheduler"]["scheduler"]


@pytest.mark.parametrize("backend", ["fpa", "fox", "dcp"])
@pytest.mark.parametrize("flat", [False, True], ids=["plain", "fsdp-like-1d-shards"])
def test_weight_decay_only_on_block_matrices(backend, flat):
    lm = LanguageModel(tiny_config(backend))
    if flat:  # FSDP (use_orig_params) hands the optimizer 1-D views of each rank's shard: the split must not change
        for p in lm.parameters():
            p.data = p.data.reshape(-1)
    optimizer, _ = configured_optimizer(lm, 10)
    decay, no_decay = optimizer.param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    names = {id(p): n for n, p in lm.model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    matrices = ("attn.qkv.weight", "attn.out.weight", "mlp.gate_up.weight", "mlp.down.weight")
    assert decayed == {f"blocks.{i}.{m}" for i in range(2) for m in matrices}
    not_decayed = {names[id(p)] for p in no_decay["params"]}
    assert "embed.weight" in not_decayed  # tied with lm_head: listed once
    assert any(".attn.backend." in n for n in not_decayed)
    assert all(".norm" in n or "norm." in n or ".backend." in n or n == "embed.weight" for n in not_decayed)
    assert sum(p.numel() for g in optimizer.param_groups for p in g["params"]) == lm.model.num_parameters()


def test_lr_schedule_warmup_then_cosine_to_min():
    warmup, total, floor = 10, 110, 0.1
    assert lr_factor(0, warmup, total, floor) == pytest.approx(0.1)
    assert lr_factor(4, warmup, total, floor) == pytest.approx(0.5)
    assert lr_factor(warmup - 1, warmup, total, floor) == 1.0
    assert lr_factor(warmup, warmup, total, floor) == 1.0
    assert lr_factor(60, warmup, total, floor) == pytest.approx((1 + floor) / 2)  # half-way through the cosine
    assert lr_factor(total, warmup, total, floor) == pytest.approx(floor)
    assert lr_factor(total + 50, warmup, total, floor) == pytest.approx(floor)


def test_scheduler_drives_every_group_lr():
    lm = LanguageModel(tiny_config(), OptimConfig(lr=2e-3, warmup_steps=4, min_lr_ratio=0.25))
    optimizer, scheduler = configured_optimizer(lm, 20)
    seen = []
    for _ in range(21):
        seen.append([g["lr"] for g in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    assert seen[0] == [pytest.approx(2e-3 / 4)] * 2
    assert seen[3] == [pytest.approx(2e-3)] * 2
    assert seen[20] == [pytest.approx(2e-3 * 0.25)] * 2


def test_optim_config_rejects_bad_values():
    for bad in ({"lr": 0}, {"betas": (0.9, 1.0)}, {"warmup_steps": -1}, {"min_lr_ratio": 1.5}, {"weight_decay": -0.1}):
        with pytest.raises(ValueError, match="optim."):
            OptimConfig(**bad)


def test_steps_reduce_loss_and_the_run_records_the_impl(tmp_path):
    torch.manual_seed(0)
    lm = LanguageModel(tiny_config(impl="naive", bias_layers=[1]), OptimConfig(lr=3e-3, warmup_steps=2))
    trainer, recorder = fit(lm, 25, tmp_path)
    assert recorder.losses[0] == pytest.approx(math.log(VOCAB), abs=0.3)  # near uniform at initialisation
    assert recorder.losses[-1] < recorder.losses[0] - 1.0
    # Layer 0 has no FPA bias (bias_layers=[1]): plain softmax there, FPA's naive path in layer 1.
    assert lm.hparams["attention_impls"] == ["softmax:naive", "fpa:naive"]
    logged = yaml.safe_load((tmp_path / "lightning_logs" / "version_0" / "hparams.yaml").read_text())
    assert logged["attention_impls"] == ["softmax:naive", "fpa:naive"]
    assert logged["model"]["attention"]["bias_layers"] == [1]


def test_fused_on_cpu_fails_before_the_first_step(tmp_path):
    lm = LanguageModel(tiny_config(impl="fused"))
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        fit(lm, 2, tmp_path)
    assert lm.trainer.global_step == 0


def test_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    lm = LanguageModel(tiny_config("fox"), OptimConfig(lr=3e-3, warmup_steps=2))
    trainer, _ = fit(lm, 3, tmp_path)
    path = tmp_path / "model.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)
    assert saved["attention_impls"] == ["fox:chunked", "fox:chunked"]
    assert "attention_impls" not in saved["hyper_parameters"]  # not a constructor argument (LightningCLI resume)
    loaded = LanguageModel.load_from_checkpoint(path, map_location="cpu")  # hparams are plain dicts
    assert loaded.model.cfg == lm.model.cfg and loaded.optim == lm.optim
    inputs = torch.randint(0, VOCAB, (2, 32))
    lm.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.equal(loaded(inputs), lm(inputs))


class FusedOnCpu(LanguageModel):
    """Fused AdamW as on a GPU (torch's fused AdamW also runs on the CPU), recording the gradient norm after
    clipping, to exercise the bf16-mixed path of the 110M configs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.clipped_norms: list[float] = []

    def use_fused_adamw(self) -> bool:
        return True

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        grads = [p.grad.float().norm() for p in self.parameters() if p.grad is not None]
        self.clipped_norms.append(torch.stack(grads).norm().item())


def test_fused_adamw_with_bf16_mixed_clips_gradients(tmp_path):
    """Lightning refuses to clip for a fused optimizer under mixed precision; the 110M configs use exactly that
    (bf16-mixed, fused AdamW, clipping 1.0), so LanguageModel clips itself. The norm must come out at the bound."""
    lm = FusedOnCpu(tiny_config(), OptimConfig(warmup_steps=1))
    trainer = L.Trainer(max_steps=3, accelerator="cpu", devices=1, precision="bf16-mixed", gradient_clip_val=1e-3,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(lm, train_dataloaders=fixed_batch_loader(3))
    assert trainer.optimizers[0].defaults["fused"]
    assert len(lm.clipped_norms) == 3 and max(lm.clipped_norms) <= 1e-3 * (1 + 1e-3)


def test_fused_adamw_only_on_cuda_without_fp16_scaling():
    assert fused_adamw_applies("cuda", "bf16-mixed") and fused_adamw_applies("cuda", "32-true")
    assert not fused_adamw_applies("cuda", "16-mixed")
    assert not fused_adamw_applies("cpu", "bf16-mixed")


def test_compile_smoke_same_losses_and_no_graph_break(tmp_path):
    """``compile`` compiles every block (here with the graph-capture-only "eager" backend and fullgraph=True, so a
    graph break inside a block fails); the steps give the uncompiled model's losses. Inductor runs on the GPU
    (benchmarks/train_throughput.py --variants compile)."""
    losses = []
    for compile_options in (False, {"backend": "eager", "fullgraph": True}):
        torch.manual_seed(0)
        lm = LanguageModel(tiny_config(), OptimConfig(warmup_steps=1), compile=compile_options)
        _, recorder = fit(lm, 2, tmp_path)
        losses.append(recorder.losses)
    assert all(getattr(block, "_compiled_call_impl", None) is not None for block in lm.model.blocks)
    assert lm.hparams["compile"] == {"backend": "eager", "fullgraph": True}
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)


@pytest.mark.skipif(not interpreting(), reason="runs the fused op on a CPU, through the Triton interpreter")
def test_compiled_blocks_hold_fpas_fused_op_in_one_graph(tmp_path, monkeypatch):
    """With the fused FPA op (the Triton interpreter on a CPU) each compiled block is one graph, attention included
    (fullgraph=True: a graph break fails; AOTAutograd traces the forward and backward custom ops through their fake
    implementations), and two steps give the uncompiled model's losses exactly: the same kernels run. One layer and
    one row: the interpreter takes seconds a launch."""
    monkeypatch.setattr(FpaBackend, "fused_needs_cuda", False)  # the interpreter stands in for CUDA
    losses = []
    for compile_options in (False, {"backend": "aot_eager", "fullgraph": True}):
        torch.manual_seed(0)
        lm = LanguageModel(tiny_config(impl="fused", n_layer=1), OptimConfig(warmup_steps=1), compile=compile_options)
        _, recorder = fit(lm, 2, tmp_path, batch=1)
        losses.append(recorder.losses)
    assert lm.model.attention_impls("cpu") == ["fpa:fused"]
    assert losses[1] == losses[0]


def test_auto_falls_back_loudly_once_naming_the_layer(tmp_path):
    lm = LanguageModel(tiny_config(impl="auto", bias_layers=[1]))
    with pytest.warns(UserWarning, match=r"impl='auto' falls back to the slower chunked path in layer\(s\) \[1\] "
                                         r"\(fpa\): the fused path needs a CUDA GPU, the run is on cpu"):
        fit(lm, 1, tmp_path)
    assert lm.model.attention_fallbacks("cuda") == []
    odd_dim = LanguageModel(ModelConfig(vocab_size=VOCAB, n_layer=2, d_model=24, n_head=2, d_mlp=64,
                                        attention=AttentionConfig(impl="auto")))  # head dim 12: no kernel
    assert odd_dim.model.attention_fallbacks("cuda") == [
        "attention.impl='auto' falls back to the slower chunked path in layer(s) [0, 1] (fpa): the Triton kernel "
        "supports head dims (16, 32, 64, 128), got 12"]
    assert LanguageModel(tiny_config(impl="chunked")).model.attention_fallbacks("cpu") == []  # asked for


def test_batches_segment_ids_reach_attention_under_document_mask():
    """With attention.document_mask the module's loss is that of the documents run one by one."""
    torch.manual_seed(0)
    lm = LanguageModel(tiny_config(document_mask=True))
    tokens = torch.randint(0, VOCAB, (1, 33), generator=torch.Generator().manual_seed(1))
    segment_ids = (torch.arange(32) >= 20).long()[None]
    batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:], "segment_ids": segment_ids}
    with torch.no_grad():
        packed = lm.token_losses(batch)
        second = lm.model.token_losses(tokens[:, 20:32], tokens[:, 21:33])
    torch.testing.assert_close(packed[:, 20:], second, rtol=1e-5, atol=1e-5)


def test_compiled_blocks_take_float32_gate_gradients_under_bf16_autocast():
    """A compiled block's backward runs outside autocast as eager's does (``compile_blocks`` turns AOTAutograd's
    backward autocast off): the FPA gate maps, float32 inside a bf16 forward, get the same gradients compiled and
    eager; with the backward traced under the forward's autocast they came out at bf16 precision."""
    grads = []
    for compile_options in (False, {"backend": "aot_eager"}):
        torch.manual_seed(0)
        lm = LanguageModel(tiny_config(n_layer=1), OptimConfig(warmup_steps=1), compile=compile_options)
        lm.configure_model()
        with torch.no_grad():  # a trained-like gate, not the all-zero start
            for block in lm.model.blocks:
                block.attn.backend.gate.weight.normal_(std=0.3)
        ids = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = lm(ids)
        logits.float().square().mean().backward()
        grads.append([block.attn.backend.gate.weight.grad for block in lm.model.blocks])
    for got, want in zip(*grads[::-1]):
        assert got.dtype == torch.float32
        # float32 reordering only (bf16 rounding gave relative errors of 1e-2)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


def test_the_probe_path_runs_compiled_blocks_eagerly():
    """``Decoder.probe`` (float32, no grad) compiles nothing where the blocks are compiled: it would compile every
    block again for its own precision and grad mode (minutes at 1 × 16384 on a GPU). A counting backend shows
    the training forward does compile, the probe does not, and the probe's fields are the eager model's."""
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.manual_seed(0)
    lm = LanguageModel(tiny_config(), OptimConfig(warmup_steps=1), compile={"backend": counting_backend})
    lm.configure_model()
    ids = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        eager = [probe.ingredients for probe in lm.model.probe(ids)]
    assert graphs == [], "the probe path compiled a block"
    lm(ids)
    assert graphs, "the blocks were not compiled: the test checks nothing"
    with torch.no_grad():
        again = [probe.ingredients for probe in lm.model.probe(ids)]
    for want, got in zip(eager, again):
        for name in want:
            torch.testing.assert_close(got[name], want[name], rtol=0, atol=0)
