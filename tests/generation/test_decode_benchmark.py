"""benchmarks/decode.py runs on a CPU (tiny shapes, eager): every variant measured, ratios printed."""
import importlib.util
import pathlib

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run is the real benchmark")
def test_decode_benchmark_runs_on_a_cpu(capsys):
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "decode.py"
    spec = importlib.util.spec_from_file_location("decode_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.main(["--variants", "softmax", "fpa-prune-10"])
    assert len(rows) == 8 and not any("error" in r for r in rows)
    assert {r["variant"] for r in rows} == {"softmax", "fpa-prune-10"}
    out = capsys.readouterr().out
    assert "x softmax" in out and "flatness" in out
