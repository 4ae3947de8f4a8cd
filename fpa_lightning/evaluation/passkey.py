"""The pass-key retrieval task (Mohtashami & Jaggi 2023, as used for FoX and by the paper, docs/method.md), built offline.

A prompt of a fixed length in tokens: an instruction, filler sentences repeated, the key sentence at a
chosen depth inside the filler, and a question; the answer is the 5-digit key. Prompts are assembled from
separately tokenised sentences. With the Mistral tokenizer this equals tokenising the whole text (sentences
joined by single spaces): a piece encoded with the dummy prefix "▁" is exactly how it is encoded after a
space, and no Mistral token straddles a space that follows a non-space (see ``datamodules.packing``).

Greedy success is scored in one forward pass: greedy decoding reproduces the answer iff at every answer
position the answer token is the argmax given the prompt and the answer tokens before it, which is what
teacher forcing computes. Only the answer positions are projected onto the vocabulary. Under a pruning rule the
answer is instead decoded greedily through the KV cache with real eviction (``decode_trial``), where a key once
dropped stays dropped.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from fpa_lightning.generation import DecodeSession, PruneRule, decode_tokens
from fpa_lightning.model import Decoder

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
         "I will quiz you about the important information there.")
FILLER = ("The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.")
KEY_SENTENCE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"


@dataclass
class PasskeyTrial:
    input_ids: torch.Tensor  # (L,) prompt followed by all answer tokens but the last (teacher forcing)
    prompt_len: int  # the answer starts right after the prompt
    answer: torch.Tensor  # (m,) the key's tokens
    key: int
    depth: float  # requested depth: fraction of the filler placed before the key sentence
    key_start: int  # index of the key sentence's first token

    @property
    def length(self) -> int:
        """Tokens of prompt + answer (the nominal task length bounds this)."""
        return self.prompt_len + self.answer.numel()


class PasskeyBuilder:
    """Tokenises the fixed pieces once; builds trials of a given length (tokens, prompt + answer ≤ length)."""

    def __init__(self, tokenizer, bos_id: int):
        self.tokenizer, self.bos_id = tokenizer, bos_id
        self.intro = self.encode(INTRO)
        self.filler = [self.encode(s) for s in FILLER]
        self.question = self.encode(QUESTION)

    def encode(self, text: str) -> list[int]:
        """Token ids of a piece as it reads after a space (the dummy prefix plays the space)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def trial(self, length: int, depth: float, key: int) -> PasskeyTrial:
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must be in [0, 1], got {depth}")
        key_ids, answer = self.encode(KEY_SENTENCE.format(key=key)), self.encode(str(key))
        fixed = 1 + len(self.intro) + len(key_ids) + len(self.question) + len(answer)
        sentences = self._filler_sentences(length - fixed)
        if not sentences:
            raise ValueError(f"passkey length {length} is too short: the prompt without filler already has {fixed} tokens")
        before = round(depth * len(sentences))
        head = [self.bos_id, *self.intro, *(t for s in sentences[:before] for t in s)]
        prompt = head + key_ids + [t for s in sentences[before:] for t in s] + self.question
        return PasskeyTrial(
            input_ids=torch.tensor(prompt + answer[:-1], dtype=torch.long),
            prompt_len=len(prompt),
            answer=torch.tensor(answer, dtype=torch.long),
            key=key,
            depth=depth,
            key_start=len(head),
        )

    def _filler_sentences(self, budget: int) -> list[list[int]]:
        """The filler sentences in their cyclic order, as many as fit in ``budget`` tokens."""
        out, used = [], 0
        while True:
            sentence = self.filler[len(out) % len(self.filler)]
            if used + len(sentence) > budget:
                return out
            out.append(sentence)
            used += len(sentence)

    def trials(self, length: int, n: int, seed: int) -> list[PasskeyTrial]:
        """n trials with uniform random depths and keys, reproducible from (seed, length) alone, so two
        checkpoints (and reruns) see the same prompts."""
        rng = random.Random(f"passkey/{seed}/{length}")
        return [self.trial(length, rng.random(), rng.randint(10_000, 99_999)) for _ in range(n)]


@dataclass
class PasskeyScore:
    success: bool
    answer_nll: float  # −log p(answer | prompt) in nats under teacher forcing


@torch.no_grad()
def score_trial(decoder: Decoder, trial: PasskeyTrial, device: torch.device) -> PasskeyScore:
    """Greedy success and answer log-likelihood of one trial from a single forward pass."""
    ids = trial.input_ids.to(device)[None]  # (1, L)
    hidden = decoder.features(ids)[:, trial.prompt_len - 1 :]  # (1, m, C): the positions predicting the answer
    logits = decoder.lm_head(hidden)[0].float()  # (m, V)
    answer = trial.answer.to(device)
    nll = torch.nn.functional.cross_entropy(logits, answer, reduction="sum")
    return PasskeyScore(bool((logits.argmax(-1) == answer).all()), float(nll))


@torch.no_grad()
def decode_trial(decoder: Decoder, trial: PasskeyTrial, rule: PruneRule) -> tuple[bool, dict]:
    """Greedy decoding of the answer through the KV cache under `rule` (keys evicted for good): whether it is the
    key, and the cache's statistics at the end (``DecodeSession.stats``: kept fraction, cache bytes, ...)."""
    session = DecodeSession(decoder, rule=rule)
    answer = torch.cat(list(decode_tokens(session, [trial.input_ids[: trial.prompt_len]], trial.answer.numel())))
    return bool(torch.equal(answer.cpu(), trial.answer)), session.stats()
