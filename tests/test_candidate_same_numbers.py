"""benchmarks/candidates/same_numbers.py, the A/B's bit-for-bit check of a kernel candidate: identical runs read
"same", a changed tensor reads its largest difference, and each tree's own fpa_lightning is the one that runs
(a copy of the package with a changed default scale is told apart, through the interpreter)."""
import pathlib
import shutil
import sys

import torch
from _benchmark_scripts import load_benchmark

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "candidates"))
import same_numbers  # noqa: E402


def test_compare_reads_same_only_for_identical_bits():
    a = [torch.tensor([1.0, float("nan"), -0.0]), torch.ones(2, dtype=torch.bfloat16)]
    assert same_numbers.compare({"dense": a}, {"dense": [x.clone() for x in a]}) == [["dense", "same", "same"]]
    b = [torch.tensor([1.0, float("nan"), 0.0]), torch.tensor([1.0, 1.5], dtype=torch.bfloat16)]
    # -0.0 against 0.0 differs in its bits by 0 in value; 1 against 1.5 by 0.5
    assert same_numbers.compare({"dense": a}, {"dense": b}) == [["dense", "0", "0.5"]]


def test_a_tree_runs_its_own_package_and_a_changed_one_is_told_apart(tmp_path):
    changed = tmp_path / "changed"
    shutil.copytree(ROOT / "fpa_lightning", changed / "fpa_lightning", ignore=shutil.ignore_patterns("__pycache__"))
    fused = changed / "fpa_lightning" / "ops" / "fpa" / "fused.py"
    text = fused.read_text()
    default_scale = "scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None"
    assert default_scale in text
    fused.write_text(text.replace(default_scale, "scale = 1.001 / math.sqrt(q.shape[-1]) if scale is None"))
    runs = {}
    for name, tree in (("repo", ROOT), ("again", ROOT), ("changed", changed)):
        runs[name] = str(tmp_path / f"{name}.pt")
        assert same_numbers.child(tree, ["dense"], "cpu", runs[name])
    repo, again, other = (torch.load(runs[name]) for name in ("repo", "again", "changed"))
    assert same_numbers.compare(repo, again) == [["dense"] + ["same"] * len(same_numbers.TENSORS)]
    (row,) = same_numbers.compare(repo, other)
    assert row[0] == "dense" and "same" not in row[1:4]  # the output, dq and dk follow the scale
    assert all(float(cell) > 0 for cell in row[1:] if cell != "same")


def test_the_deep_variant_has_tiles_whose_probabilities_all_underflow():
    """"deep" exists to exercise tiles of exact zeros: at the interpreter's shape and block size (16), some
    off-diagonal tiles have every probability below 2^-126 (flushed to 0 on the GPU), the default walk none
    (counted by benchmarks/dead_tiles.py, whose count tests/test_dead_tiles_benchmark.py checks)."""
    dead_tiles = load_benchmark("dead_tiles")

    def underflowing_tiles(name):
        q, k, _, _, phi, psi, beta, _ = (x.double() if torch.is_tensor(x) else x
                                         for x in same_numbers.seeded_inputs(name, "cpu"))
        B, _, H, _ = same_numbers.shape("cpu")
        return sum(dead_tiles.count_dead_tiles(q[b, :, h], k[b, :, h], phi[b, :, h], psi[b, :, h], beta[h].item(),
                                               16)[0] for b in range(B) for h in range(H))

    assert underflowing_tiles("deep") > 0
    assert underflowing_tiles("dense") == 0
