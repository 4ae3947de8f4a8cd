"""Shared fixtures: an isolated cache folder (tokenizer + corpus built once per session) and file writers."""

import os
import pathlib
import sys

# tests/conftest.py puts tests/ on sys.path, where this folder (no __init__.py: pytest would otherwise
# name it "datamodules" too) looks like a namespace package called "datamodules" that wins over the
# editable install's finder. Import the real package first, from the repository root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import datamodules  # noqa: E402,F401

import pytest  # noqa: E402


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

