"""Writing a task's outputs: one JSON result, PNG figures, and optionally TensorBoard scalars and figures."""
from __future__ import annotations

import math
import os
import platform
from importlib import metadata

import matplotlib.pyplot as plt

from fpa_lightning.atomic import write_json
from modules.evaluation.tasks.common import TaskOutput


def library_versions() -> dict:
    versions = {"python": platform.python_version()}
    for dist in ("torch", "lightning", "numpy", "tokenizers", "matplotlib", "fpa-lightning"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def json_safe(value):
    """Strict JSON: non-finite floats (a −inf threshold, an empty bucket's NaN) become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_outputs(out_dir: str, task: str, header: dict, output: TaskOutput, tensorboard: str | None,
                  step: int = 0, overwrite: bool = False) -> str:
    """Save the figures as PNG, then the JSON (header + results + figure file names); returns the JSON path.

    Figures are named relative to the JSON's folder, so a result folder stays whole when it is moved or committed.
    Without ``overwrite`` an existing file of the result is never replaced: FileExistsError (before anything is
    written). The JSON is written atomically (``fpa_lightning.atomic.write_json``)."""
    os.makedirs(out_dir, exist_ok=True)
    figures = {name: f"{name}.png" for name in output.figures}
    path = os.path.join(out_dir, f"{task}.json")
    if not overwrite:
        for target in [*(os.path.join(out_dir, f) for f in figures.values()), path]:
            if os.path.exists(target):
                raise FileExistsError(f"{target} exists")
    for name, fig in output.figures.items():
        fig.savefig(os.path.join(out_dir, figures[name]), dpi=120)
    if tensorboard is not None:
        _log_tensorboard(tensorboard, output, step)
    for fig in output.figures.values():
        plt.close(fig)
    record = {**header, "task": task, "results": output.results, "figures": figures, "versions": library_versions()}
    write_json(path, json_safe(record), indent=1, allow_nan=False)
    return path


def _log_tensorboard(log_dir: str, output: TaskOutput, step: int) -> None:
    """Scalars and figures at ``step`` (the checkpoint's global step, so successive checkpoints form curves)."""
    from torch.utils.tensorboard import SummaryWriter  # imported on use: tensorboard is optional at run time

    with SummaryWriter(log_dir) as writer:
        for tag, value in output.scalars.items():
            writer.add_scalar(tag, value, global_step=step)
        for name, fig in output.figures.items():
            writer.add_figure(name, fig, global_step=step, close=False)
