"""Shared fixtures: the tokenizer, a sentencepiece reference and file writers (the cache is isolated by tests/conftest.py)."""
import pytest


@pytest.fixture(scope="session")
def tok():
    from datamodules import mistral_tokenizer

    return mistral_tokenizer()


@pytest.fixture(scope="session")
def sp():
    import sentencepiece

    from datamodules.tokenizer import sentencepiece_model_path

    return sentencepiece.SentencePieceProcessor(model_file=str(sentencepiece_model_path()))

