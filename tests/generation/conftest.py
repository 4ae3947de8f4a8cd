"""Fixtures of the generation tests (the tiny decoders are in _gen_helpers.py)."""
import pytest
from _gen_helpers import tiny_decoder


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread_per_module):
    yield


@pytest.fixture(scope="module")
def make_decoder():
    return tiny_decoder
