"""The probe model and the seed ensemble: each seed of an ensemble computes exactly what the same model computes
alone (also for the layer-shared backends and a multi-layer model without layer-1 bias), seeds do not depend on
which other seeds run beside them, and the model is bounded as documented (q, k, v of width d, no MLP)."""
import pytest
import torch

from _probe_reference import held_out_accuracy
from fpa_lightning.probes.ladder import Ladder
from fpa_lightning.probes.model import SeedEnsemble, Shape, variant
from fpa_lightning.probes.train import Budget, make_model, per_seed_loss, runs_under_vmap, train_row

PROBE = Ladder(r=6)


@pytest.mark.parametrize("backend,shape", [
    ("fpa", Shape(heads=2, head_dim=4, width=16)),
    ("selective", Shape(heads=2, head_dim=4, width=16)),
    ("dcp", Shape(heads=2, head_dim=2, width=16)),
    ("sdpa", Shape(heads=1, head_dim=4, width=16)),
    ("fpa_nobias1", Shape(heads=1, head_dim=4, layers=2, width=16)),
    ("fpa_nobias1_rope", Shape(heads=1, head_dim=4, layers=2, width=16)),
])
def test_each_seed_computes_what_its_model_computes_alone(backend, shape):
    ensemble = SeedEnsemble(lambda: make_model(PROBE, variant(backend), shape), seeds=[3, 4, 5])
    tokens = PROBE.sample(6, torch.Generator().manual_seed(0)).tokens
    together = ensemble(tokens.expand(3, -1, -1))  # (E, B, T, K)
    for i in range(3):
        alone = ensemble.member(i)(tokens)
        torch.testing.assert_close(together[i], alone, atol=1e-5, rtol=1e-5)
    # a seed's initialisation does not depend on its company
    single = SeedEnsemble(lambda: make_model(PROBE, variant(backend), shape), seeds=[4])
    torch.testing.assert_close(single(tokens[None])[0], together[1], atol=1e-5, rtol=1e-5)


def test_gradients_stay_within_their_seed():
    ensemble = SeedEnsemble(lambda: make_model(PROBE, variant("selective"), Shape(heads=2, head_dim=4, width=8)),
                            seeds=[0, 1])
    batch = PROBE.sample(4, torch.Generator().manual_seed(0))
    tokens, labels = batch.tokens.expand(2, -1, -1), batch.labels.expand(2, -1, -1)
    per_seed_loss(ensemble(tokens), labels)[0].backward()  # seed 0's loss only
    for stacked in ensemble.stacked:
        assert stacked.grad[1].abs().max() == 0


def test_weight_decay_spares_the_backend_gate_maps():
    ensemble = SeedEnsemble(lambda: make_model(PROBE, variant("fpa"), Shape(width=8)), seeds=[0, 1])
    decayed, spared = ensemble.decay_groups(0.5)
    assert decayed["weight_decay"] == 0.5 and spared["weight_decay"] == 0.0
    spared_names = {n for n, p in zip(ensemble.names, ensemble.stacked) if any(p is q for q in spared["params"])}
    assert spared_names == {"layers.0.backend.gate.weight", "layers.0.backend.gate.bias", "layers.0.backend.beta_raw"}
    assert len(decayed["params"]) + len(spared["params"]) == len(ensemble.names)


def test_the_model_is_bounded():
    model = make_model(PROBE, variant("fpa"), Shape(heads=1, head_dim=4, width=32))
    layer = model.layers[0]
    assert layer.qkv.weight.shape == (3 * 4, 32) and layer.out.weight.shape == (32, 4)
    assert not any(isinstance(m, (torch.nn.GELU, torch.nn.LayerNorm)) or "mlp" in name
                   for name, m in model.named_modules())
    assert model.position is None
    assert layer.backend.cfg.impl == "naive"
    with pytest.raises(ValueError, match="at least 2 layers"):
        make_model(PROBE, variant("fpa_nobias1"), Shape())


def test_a_row_trains_and_learns_on_cpu():
    budget = Budget(steps=60, batch=32, lr=3e-2, test=256)
    probe = Ladder(r=5)  # 128 sequences, 32 held out (train.in_held_out); r = 3 has 16, of which 2 are held out
    run = train_row(probe, variant("sdpa"), Shape(width=16), [0, 1], budget, torch.device("cpu"))
    assert len(run.accuracies) == 2
    for i, accuracy in enumerate(run.accuracies):  # each seed's recorded accuracy, recomputed from its model alone
        assert accuracy == pytest.approx(held_out_accuracy(run.ensemble.member(i), probe, 256), abs=1e-12)
    assert max(run.final_loss) < 0.69  # below chance (ln 2): it learned something in 60 steps
    assert min(run.accuracies) > 0.6  # and scores above chance on sequences it never saw


