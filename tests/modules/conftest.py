"""Fixtures of the application tests (the tiny checkpoints are in tests/conftest.py)."""
import pytest


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread_per_module):
    yield
