"""benchmarks/candidates/check_record.py: a kernel_check.sh results folder read into one record with the record keys
(tests/test_result_records.py), every round of every tree in order, the same-numbers tables and the attention table;
a folder where nothing ran on a GPU is refused."""
import importlib.util
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("check_record", ROOT / "benchmarks" / "candidates" / "check_record.py")
check_record = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_record)

GPU = "GPU NVIDIA H100 80GB HBM3 | torch 2.11.0+cu130 | triton 3.6.0 | 2026-12-06T19:18:12"


def attention_log(fpa_ms: float) -> str:
    return (f"{GPU}\n  8x2048 fpa  fwd 0.249 ms ( 1.12x)\n\n"
            "| shape B×T | method | fwd ms | fwd / flash | fwd+bwd ms | fwd+bwd / flash | fwd+bwd peak MiB |\n"
            "|---|---|---|---|---|---|---|\n"
            "| 8x2048 | sdpa-flash | 0.222 | 1.00 | 0.847 | 1.00 | 73.5 |\n"
            f"| 8x2048 | fpa | 0.249 | 1.12 | {fpa_ms} | 1.84 | 104.7 |\n")


def results(tmp_path: pathlib.Path) -> pathlib.Path:
    folder = tmp_path / "kc"
    folder.mkdir()
    (folder / "tests_default_shapes.log").write_text("....\n22 passed, 107 deselected in 190.81s (0:03:10)\n")
    (folder / "attention.log").write_text(attention_log(1.60))
    for r, (base, cand) in enumerate([(1.558, 1.541), (1.571, 1.535), (1.716, 1.552)], start=1):
        (folder / f"timing_base_{r}.log").write_text(attention_log(base))
        (folder / f"timing_candidate_fpa_lse_fold_{r}.log").write_text(attention_log(cand))
    (folder / "same_candidate_fpa_lse_fold.log").write_text(
        "| variant | out | dq |\n|---|---|---|\n| dense | same | 2.38e-07 |\n| deep | same | same |\n")
    return folder


def test_a_results_folder_becomes_one_record(tmp_path):
    folder = results(tmp_path)
    assert check_record.main([str(folder), "--command", "CANDIDATES=fpa_lse_fold bash benchmarks/kernel_check.sh kc"]) == 0
    rec = json.loads((folder / "record.json").read_text())
    assert {"what", "command", "machine", "versions", "date"} <= rec.keys()
    assert rec["machine"] == "NVIDIA H100 80GB HBM3" and rec["date"] == "2026-12-06"
    assert rec["versions"] == {"torch": "2.11.0+cu130", "triton": "3.6.0"}
    assert rec["command"].startswith("CANDIDATES=fpa_lse_fold") and "['fpa_lse_fold']" in rec["what"]
    assert rec["tests"] == {"tests_default_shapes": "22 passed, 107 deselected in 190.81s (0:03:10)"}
    # the candidate's name keeps its underscores; rounds in order, each with its GPU line and both table rows
    assert sorted(rec["rounds"]) == ["base", "fpa_lse_fold"]
    fpa = [[row["fwd_bwd_ms"] for row in r["rows"] if row["method"] == "fpa"] for r in rec["rounds"]["fpa_lse_fold"]]
    assert fpa == [[1.541], [1.535], [1.552]]
    assert [r["round"] for r in rec["rounds"]["base"]] == [1, 2, 3] and rec["rounds"]["base"][0]["gpu_line"] == GPU
    assert rec["same_numbers"]["fpa_lse_fold"] == [{"variant": "dense", "out": "same", "dq": "2.38e-07"},
                                                   {"variant": "deep", "out": "same", "dq": "same"}]
    assert [row["method"] for row in rec["attention"]["rows"]] == ["sdpa-flash", "fpa"]


def test_a_folder_without_a_gpu_run_is_refused(tmp_path):
    folder = tmp_path / "kc"
    folder.mkdir()
    (folder / "tests_default_shapes.log").write_text("1 failed\n")
    with pytest.raises(SystemExit, match="nothing ran on a GPU"):
        check_record.main([str(folder)])
    assert not (folder / "record.json").exists()
