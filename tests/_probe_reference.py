"""Shared by the probe tests in tests/probes and tests/evaluation (tests/ is on sys.path through tests/conftest.py):
the independent single-model accuracy that the library's ensemble accuracy is checked against."""
import torch


def held_out_accuracy(model: torch.nn.Module, probe, n: int) -> float:
    """The reference: one trained seed alone on the held-out sequences (generator seed 2, docs/probes.md), the
    fraction of scored positions (label != -1) whose argmax class is the label."""
    test = probe.sample(n, torch.Generator().manual_seed(2))
    with torch.no_grad():
        predicted = model(test.tokens).argmax(-1)  # (N, T)
    scored = test.labels != -1
    return (predicted[scored] == test.labels[scored]).double().mean().item()
