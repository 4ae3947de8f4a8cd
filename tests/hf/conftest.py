"""Fixtures of the transformers tests (each module skips itself without the hf extra): offline, one thread."""
import pytest


@pytest.fixture(scope="session", autouse=True)
def _offline():
    """No network at test time: a hub lookup fails at once instead of trying (subprocesses get these too)."""
    with pytest.MonkeyPatch.context() as patch:
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
            patch.setenv(name, "1")
        yield


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread_per_module):
    yield
