"""The fused ops' shared launch-setting overrides and output buffers (fpa_lightning/ops/kernel_inputs.py); their shared
input checks are tested through each op's bad-input tests (fpa/test_fpa_fused.py, selective/test_selective_fused.py)."""
import torch

from fpa_lightning.ops import kernel_inputs
from fpa_lightning.ops.kernel_inputs import empty_output, env_int, with_env_overrides


def test_environment_overrides_replace_only_the_settings_that_are_set(monkeypatch):
    monkeypatch.setenv("FPA_DQ_WARPS", "8")
    monkeypatch.setenv("FPA_DQ_MAXNREG", "0")
    monkeypatch.delenv("FPA_DQ_STAGES", raising=False)
    cfg = with_env_overrides({"num_warps": 4, "num_stages": 2}, "FPA_DQ",
                             (("num_warps", "WARPS"), ("num_stages", "STAGES"), ("maxnreg", "MAXNREG")))
    assert cfg == {"num_warps": 8, "num_stages": 2, "maxnreg": 0}
    monkeypatch.setenv("SEL_HEAD_GROUPS", "")  # empty counts as unset
    assert env_int("SEL_HEAD_GROUPS") is None and env_int("FPA_DQ_WARPS") == 8


def test_the_poison_hook_fills_every_fused_ops_buffers(monkeypatch):
    """One test hook for every fused op: its buffers start as NaN, integer ones as −1."""
    assert empty_output((2, 3), dtype=torch.float32, device="cpu").shape == (2, 3)
    monkeypatch.setattr(kernel_inputs, "TEST_HOOK_POISON_OUTPUTS", True)
    assert empty_output((2, 3), dtype=torch.bfloat16, device="cpu").isnan().all()
    kept = empty_output((4,), dtype=torch.int32, device="cpu")
    assert kept.dtype == torch.int32 and (kept == -1).all()
