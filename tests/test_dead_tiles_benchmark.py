"""benchmarks/dead_tiles.py: its per-block log2-probabilities are FPA's (the reference bias of
fpa_lightning.ops.fpa.naive), and its count of dead tiles is a brute-force count over the full matrix."""
import math

import torch
from _benchmark_scripts import load_benchmark

from fpa_lightning.ops.fpa.naive import fpa_bias

dead_tiles = load_benchmark("dead_tiles")


def full_log2_probs(q, k, phi, psi, beta):
    """(T, T) log2 p of one head from the reference bias, float64."""
    bias = fpa_bias(phi[None, :, None], psi[None, :, None], torch.tensor([beta], dtype=torch.float64))[0, 0]
    scores = q @ k.T / math.sqrt(q.shape[1]) + bias
    return (scores - scores.logsumexp(1, keepdim=True)) / math.log(2.0)


def steep_inputs(T=48, D=8, drift=-6.0):
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.randn(T, D, generator=gen, dtype=torch.float64) for _ in range(2))
    phi, psi = dead_tiles.walks(T, 1, gen, drift=drift)
    return q, k, phi[:, 0], psi[:, 0]


def test_block_log2_probs_are_the_reference_rows():
    q, k, phi, psi = steep_inputs()
    full = full_log2_probs(q, k, phi, psi, 0.7)
    for start in (0, 16, 32):
        rows = slice(start, start + 16)
        block = dead_tiles.block_log2_probs(q, k, phi, psi, 0.7, rows)
        want = full[rows, :rows.stop]
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(block))
        assert torch.allclose(block[finite], want[finite], rtol=0, atol=1e-9)


def test_the_count_is_a_brute_force_count():
    q, k, phi, psi = steep_inputs()
    full = full_log2_probs(q, k, phi, psi, 1.0)
    brute = sum(bool((full[i:i + 16, j:j + 16] < dead_tiles.UNDERFLOW_LOG2).all())
                for i in range(0, 48, 16) for j in range(0, i, 16))
    dead, total = dead_tiles.count_dead_tiles(q, k, phi, psi, 1.0, 16)
    assert (dead, total) == (brute, 3)
    assert dead > 0  # the steep walk makes the far tile dead; a shallow one makes none
    q, k, phi, psi = steep_inputs(T=40)  # a partial last query block (8 rows), as a kernel's
    full = full_log2_probs(q, k, phi, psi, 1.0)
    brute = sum(bool((full[i:i + 16, j:j + 16] < dead_tiles.UNDERFLOW_LOG2).all())
                for i in range(0, 40, 16) for j in range(0, i, 16))
    assert dead_tiles.count_dead_tiles(q, k, phi, psi, 1.0, 16) == (brute, 3) and brute > 0
    q, k, phi, psi = steep_inputs(drift=-0.02)
    assert dead_tiles.count_dead_tiles(q, k, phi, psi, 1.0, 16) == (0, 3)


def test_main_writes_a_record(tmp_path):
    out = tmp_path / "dead.json"
    assert dead_tiles.main(["--lengths", "128", "--block", "32", "--out", str(out)]) == 0
    import json

    record = json.loads(out.read_text())
    assert {"what", "command", "machine", "versions", "date"} <= set(record)
    (row,) = record["rows"]
    assert row["T"] == 128 and row["off_diagonal_tiles"] == 6 and 0 <= row["dead_tiles"] <= 6


def test_alibi_fields_give_alibi_bias():
    """--fields alibi: the fresh model's fields make the bias -m_h * (t - s), head by head."""
    from fpa_lightning.ops.fox.alibi import alibi_slopes

    phi, psi = dead_tiles.alibi_fields(9, 3)
    bias = fpa_bias(phi[None], psi[None], torch.ones(3, dtype=torch.float64))[0]  # (H, T, T)
    t = torch.arange(9, dtype=torch.float64)
    want = -alibi_slopes(3).double()[:, None, None] * (t[:, None] - t[None, :])
    causal = t[:, None] >= t[None, :]
    assert torch.allclose(bias[:, causal], want[:, causal], rtol=0, atol=1e-12)


def test_kept_tiles_at_a_skip_threshold(tmp_path):
    """--skip-threshold: on ALiBi fields the kept tiles are those at a block distance d with m_h·(64·d − 63) ≤ −X,
    counted here by hand for two heads (slopes 2^−4 and 2^−8) over T = 256 (four blocks, six off-diagonal tiles)."""
    import json

    phi, psi = dead_tiles.alibi_fields(256, 2)
    # head 0: -0.0625 * (1, 65, 129) = -0.06, -4.06, -8.06 at d = 1, 2, 3 -> 5 of 6 kept at -5; head 1: all 6
    assert dead_tiles.count_kept_tiles(phi, psi, -5.0, 64) == (11, 12)
    assert dead_tiles.count_kept_tiles(phi, psi, -1.0, 64) == (3 + 6, 12)  # head 1: -0.0039 * 129 = -0.5
    out = tmp_path / "kept.json"
    assert dead_tiles.main(["--lengths", "256", "--heads", "2", "--fields", "alibi", "--skip-threshold", "-5",
                            "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["kept_tiles"], row["off_diagonal_tiles"], row["threshold"]) == (11, 12, -5.0)
