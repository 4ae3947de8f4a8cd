"""Shared fixtures: an isolated cache folder (tokenizer + corpus built once per session) and file writers."""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Build the tokenizer and corpus caches in a temp folder, once for the whole test session."""
    old = os.environ.get("FPA_CACHE_DIR")
    os.environ["FPA_CACHE_DIR"] = str(tmp_path_factory.mktemp("fpa_cache"))
    yield
    if old is None:
        os.environ.pop("FPA_CACHE_DIR", None)
    else:
        os.environ["FPA_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def tok():
    from datamodules import mistral_tokenizer

    return mistral_tokenizer()


@pytest.fixture(scope="session")
def sp():
    import sentencepiece

    from datamodules.tokenizer import sentencepiece_model_path

    return sentencepiece.SentencePieceProcessor(model_file=str(sentencepiece_model_path()))

