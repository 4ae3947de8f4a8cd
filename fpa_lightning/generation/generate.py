"""``generate``: continue prompts with a KV cache (``DecodeSession``), greedy or sampled, optionally evicting keys;
``decode_tokens``: the decoding loop under it and under evaluation's greedy decoders."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch

from fpa_lightning.generation.rule import threshold_rule
from fpa_lightning.generation.sampling import check_sampling, next_tokens
from fpa_lightning.generation.session import DecodeSession
from fpa_lightning.model import Decoder

EOS_CHECK_EVERY = 16  # steps between host checks for "every row has ended" (each check synchronises once)


def as_decoder(model) -> Decoder:
    """The Decoder itself, or the ``model`` attribute of a module holding one (``modules.LanguageModel``)."""
    if isinstance(model, Decoder):
        return model
    inner = getattr(model, "model", None)
    if isinstance(inner, Decoder):
        return inner
    raise TypeError("generate needs a fpa_lightning Decoder (or a module whose .model is one), "
                    f"got {type(model).__name__}")


def as_prompts(input_ids, vocab_size: int) -> list[torch.Tensor]:
    """(B, T) or (T,) integer tensor, or a list of 1-D sequences of any lengths -> list of 1-D LongTensors."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() not in (1, 2):
            raise ValueError(f"input_ids must be (B, T) or (T,), got shape {tuple(input_ids.shape)}")
        rows = list(input_ids[None] if input_ids.dim() == 1 else input_ids)
    elif isinstance(input_ids, (list, tuple)):
        rows = [torch.as_tensor(row) for row in input_ids]
    else:
        raise TypeError(f"input_ids must be a tensor or a list of sequences, got {type(input_ids).__name__}")
    if not rows:
        raise ValueError("input_ids holds no prompt")
    for b, row in enumerate(rows):
        if row.dim() != 1 or row.numel() == 0:
            raise ValueError(f"prompt {b} must be a non-empty 1-D sequence of token ids, got shape {tuple(row.shape)}")
        if row.is_floating_point() or row.is_complex() or row.dtype == torch.bool:
            raise ValueError(f"prompt {b}: token ids must be integers, got {row.dtype}")
        low, high = int(row.min()), int(row.max())
        if low < 0 or high >= vocab_size:
            raise ValueError(f"prompt {b}: token ids must lie in [0, {vocab_size}) (the model's vocabulary), "
                             f"got {low}..{high}")
    return [row.long() for row in rows]


def decode_tokens(session: DecodeSession, prompts: list[torch.Tensor], max_new_tokens: int,
                  choose: Callable[[torch.Tensor], torch.Tensor] = next_tokens) -> Iterator[torch.Tensor]:
    """The decoding loop: prefill the prompts, then yield up to ``max_new_tokens`` tokens (B,), each chosen from the
    logits (B, V) by ``choose`` (greedy by default) and fed back as the next step's input. A caller that has what it
    needs leaves the loop: no step is run for a token it does not take."""
    logits = session.prefill(prompts, max_new_tokens)
    for i in range(max_new_tokens):
        token = choose(logits)
        yield token
        if i + 1 < max_new_tokens:
            logits = session.step(token)


