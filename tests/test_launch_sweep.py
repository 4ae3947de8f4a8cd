"""benchmarks/launch_sweep.py without a GPU: which settings it accepts, the environment each process gets (only its own
overrides, none inherited), and the table it makes of attention.py --profile's lines; the timing itself needs the GPU
machine and is not run here."""
import subprocess

import pytest
from _benchmark_scripts import load_benchmark

launch_sweep = load_benchmark("launch_sweep")

PROFILE = ("  8x2048 fpa: kernels 1.411 ms of a 1.666 ms step, 9 distinct; _fpa_bwd_dq_kernel 0.490, "
           "_fpa_field_kernel {field}, void at::reduce_kernel<512, 1, at::Re 0.007\n"
           "  1x16384 fpa: kernels 7.203 ms of a 7.312 ms step, 9 distinct; _fpa_field_kernel {long}\n")


def test_only_launch_overrides_are_settings():
    assert launch_sweep.parse_setting("FPA_FIELD_MAXNREG=128 FPA_DQ_SUBTILES=2") == {"FPA_FIELD_MAXNREG": "128",
                                                                                    "FPA_DQ_SUBTILES": "2"}
    for bad in ("FPA_FIELD_MAXNREG=lots", "CUDA_VISIBLE_DEVICES=1", "FPA_ATTENTION_WARPS=4", ""):
        with pytest.raises(SystemExit, match="not a launch override"):
            launch_sweep.parse_setting(bad)


def test_each_setting_runs_alone_and_the_table_has_a_column_each(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("FPA_DQ_STAGES", "2")  # left over in the shell: must not leak into any process
    seen = []

    def fake_run(cmd, env, **kwargs):
        seen.append({k: v for k, v in env.items() if launch_sweep.SETTING.fullmatch(f"{k}=0")})
        field = {"128": ("0.194", "0.309")}.get(env.get("FPA_FIELD_MAXNREG"), ("0.256", "0.462"))
        return subprocess.CompletedProcess(cmd, 0, stdout=PROFILE.format(field=field[0], long=field[1]), stderr="")

    monkeypatch.setattr(launch_sweep.subprocess, "run", fake_run)
    assert launch_sweep.main(["FPA_FIELD_MAXNREG=128"]) == 0
    assert seen == [{}, {"FPA_FIELD_MAXNREG": "128"}, {}]  # the default first and last
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0] == "| shape | method | kernel | default | FPA_FIELD_MAXNREG=128 | default again |"
    assert "| 8x2048 | fpa | _fpa_field_kernel | 0.256 | 0.194 | 0.256 |" in lines
    assert "| 1x16384 | fpa | _fpa_field_kernel | 0.462 | 0.309 | 0.462 |" in lines
    assert "| 1x16384 | fpa | _fpa_bwd_dq_kernel | - | - | - |" not in lines  # a kernel only where it was listed
    assert "| 8x2048 | fpa | void at::reduce_kernel<512, 1, at::Re | 0.007 | 0.007 | 0.007 |" in lines
    assert "[3/3] default again" in out.err


def test_a_failing_process_stops_the_sweep(monkeypatch):
    monkeypatch.setattr(launch_sweep.subprocess, "run",
                        lambda cmd, env, **kw: subprocess.CompletedProcess(cmd, 1, stdout="", stderr="CUDA error"))
    with pytest.raises(SystemExit, match="attention.py failed under default"):
        launch_sweep.main(["FPA_FWD_STAGES=2"])
