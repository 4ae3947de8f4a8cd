"""The fused ops' shared launch-setting overrides (fpa_lightning/ops/kernel_inputs.py); their shared input checks are
tested through each op's bad-input tests (test_fpa_fused.py, test_selective_fused.py)."""
from fpa_lightning.ops.kernel_inputs import env_int, with_env_overrides


def test_environment_overrides_replace_only_the_settings_that_are_set(monkeypatch):
    monkeypatch.setenv("FPA_DQ_WARPS", "8")
    monkeypatch.setenv("FPA_DQ_MAXNREG", "0")
    monkeypatch.delenv("FPA_DQ_STAGES", raising=False)
    cfg = with_env_overrides({"num_warps": 4, "num_stages": 2}, "FPA_DQ",
                             (("num_warps", "WARPS"), ("num_stages", "STAGES"), ("maxnreg", "MAXNREG")))
    assert cfg == {"num_warps": 8, "num_stages": 2, "maxnreg": 0}
    monkeypatch.setenv("SEL_HEAD_GROUPS", "")  # empty counts as unset
    assert env_int("SEL_HEAD_GROUPS") is None and env_int("FPA_DQ_WARPS") == 8