@torch.no_grad()
def generate(model, input_ids, max_new_tokens: int, *, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, prune_threshold: float | None = None, eos_id: int | None = None,
             generator: torch.Generator | None = None, return_stats: bool = False):
    """Continue each prompt by up to ``max_new_tokens`` tokens through a KV cache.

    model: a ``Decoder`` (or a module whose ``.model`` is one). input_ids: (B, T) or (T,) token ids, or a list of
    1-D sequences of different lengths. The prompts are prefilled by the parallel forward (the fused kernel on a
    GPU), then decoded one token per step (a CUDA graph on a GPU). temperature 0 is greedy; otherwise sampling
    from softmax(logits / temperature), restricted by top_k / top_p, drawn with ``generator``.
    prune_threshold: drop a key from the cache for good once its bias for the current query is below it (e.g.
    −10; checked by ``generation.rule.check_threshold``, against the model by ``check_rule``: it needs a bias);
    −inf drops nothing and is the same as None. eos_id: a row that emits it is finished (later tokens are eos_id),
    and generation stops once every row has.

    Returns the prompts followed by the new tokens, in the form of the input: (B, T + n) or (T + n,) for a tensor
    (n ≤ max_new_tokens: fewer when every row ended early), a list of 1-D tensors (each up to its first eos_id)
    for a list. With ``return_stats=True``, ``(ids, stats)``: the cache's ``kept_fraction`` and ``cache_bytes``
    (``DecodeSession.stats``) and timings (the prefill's up to the first new token).
    """
    decoder = as_decoder(model)
    vocab = decoder.cfg.vocab_size
    prompts = as_prompts(input_ids, vocab)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    check_sampling(temperature, top_k, top_p, vocab)
    rule = threshold_rule(prune_threshold)
    if eos_id is not None and not (isinstance(eos_id, int) and 0 <= eos_id < vocab):
        raise ValueError(f"eos_id must be a token id in [0, {vocab}), got {eos_id!r}")
    session = DecodeSession(decoder, rule=rule)
    if generator is not None and generator.device.type != session.device.type:
        raise ValueError(f"the generator is on {generator.device}, the model on {session.device}: "
                         f"use torch.Generator(device={str(session.device)!r})")

    done = torch.zeros(len(prompts), dtype=torch.bool, device=session.device)

    def choose(logits: torch.Tensor) -> torch.Tensor:
        token = next_tokens(logits, temperature, top_k, top_p, generator)
        if eos_id is not None:
            token = token.masked_fill(done, eos_id)
            done.logical_or_(token == eos_id)
        return token

    started = _now(session.device)
    prefilled = None
    new: list[torch.Tensor] = []
    for i, token in enumerate(decode_tokens(session, prompts, max_new_tokens, choose)):
        if prefilled is None:
            prefilled = _now(session.device)
        new.append(token)
        if eos_id is not None and i % EOS_CHECK_EVERY == EOS_CHECK_EVERY - 1 and done.all():
            break
    finished = _now(session.device)
    prefilled = finished if prefilled is None else prefilled

    tokens = torch.stack(new, dim=1) if new else torch.empty(len(prompts), 0, dtype=torch.long, device=session.device)
    ids = _with_prompts(input_ids, prompts, tokens, eos_id)
    if not return_stats:
        return ids
    steps = max(0, tokens.shape[1] - 1)  # the first new token comes from the prefill
    stats = {**session.stats(), "prompt_tokens": sum(len(p) for p in prompts), "new_tokens": tokens.numel(),
             "prefill_seconds": prefilled - started, "decode_seconds": finished - prefilled,
             "ms_per_step": 1000 * (finished - prefilled) / steps if steps else float("nan")}
    return ids, stats


def _with_prompts(input_ids, prompts: list[torch.Tensor], tokens: torch.Tensor, eos_id: int | None):
    """The prompts followed by their new tokens (B, n), in the form of the input."""
    if isinstance(input_ids, torch.Tensor):
        out = torch.cat([input_ids.to(tokens.device).long().reshape(len(prompts), -1), tokens], dim=1)
        return out[0] if input_ids.dim() == 1 else out
    rows = []
    for prompt, row in zip(prompts, tokens):
        if eos_id is not None and (row == eos_id).any():
            row = row[: int((row == eos_id).nonzero()[0]) + 1]
        rows.append(torch.cat([prompt.to(row.device), row]))
    return rows


def continuation_text(tokenizer, prompt_ids: list[int], ids: list[int], special: tuple[int, ...] = ()) -> str:
    """The text the new tokens ids[len(prompt_ids):] add to the prompt's text. Decoding them alone would lose what
    depends on their left context (a SentencePiece tokenizer drops the space a leading "▁" stands for); ids in
    `special` (BOS, EOS) are left out of both texts."""
    def text(tokens: list[int]) -> str:
        return tokenizer.decode([t for t in tokens if t not in special])

    prompt = text(prompt_ids)
    full = text(ids)
    return full[len(prompt):] if full.startswith(prompt) else text(ids[len(prompt_ids):])


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
