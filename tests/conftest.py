"""Test setup. Must run before anything defines a @triton.jit kernel: without CUDA the Triton
interpreter is switched on (TRITON_INTERPRET=1 only takes effect for kernels decorated later)."""
import os

try:
    import torch as _torch

    _HAS_CUDA = _torch.cuda.is_available()
except Exception:  # pragma: no cover
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


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
