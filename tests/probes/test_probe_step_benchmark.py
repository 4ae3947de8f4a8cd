"""benchmarks/probe_step.py on a CPU (2 seeds, 4 sequences): it trains a row's ensemble through the runner's own
``train_step`` and reports a step's wall time, kernel count and the row's settings; a group label must name one
group."""
import pytest
import torch
from _benchmark_scripts import load_benchmark

from fpa_lightning.probes.train import Budget


def test_a_probe_step_is_measured_on_a_cpu():
    bench = load_benchmark("probe_step")
    group = bench.find_group("mqar, paper regime, 2 layers, 32 pairs, T=256")
    row = bench.measure(group, "fpa", 2, Budget(batch=4), warmup=1, steps=2, profile_steps=1, top=3,
                        device=torch.device("cpu"))
    assert row["backend"] == "fpa" and row["impl"] == "auto" and row["seeds"] == 2
    assert row["tokens_per_step"] == 2 * 4 * 256
    assert row["wall_ms_per_step"] > 0 and row["peak_mem_GiB"] is None
    assert row["kernels_per_step"] == 0  # the profiler records CPU ops here, no kernels
    assert row["vmapped"] is False  # the chunked path does not run under vmap


def test_a_group_label_must_name_one_group():
    bench = load_benchmark("probe_step")
    assert bench.find_group("ladder, d=4, r=6").label == "ladder, d=4, r=6"
    with pytest.raises(SystemExit, match="matches 0 groups"):
        bench.find_group("no such group")
    with pytest.raises(SystemExit, match="matches [2-9] groups"):
        bench.find_group("mqar, paper regime")