def test_optional_positions_mlp_and_norm():
    """Shape(positions, mlp, norm) adds a learned position embedding, a GELU MLP and pre-norms; each is used."""
    shape = Shape(heads=1, head_dim=4, width=16, layers=2, positions=12, mlp=24, norm=True)
    model = make_model(PROBE, variant("nope"), shape)
    assert model.position.weight.shape == (12, 16) and len(model.mlps) == 2
    assert sum(isinstance(m, torch.nn.LayerNorm) for m in model.modules()) == 5  # 2 × (attention, MLP) + final
    tokens = torch.randint(0, PROBE.vocab_size, (3, 10))
    logits = model(tokens)
    logits.sum().backward()
    for name, p in model.named_parameters():  # every added part reaches the output
        if name.startswith(("position", "mlps", "attn_norms", "ffn_norms", "final_norm")):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    with torch.no_grad():  # NoPE + positions: the same token at two places now differs
        same = torch.full((1, 10), 1)
        out = model(same)
        assert not torch.allclose(out[0, 3], out[0, 7])
    with pytest.raises(ValueError, match="position embedding has 12 positions"):
        model(torch.randint(0, PROBE.vocab_size, (1, 13)))
    with pytest.raises(ValueError, match="mlp must be >= 0"):
        Shape(mlp=-1)


@pytest.mark.parametrize("backend", ["fpa", "sdpa", "fpa_nobias1"])
def test_seeds_one_after_another_compute_what_the_vmapped_ensemble_computes(backend):
    """SeedEnsemble(vmapped=False), the path of the groups with a fast implementation: the same outputs and the same
    gradients as the vmapped ensemble on the same parameters."""
    shape = Shape(heads=2, head_dim=4, layers=2, width=16)
    make = lambda: make_model(PROBE, variant(backend), shape)  # noqa: E731
    vmapped, looped = SeedEnsemble(make, seeds=[0, 1, 2]), SeedEnsemble(make, seeds=[0, 1, 2], vmapped=False)
    assert_same_outputs_and_gradients(vmapped, looped, PROBE.sample(5, torch.Generator().manual_seed(0)))


def assert_same_outputs_and_gradients(vmapped: SeedEnsemble, looped: SeedEnsemble, batch) -> None:
    """The two ensembles (same seeds, so the same parameters) give the same logits and parameter gradients."""
    device = vmapped.stacked[0].device
    tokens, labels = (t.to(device).expand(len(vmapped.seeds), -1, -1) for t in (batch.tokens, batch.labels))
    out_v, out_l = vmapped(tokens), looped(tokens)
    torch.testing.assert_close(out_l, out_v, atol=1e-5, rtol=1e-5)
    per_seed_loss(out_v, labels).sum().backward()
    per_seed_loss(out_l, labels).sum().backward()
    for a, b in zip(vmapped.stacked, looped.stacked):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-5)


def test_a_group_with_a_fast_implementation_trains_through_it():
    """Group.impl = "auto" (the MQAR paper regime): the models run the backend's fast path (on a CPU the chunked
    one), the seeds one after another, and the row trains."""
    from modules.probes.table import GROUPS
    group = next(g for g in GROUPS if g.label.startswith("mqar, paper regime, 2 layers, 32 pairs"))
    assert group.impl == "auto"
    run = train_row(PROBE, variant("fpa"), Shape(heads=2, head_dim=16, layers=2, width=32, mlp=32, norm=True), [0, 1],
                    Budget(steps=3, batch=4, pool=32, test=16), torch.device("cpu"), impl=group.impl)
    assert not run.ensemble.vmapped and len(run.accuracies) == 2
    layer = run.ensemble.template.layers[0]
    assert layer.backend.cfg.impl == "auto" and layer.backend.resolve_impl(torch.device("cpu")) != "naive"


@pytest.mark.parametrize("backend, impl, vmapped", [
    ("fpa", "naive", True), ("fox", "naive", True),  # the dense path always
    ("sdpa", "auto", False),  # SDPA, the fused path on any device, is not run under vmap
    ("fpa", "auto", False), ("fpa_nobias1", "auto", False),  # the chunked path on a CPU: seeds one after another
])
def test_seed_ensembles_vmap_only_implementations_that_can(backend, impl, vmapped):
    model = make_model(PROBE, variant(backend), Shape(heads=2, head_dim=16, layers=2, width=32), impl=impl)
    assert runs_under_vmap(model, torch.device("cpu")) is vmapped


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["fpa"])
def test_gpu_fused_ensemble_runs_under_vmap_and_equals_the_loop(backend):
    """On a GPU FPA runs its fused kernel under vmap (one launch for every seed): the same outputs and gradients as
    the seeds one after another through the same kernel. (SDPA is not vmapped: ``AttentionBackend.fused_vmappable``.)"""
    shape = Shape(heads=2, head_dim=32, layers=2, width=64, mlp=64, norm=True)
    make = lambda: make_model(PROBE, variant(backend), shape, impl="auto")  # noqa: E731
    vmapped, looped = SeedEnsemble(make, seeds=[0, 1, 2]).cuda(), SeedEnsemble(make, seeds=[0, 1, 2], vmapped=False).cuda()
    assert runs_under_vmap(vmapped.template, torch.device("cuda"))
    assert vmapped.template.layers[-1].backend.resolve_impl(torch.device("cuda")) == "fused"
    assert_same_outputs_and_gradients(vmapped, looped, PROBE.sample(64, torch.Generator().manual_seed(0)))
