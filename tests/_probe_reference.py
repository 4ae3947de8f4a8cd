"""Shared by the probe tests in tests/probes and tests/evaluation (tests/ is on sys.path through tests/conftest.py):
the independent single-model accuracy that the library's ensemble accuracy is checked against."""
import torch

from fpa_lightning.probes.train import held_out_set


def held_out_accuracy(model: torch.nn.Module, probe, n: int) -> float:
    """The reference: one trained seed alone on the row's held-out sequences (``train.held_out_set``: generator seed
    2, the held-out part of the sequence space; docs/probes.md), the fraction of scored positions (label != -1)
    whose argmax class is the label."""
    test = held_out_set(probe, n)
    with torch.no_grad():
        predicted = model(test.tokens).argmax(-1)  # (N, T)
    scored = test.labels != -1
    return (predicted[scored] == test.labels[scored]).double().mean().item()
