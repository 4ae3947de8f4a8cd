"""benchmarks/train_throughput.py's bookkeeping around its GPU runs (the runs themselves need a GPU): a failing
variant is reported with its error and does not lose the other variants' numbers."""
import json
import types

import pytest
import torch

from _benchmark_scripts import load_benchmark


@pytest.fixture
def bench():
    return load_benchmark("train_throughput")


def test_a_failing_variant_becomes_an_error_record_and_resets_dynamo(bench, monkeypatch, capsys):
    def measure(backend, variant, args):
        if variant == "compile":
            raise TypeError("list indices must be integers or slices, not NoneType\nmore lines")
        return {"backend": backend, "variant": variant, "tokens_per_s": 1.0}

    resets = []
    monkeypatch.setattr(bench, "measure", measure)
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    assert bench.measure_or_error("fpa", "base", None) == {"backend": "fpa", "variant": "base", "tokens_per_s": 1.0}
    assert resets == []
    failed = bench.measure_or_error("fpa", "compile", None)
    assert failed == {"backend": "fpa", "variant": "compile",
                      "error": "TypeError: list indices must be integers or slices, not NoneType"}
    assert resets == [1]
    assert "Traceback" in capsys.readouterr().err


def test_the_json_keeps_results_and_failures_apart(bench, tmp_path):
    path = tmp_path / "out.json"
    args = types.SimpleNamespace(json=str(path), steps=3)
    runs = [{"backend": "sdpa", "variant": "compile", "tokens_per_s": 2.0},
            {"backend": "fpa", "variant": "compile", "error": "TypeError: x"}]
    bench.write_json(args, runs)
    written = json.loads(path.read_text())
    assert written["results"] == runs[:1] and written["failed"] == runs[1:] and written["args"] == {"json": str(path),
                                                                                                  "steps": 3}
    bench.write_json(types.SimpleNamespace(json=None), runs)  # no --json: nothing written, no error


def test_tile_census_of_a_fresh_model_is_alibis(bench):
    # a fresh FPA model's fields are ALiBi's (φ = ψ = −m_h·t, β = 1; FpaBackend's init), so tile (I, J) of 64 × 64
    # has its largest bias −m_h·(64·(I − J) − 63) at its nearest pair: −0.0625, −4.06, −8.06 for head 0 (m = 2^−4)
    # at block distances 1, 2, 3, above −0.51 for head 1 (m = 2^−8). At −5: head 0 keeps 5 of the 6 tiles of four
    # blocks, head 1 all of them.
    from fpa_lightning.config import ModelConfig
    from fpa_lightning.model import Decoder

    torch.manual_seed(0)
    model = Decoder(ModelConfig(vocab_size=50, n_layer=2, d_model=16, n_head=2, d_mlp=32, max_seq_len=256))
    data = types.SimpleNamespace(train_dataloader=lambda: [{"input_ids": torch.randint(0, 50, (1, 256))}])
    census = bench.tile_census(model, data, threshold=-5.0)
    assert census == {"threshold": -5.0, "per_layer": [round((5 / 6 + 1) / 2, 4)] * 2,
                      "per_head": [[round(5 / 6, 4), 1.0]] * 2, "mean": round((5 / 6 + 1) / 2, 4)}
