"""Data layer: the offline Mistral tokenizer, the KJV corpus, and packed, resumable text DataModules."""

from .corpus import offline_corpus_dir
from .evaluation import EvalCorpus
from .packing import DocumentEncoder, Packer
from .pg19 import PG19DataModule
from .prompts import PromptDataModule
from .slimpajama import SlimPajamaDataModule
from .sources import HubUnavailableError
from .stream import PipelineStats
from .text import TextDataModule
from .tokenizer import BOS_ID, EOS_ID, UNK_ID, VOCAB_SIZE, mistral_tokenizer

__all__ = [
    "BOS_ID", "EOS_ID", "UNK_ID", "VOCAB_SIZE", "mistral_tokenizer", "offline_corpus_dir",
    "TextDataModule", "SlimPajamaDataModule", "PG19DataModule", "PipelineStats",
    "DocumentEncoder", "Packer", "HubUnavailableError", "EvalCorpus", "PromptDataModule",
]
