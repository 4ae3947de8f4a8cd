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


def profile_log(field_ms: float) -> str:
    """attention.py --profile's lines as it prints them: names cut at 40 characters, some holding commas."""
    return ("  8x2048 fpa: kernels 1.469 ms of a 1.608 ms step, 9 distinct; _fpa_bwd_dq_kernel 0.490, "
            f"_fpa_bwd_dkdv_kernel 0.390, _fpa_field_kernel {field_ms:.3f}, void at::reduce_kernel<512, 1, at::Re 0.007\n"
            "  1x16384 fpa: kernels 7.326 ms of a 7.450 ms step, 9 distinct; _fpa_bwd_dq_kernel 2.915\n")


def test_per_kernel_times_go_into_the_record_and_a_table(tmp_path, capsys):
    folder = results(tmp_path)
    (folder / "profile_base.log").write_text(profile_log(0.256))
    (folder / "profile_candidate_fpa_lse_fold.log").write_text(profile_log(0.194))
    rec = check_record.record(folder, "cmd")
    base = rec["per_kernel"]["base"]
    assert [(r["shape"], r["kernels_ms"], r["step_ms"]) for r in base] == [("8x2048", 1.469, 1.608),
                                                                            ("1x16384", 7.326, 7.450)]
    # a name with commas stays whole; every listed kernel is kept
    assert base[0]["kernels"] == {"_fpa_bwd_dq_kernel": 0.49, "_fpa_bwd_dkdv_kernel": 0.39, "_fpa_field_kernel": 0.256,
                                  "void at::reduce_kernel<512, 1, at::Re": 0.007}
    assert rec["per_kernel"]["fpa_lse_fold"][0]["kernels"]["_fpa_field_kernel"] == 0.194
    assert check_record.main([str(folder), "--kernel-table", "fpa_lse_fold"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "| shape | method | kernel | base ms | fpa_lse_fold ms | change |"
    assert "| 8x2048 | fpa | _fpa_field_kernel | 0.256 | 0.194 | -24.2 % |" in table
    assert "| 8x2048 | fpa | _fpa_bwd_dq_kernel | 0.490 | 0.490 | +0.0 % |" in table
    assert len(table) == 2 + 5  # four kernels at 8x2048, one at 1x16384
