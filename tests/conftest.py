"""Test setup. Must run before anything defines a @triton.jit kernel: without CUDA the Triton
interpreter is switched on (TRITON_INTERPRET=1 only takes effect for kernels decorated later)."""
import os

# Threads under pytest-xdist (README's command: 2 workers on 2 cores): each worker, and each process a test starts
# (train.py, eval.py, DDP ranks: they inherit the environment), gets cores // workers intra-op threads, at least 1.
# More threads than cores spend the tiny models' ops waiting at OpenMP barriers (measured on the shared 2-core machine:
# 2 threads take 1.3x the CPU time and wall time of 1). A value the caller set wins; a run without xdist keeps torch's
# default.
_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _XDIST_WORKERS:
    _CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _CORES // _XDIST_WORKERS)))

try:
    import torch as _torch

    _HAS_CUDA = _torch.cuda.is_available()
except Exception:  # pragma: no cover
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

if _XDIST_WORKERS:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # also where torch was imported before this file


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one)")
    config.addinivalue_line("markers", "slow: longer CPU tests")


def pytest_collection_modifyitems(config, items):
    if _HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Build the tokenizer and corpus caches in a temp folder, once per test session: tests never read or
    write the user's cache (FPA_CACHE_DIR, default ~/.cache/fpa_lightning)."""
    old = os.environ.get("FPA_CACHE_DIR")
    os.environ["FPA_CACHE_DIR"] = str(tmp_path_factory.mktemp("fpa_cache"))
    yield
    if old is None:
        os.environ.pop("FPA_CACHE_DIR", None)
    else:
        os.environ["FPA_CACHE_DIR"] = old


@pytest.fixture
def offline_in_tmp(monkeypatch, tmp_path):
    """The hub switched to offline mode (an accidental download fails at once) and the test run from its own tmp_path,
    so that what train.py writes relative to the working directory (runs/, config.yaml) lands there."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def one_thread_per_module():
    """Tiny ops only lose to thread synchronisation on a shared 2-core machine; the thread count is restored after
    the module, so tests elsewhere keep theirs (the analysis and evaluation conftests use it for every module)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- tiny checkpoints saved by a real Lightning Trainer (d_model 32, 2 layers), for evaluation and analysis tests
TINY = dict(vocab_size=32000, n_layer=2, d_model=32, n_head=2, d_mlp=64, max_seq_len=64)


def tiny_module(backend: str, seed: int = 0, **attention):
    """A LanguageModel whose gate maps are randomised: the ALiBi-like initialisation has every FPA key dead
    (φ = ψ strictly decreasing); random maps give a mix of alive and dead keys, as a trained model has."""
    from modules.language_model import LanguageModel

    from fpa_lightning import ModelConfig

    torch.manual_seed(seed)
    module = LanguageModel(ModelConfig(**TINY, attention={"backend": backend, "block_size": 16, **attention}))
    with torch.no_grad():
        for block in module.model.blocks:
            gate = getattr(block.attn.backend, "gate", None)
            if gate is not None:
                gate.weight.normal_(0.0, 2.0)
    return module


def save_checkpoint(module, path) -> str:
    """One optimiser step through a Trainer, then Trainer.save_checkpoint: the real checkpoint format."""
    import lightning as L

    ids = torch.randint(3, 32000, (2, 17))
    batches = [{"input_ids": ids[:, :-1], "labels": ids[:, 1:]}]
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    trainer.save_checkpoint(path)
    return str(path)


@pytest.fixture(scope="session")
def ckpts(tmp_path_factory):
    """{backend: checkpoint path} for fpa, fox and sdpa (softmax with RoPE)."""
    folder = tmp_path_factory.mktemp("ckpts")
    return {b: save_checkpoint(tiny_module(b, seed=i), folder / f"{b}.ckpt") for i, b in enumerate(("fpa", "fox", "sdpa"))}


@pytest.fixture(scope="session")
def make_module():
    return tiny_module


@pytest.fixture(scope="session")
def tokenizer():
    from datamodules import mistral_tokenizer

    return mistral_tokenizer()
