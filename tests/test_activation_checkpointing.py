"""Activation checkpointing (``ModelConfig.activation_checkpointing``): off by default; on, the training forward
recomputes every Block in the backward and gives the same loss and the same gradient of every parameter, bit for bit
in float32 on the CPU (the recomputation runs the same ops in the same order); the probe path, evaluation and no-grad
forwards never checkpoint; a block a strategy already wraps is never checkpointed twice; under FSDP the strategy gets
the checkpointing policy (modules/scaling.py)."""
from types import SimpleNamespace

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from fpa_lightning import AttentionConfig, Decoder, ModelConfig
from fpa_lightning.model import Block

VOCAB, T = 50, 24


def tiny(backend: str, checkpointing: bool) -> Decoder:
    torch.manual_seed(0)  # the same weights with and without
    cfg = ModelConfig(vocab_size=VOCAB, n_layer=3, d_model=32, n_head=2, d_mlp=48, max_seq_len=T,
                      attention=AttentionConfig(backend=backend, impl="chunked", block_size=8),
                      activation_checkpointing=checkpointing)
    return Decoder(cfg)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (2, T + 1), generator=torch.Generator().manual_seed(1))
    return ids[:, :-1], ids[:, 1:]


def count_block_forwards(model: Decoder) -> list[int]:
    """Per Block, how many times its forward runs (a recomputation runs it again)."""
    calls = []
    for block in (m for m in model.modules() if isinstance(m, Block)):
        calls.append(0)
        block.register_forward_pre_hook(lambda module, args, i=len(calls) - 1: calls.__setitem__(i, calls[i] + 1))
    return calls


def loss_and_grads(model: Decoder) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    input_ids, labels = batch()
    loss = model.token_losses(input_ids, labels).mean()
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_off_by_default():
    assert ModelConfig().activation_checkpointing is False
    model = tiny("fpa", checkpointing=False)
    calls = count_block_forwards(model)
    loss_and_grads(model)
    assert calls == [1, 1, 1]  # each block once: nothing recomputed


@pytest.mark.parametrize("backend", ["fpa", "fox"])
def test_same_loss_and_every_gradient_bit_for_bit(backend):
    plain, checkpointed = tiny(backend, False), tiny(backend, True)
    calls = count_block_forwards(checkpointed)
    loss, grads = loss_and_grads(plain)
    loss_ckpt, grads_ckpt = loss_and_grads(checkpointed)
    assert calls == [2, 2, 2]  # the forward, then the recomputation in the backward: checkpointing did run
    assert torch.equal(loss, loss_ckpt)
    assert grads.keys() == grads_ckpt.keys() and len(grads) > 10
    for name in grads:
        assert torch.equal(grads[name], grads_ckpt[name]), name
    assert any(g.abs().sum() > 0 for name, g in grads.items() if ".backend." in name)  # the gates get gradients


def test_probe_eval_and_no_grad_never_checkpoint():
    model = tiny("fpa", True)
    calls = count_block_forwards(model)
    input_ids, labels = batch()
    model.probe(input_ids)  # the explicit statistics path (no grad)
    with torch.no_grad():
        model.token_losses(input_ids, labels)
    model.eval()
    model.token_losses(input_ids, labels).mean().backward()  # evaluation mode, even with grad
    assert calls == [3, 3, 3]


def test_a_block_wrapped_by_a_strategy_is_not_checkpointed_twice():
    """As FSDP's policy leaves it (CheckpointWrapper(Block) in each unit): the Decoder's own checkpointing skips it."""
    plain, wrapped = tiny("fpa", False), tiny("fpa", True)
    apply_activation_checkpointing(wrapped, auto_wrap_policy=ModuleWrapPolicy({Block}))
    assert not any(isinstance(block, Block) for block in wrapped.blocks)
    calls = count_block_forwards(wrapped)
    loss, grads = loss_and_grads(plain)
    loss_w, grads_w = loss_and_grads(wrapped)
    assert calls == [2, 2, 2]  # nested checkpoints would run each block three times
    assert torch.equal(loss, loss_w)
    # the wrapper puts "_checkpoint_wrapped_module." into the names; the parameters keep their order
    assert [g.shape for g in grads.values()] == [g.shape for g in grads_w.values()]
    for (name, grad), grad_w in zip(grads.items(), grads_w.values()):
        assert torch.equal(grad, grad_w), name


@pytest.mark.parametrize("checkpointing", [False, True])
def test_fsdp_strategy_gets_the_block_checkpointing_policy(checkpointing):
    from lightning.pytorch.strategies import FSDPStrategy

    from modules import scaling

    strategy = FSDPStrategy()
    with torch.device("meta"):
        module = SimpleNamespace(model=Decoder(ModelConfig(n_layer=2, d_model=64, n_head=1, d_mlp=64, vocab_size=10,
                                                           activation_checkpointing=checkpointing)))
    scaling.shard_by_block(SimpleNamespace(strategy=strategy, lightning_module=module))
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {Block}
    if checkpointing:
        assert strategy._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {Block}
    else:
        assert strategy._activation_checkpointing_kwargs == {}
    # a policy of the user's own is kept
    own = FSDPStrategy(activation_checkpointing_policy={torch.nn.Linear})
    scaling.shard_by_block(SimpleNamespace(strategy=own, lightning_module=module))
    assert own._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {torch.nn.Linear}
