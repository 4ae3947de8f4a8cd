"""Run ``python train.py fit`` in a fresh process (Lightning launches the other ranks from it) and read weights."""
import os
import pathlib
import subprocess
import sys

import torch

REPO = pathlib.Path(__file__).resolve().parents[2]


def train_py(runs: pathlib.Path, *args: str, timeout: int = 300) -> None:
    """The quickstart config with ``args`` on top; logs and checkpoints under ``runs``. A hang fails after timeout.

    ``FPA_TEST_TOKENIZER`` (a tokenizer.json) replaces the offline Mistral conversion on machines without
    mistral-common (the GPU machine). A relative path is taken from this process's working directory, since the
    training runs in another one."""
    tokenizer = os.environ.get("FPA_TEST_TOKENIZER")
    tokenizer = str(pathlib.Path(tokenizer).resolve()) if tokenizer else None
    command = [sys.executable, str(REPO / "train.py"), "fit", "--config", str(REPO / "configs" / "quickstart.yaml"),
               f"--trainer.logger.init_args.save_dir={runs}", "--trainer.enable_progress_bar=false",
               *([f"--data.init_args.tokenizer={tokenizer}"] if tokenizer else []), *args]
    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))  # keep a --target site
    # cuBLAS needs a fixed workspace to be deterministic (``--trainer.deterministic=true`` refuses to run without it)
    env = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", **os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    runs.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(command, cwd=runs.parent, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]


def weights(checkpoint: pathlib.Path) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint file, or of a sharded (FSDP distributed-checkpoint) folder."""
    if checkpoint.is_dir():
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        single = checkpoint.with_suffix(".consolidated")
        dcp_to_torch_save(checkpoint, single)
        return torch.load(single, weights_only=True)["model"]
    return torch.load(checkpoint, weights_only=True)["state_dict"]


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    assert a.keys() == b.keys()
    return [name for name in a if not torch.equal(a[name].cpu(), b[name].cpu())]
