"""lm-evaluation-harness adapter: a Decoder as an ``lm_eval`` model (``lm_eval.api.model.LM``).

Requires the optional extra ``pip install -e ".[eval]"`` (lm-eval 0.4.13); only the ``lm_eval`` task
(``modules/evaluation/tasks/lm_eval.py``) imports this module, when it runs.

Conventions (those of the harness's Hugging Face model, adapted to how these models were trained):
* Every input starts with BOS, as every training document did; an empty context is BOS alone.
* (context, continuation): trailing spaces of the context move to the continuation; the continuation's tokens
  are those of ``context + continuation`` after the context's own tokens.
* Inputs longer than ``max_length`` keep their last ``max_length`` tokens (left truncation); rolling
  log-likelihoods use the harness's disjoint windows of ``max_length`` tokens.
* A batch is right-padded: the model is causal, so padding after a sequence does not change its outputs.
* ``generate_until`` is greedy, through the KV cache (``fpa_lightning.generation.DecodeSession``), checking the
  stop strings after every token.

The adapter shows nothing itself: whoever makes it may pass ``progress``, which it calls once per batch of requests
(the evaluation application passes its progress bar, ``modules/evaluation/progress.py``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from lm_eval.api.model import LM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from fpa_lightning.evaluation.scoring import Runtime
from fpa_lightning.generation import DecodeSession, decode_tokens
from fpa_lightning.model import Decoder

DEFAULT_MAX_GEN_TOKS = 256


class Advance(Protocol):
    def advance(self, tokens: int) -> None:
        """One request (or window) of ``tokens`` tokens is done."""


ProgressFactory = Callable[[str, list[int], str], contextlib.AbstractContextManager[Advance]]
"""``progress(label, sizes, unit)``: the progress of one batch of requests, whose token lengths are ``sizes``; the
adapter enters it, calls ``advance`` after each request, and leaves it when the batch is done."""


class _Silent:
    def advance(self, tokens: int) -> None:
        pass


def silent(label: str, sizes: list[int], unit: str) -> contextlib.AbstractContextManager[Advance]:
    """The default progress: none."""
    return contextlib.nullcontext(_Silent())


@torch.no_grad()
def continuation_logprobs(decoder: Decoder, pairs: Sequence[tuple[list[int], list[int]]], max_length: int,
                          batch_size: int, runtime: Runtime, bar: Advance | None = None) -> list[tuple[float, bool]]:
    """For each (context ids, continuation ids): log p(continuation | context) in nats and whether greedy decoding
    produces the continuation. Inputs are left-truncated to max_length; batches right-padded, longest first."""
    out: list[tuple[float, bool] | None] = [None] * len(pairs)
    inputs = [(ctx + cont)[-(max_length + 1):][:-1] for ctx, cont in pairs]
    order = sorted(range(len(pairs)), key=lambda i: -len(inputs[i]))
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        width = len(inputs[batch[0]])
        ids = torch.zeros(len(batch), width, dtype=torch.long)  # (B, L), right padding (any id: causal model)
        for row, i in enumerate(batch):
            ids[row, :len(inputs[i])] = torch.tensor(inputs[i])
        with runtime.autocast():
            hidden = decoder.features(ids.to(runtime.device))  # (B, L, C)
        for row, i in enumerate(batch):
            cont = pairs[i][1]
            end = len(inputs[i])
            logits = decoder.lm_head(hidden[row, end - len(cont):end]).float()  # (m, V): the continuation's positions
            target = torch.tensor(cont, device=logits.device)
            logprob = logits.log_softmax(-1).gather(1, target[:, None]).sum()
            out[i] = (float(logprob), bool((logits.argmax(-1) == target).all()))
            if bar is not None:
                bar.advance(end)
    return out


@torch.no_grad()
def greedy_tokens(decoder: Decoder, prompt: list[int], max_new_tokens: int, runtime: Runtime, stop) -> list[int]:
    """Greedy continuation of ``prompt`` through the KV cache until ``stop(tokens)`` is true or max_new_tokens."""
    session = DecodeSession(decoder)
    tokens: list[int] = []
    with runtime.autocast():
        for token in decode_tokens(session, [torch.tensor(prompt, device=runtime.device)], max_new_tokens):
            tokens.append(int(token))
            if stop(tokens):
                break
    return tokens


class DecoderLM(LM):
    """A trained Decoder behind the harness's three request types (see the module doc)."""

    def __init__(self, decoder: Decoder, tokenizer, bos_id: int, eos_id: int, runtime: Runtime,
                 max_length: int | None = None, batch_size: int = 1, name: str = "model",
                 progress: ProgressFactory = silent):
        super().__init__()
        self.decoder, self.tokenizer, self.bos_id, self.eos_id = decoder, tokenizer, bos_id, eos_id
        self.runtime = runtime
        self.max_length = max_length or decoder.cfg.max_seq_len
        self.batch_size = batch_size
        self.name = name
        self.progress = progress
        self._device = runtime.device

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids if text else []

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = [self.bos_id, *self.encode(context + continuation)]
        context_ids = [self.bos_id, *self.encode(context)]
        return context_ids, whole[len(context_ids):]

    def _bar(self, kind: str, sizes: list[int], unit: str) -> contextlib.AbstractContextManager[Advance]:
        return self.progress(f"lm_eval {self.name} {kind}", sizes, unit)

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self.encode_pair(*r.args) for r in requests]
        with self._bar("loglikelihood", [min(len(c) + len(x) - 1, self.max_length) for c, x in pairs],
                       "requests") as bar:
            out = continuation_logprobs(self.decoder, pairs, self.max_length, self.batch_size, self.runtime, bar)
        for r, answer in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", r.args, answer)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows = [[make_disjoint_window(w) for w in get_rolling_token_windows(
            self.encode(r.args[0]), prefix_token=self.bos_id, max_seq_len=self.max_length, context_len=1)]
            for r in requests]
        flat = [w for per_request in windows for w in per_request]
        with self._bar("loglikelihood_rolling", [min(len(c) + len(x) - 1, self.max_length) for c, x in flat],
                       "windows") as bar:
            scores = iter(continuation_logprobs(self.decoder, flat, self.max_length, self.batch_size, self.runtime,
                                                bar))
        out = [sum(next(scores)[0] for _ in per_request) for per_request in windows]
        for r, answer in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, answer)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        prompts = [[self.bos_id, *self.encode(r.args[0])] for r in requests]
        with self._bar("generate_until", [min(len(p), self.max_length) for p in prompts], "requests") as bar:
            for r, prompt in zip(requests, prompts):
                kwargs = dict(r.args[1] or {})
                if kwargs.get("do_sample") or kwargs.get("temperature", 0.0) > 0:
                    raise ValueError(f"lm_eval task {r.task_name}: only greedy generation is supported "
                                     f"(got {kwargs})")
                until = kwargs.get("until") or []
                until = [until] if isinstance(until, str) else list(until)

                def stop(tokens: list[int]) -> bool:
                    return tokens[-1] == self.eos_id or any(s in self.tokenizer.decode(tokens) for s in until)

                tokens = greedy_tokens(self.decoder, prompt[-self.max_length:],
                                       int(kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS)), self.runtime, stop)
                text = self.tokenizer.decode([t for t in tokens if t != self.eos_id])
                for s in until:
                    text = text.split(s)[0]
                out.append(text)
                self.cache_hook.add_partial("generate_until", r.args, text)
                bar.advance(len(prompt))
        return out
