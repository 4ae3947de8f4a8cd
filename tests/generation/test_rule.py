"""The eviction rule (``fpa_lightning.generation.rule``): one check of a prune threshold that every entry point uses,
one check of a rule against a model, the newest key always kept, and the import direction generation <- analysis."""
import ast
import math
import pathlib

import pytest
import torch

from fpa_lightning.generation import DecodeSession, GenerationConfig, PruneRule, generate
from fpa_lightning.generation.rule import KeptStats, PruningHook, check_rule, check_threshold, threshold_rule
from modules.evaluation.tasks.passkey import pruning_rules

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "fpa_lightning"


@pytest.fixture(scope="module")
def fpa(make_decoder):
    return make_decoder(backend="fpa")


def entry_points(decoder):
    """Every way a user hands over a prune threshold, as a function of it."""
    from fpa_lightning.hf import FPACache, FPAConfig, FPAForCausalLM

    hf_model = FPAForCausalLM(FPAConfig.from_model_config(decoder.cfg, bos_token_id=1, eos_token_id=None)).eval()
    prompt = torch.tensor([[1, 2, 3]])
    return {
        "PruneRule": lambda t: PruneRule(threshold=t),
        "GenerationConfig": lambda t: GenerationConfig(prune_threshold=t),
        "generate": lambda t: generate(decoder, prompt, 2, prune_threshold=t),
        "FPACache": lambda t: FPACache(decoder, prune_threshold=t),
        "FPAForCausalLM.generate": lambda t: hf_model.generate(prompt, max_new_tokens=2, do_sample=False,
                                                               prune_threshold=t),
        "eval passkey": lambda t: pruning_rules([], t, None),
    }


@pytest.mark.parametrize("bad, message", [
    (0.5, "prune_threshold must be <= 0: every bias is <= 0, so 0.5 would drop every key but the newest"),
    (float("nan"), "prune_threshold must be a number <= 0 (or -inf, or None), got nan"),
    ("-10", "prune_threshold must be a number <= 0 (or -inf, or None), got '-10'"),
    (True, "prune_threshold must be a number <= 0 (or -inf, or None), got True"),
])
def test_a_bad_threshold_gives_the_same_error_from_every_entry_point(fpa, bad, message):
    with pytest.raises(ValueError) as err:
        check_threshold(bad)
    assert str(err.value) == message
    for name, entry in entry_points(fpa).items():
        with pytest.raises(ValueError) as err:
            entry(bad)
        assert str(err.value) == message, name


def test_good_thresholds_pass_as_floats():
    assert check_threshold(None) is None
    assert check_threshold(-10) == -10.0 and isinstance(check_threshold(-10), float)
    assert check_threshold(0) == 0.0 and check_threshold(float("-inf")) == float("-inf")
    assert PruneRule(threshold=-3).threshold == -3.0
    assert GenerationConfig(prune_threshold=-10).prune_threshold == -10.0
    assert threshold_rule(None) is None and threshold_rule(float("-inf")) is None  # nothing to evict: no rule
    assert threshold_rule(-2) == PruneRule(threshold=-2.0)


def test_rule_needs_exactly_one_setting():
    with pytest.raises(ValueError, match="exactly one"):
        PruneRule()
    with pytest.raises(ValueError, match="exactly one"):
        PruneRule(threshold=-10.0, window=5)
    with pytest.raises(ValueError, match="window must be >= 1"):
        PruneRule(window=0)


def test_the_model_checks_are_one_function(make_decoder, fpa):
    """check_rule holds the checks that depend on the model; DecodeSession (so generate and FPACache) runs it."""
    sdpa, shared_alibi = make_decoder(backend="sdpa"), make_decoder(backend="selective", positional="alibi")
    threshold = PruneRule(threshold=-1.0)
    for decoder, message in [(sdpa, "prune_threshold needs an attention bias"), (shared_alibi, "no cache form")]:
        with pytest.raises(ValueError, match=message):
            check_rule(decoder, threshold)
        with pytest.raises(ValueError, match=message):
            DecodeSession(decoder, rule=threshold)
        with pytest.raises(ValueError, match=message):
            generate(decoder, torch.tensor([[1, 2]]), 2, prune_threshold=-1.0)
    for decoder in (sdpa, shared_alibi, fpa):  # a window fits every model; −inf evicts nothing anywhere
        check_rule(decoder, PruneRule(window=4))
        check_rule(decoder, PruneRule(threshold=float("-inf")))
        check_rule(decoder, None)
    assert not PruneRule(threshold=float("-inf")).can_evict() and PruneRule(threshold=-1e9).can_evict()
    assert generate(sdpa, torch.tensor([[1, 2]]), 2, prune_threshold=float("-inf")).shape == (1, 4)


def test_the_newest_key_survives_a_rule_that_rejects_it():
    """A bias below the threshold everywhere, the diagonal included: each query keeps exactly its own key."""
    n = 5
    rows = keys = torch.arange(n)
    bias = torch.full((1, 2, n, n), -5.0)
    stats = KeptStats.empty(1)
    masked, evicted = PruningHook(PruneRule(threshold=-1.0), stats, 0)(bias, rows, keys, None)
    assert torch.equal(torch.isfinite(masked[0, 0]), torch.eye(n, dtype=torch.bool))
    assert int(stats.kept_pairs[0]) == 2 * n and int(stats.causal_pairs[0]) == 2 * n * (n + 1) // 2
    assert math.isclose(stats.mean_fraction(), sum(1 / (t + 1) for t in range(n)) / n)
    assert evicted.shape == (1, 2, n) and bool(evicted[..., :-1].all())


def module_imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_generation_never_imports_analysis_or_evaluation():
    """One direction: analysis (the simulation) and evaluation import the decoding runtime, never the reverse."""
    upward = [f"{path.name} imports {name}" for path in sorted((PACKAGE / "generation").rglob("*.py"))
              for name in sorted(module_imports(path))
              if name.startswith(("fpa_lightning.analysis", "fpa_lightning.evaluation"))]
    assert upward == []
    assert "fpa_lightning.generation.rule" in module_imports(PACKAGE / "analysis" / "pruning.py")

