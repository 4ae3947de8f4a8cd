"""The fused ops' shared launch-setting overrides, compile options and output buffers (fpa_lightning/ops/kernel_inputs.py);
their shared input checks are tested through each op's bad-input tests (fpa/test_fpa_fused.py,
selective/test_selective_fused.py)."""
import ast
from pathlib import Path

import torch

from fpa_lightning.ops import kernel_inputs
from fpa_lightning.ops.kernel_inputs import TRITON_OPTIONS, empty_output, env_int, with_env_overrides


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


# Every Triton kernel launch in fpa_lightning/ops passes TRITON_OPTIONS, so the kernels compile with FMA contraction on
# whatever Triton's default (3.10 turns it off, which would change every kernel's rounding and speed). A launch is a
# call of a subscripted object, kernel[grid](...).
OPS = Path(__file__).resolve().parents[2] / "fpa_lightning" / "ops"


def launches(source: str) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)]


def passes_options(call: ast.Call) -> bool:
    return any(kw.arg is None and isinstance(kw.value, ast.Name) and kw.value.id == "TRITON_OPTIONS"
               for kw in call.keywords)


def test_every_launch_passes_the_compile_options():
    missing, seen = [], 0
    for path in sorted(OPS.rglob("*.py")):
        for call in launches(path.read_text()):
            seen += 1
            if not passes_options(call):
                missing.append(f"{path.relative_to(OPS)}:{call.lineno}")
    assert not missing, f"kernel launches without **TRITON_OPTIONS: {missing}"
    assert seen >= 19  # FPA (with its piece op), Selective, DCP, decoding and the decoding step


def test_the_check_finds_a_launch_without_them():
    bad = "kernel[(1,)](x, BS=64)\nkernel[(1,)](x, BS=64, **TRITON_OPTIONS)\n"
    assert [passes_options(call) for call in launches(bad)] == [False, True]


def test_the_options_keep_fma_contraction_on():
    assert TRITON_OPTIONS == {"enable_fp_fusion": True}
