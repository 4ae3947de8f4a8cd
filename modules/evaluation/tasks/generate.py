"""generate: continue one or more prompts with the KV cache (``fpa_lightning.generation``), print the text and the
speed; with --prune-threshold, keys whose bias fell below it are evicted and the kept fraction is reported."""
from __future__ import annotations

import argparse

import torch

from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.data import EvalData
from fpa_lightning.evaluation.scoring import Runtime
from fpa_lightning.generation import cast_weights, continuation_text, generate
from fpa_lightning.generation.rule import check_rule, threshold_rule
from modules.evaluation.tasks.common import Task, TaskOutput, label

DEFAULT_NEW_TOKENS = 64


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--prompt", nargs="+", metavar="TEXT", help="generate: prompt text(s), a batch of "
                       "unequal lengths when several (each starts with BOS)")
    group.add_argument("--max-new-tokens", type=int, help=f"generate: tokens to add (default {DEFAULT_NEW_TOKENS})")
    group.add_argument("--temperature", type=float, help="generate: 0 = greedy (default); > 0 samples (with --seed)")
    group.add_argument("--top-k", type=int, help="generate: sample among the k most likely tokens")
    group.add_argument("--top-p", type=float, help="generate: sample among the smallest set reaching this probability")
    group.add_argument("--prune-threshold", type=float, help="generate: evict a cached key once its bias is below "
                       "this (e.g. -10)")


def check(args: argparse.Namespace, models: list[LoadedModel]) -> None:
    if not args.prompt:
        raise ValueError("--task generate needs --prompt TEXT")
    if args.max_new_tokens is not None and args.max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    rule = threshold_rule(args.prune_threshold)  # before any compute: the checks generate() makes
    for m in models:
        check_rule(m.decoder, rule)


def run(args: argparse.Namespace, models: list[LoadedModel], runtime: Runtime, data: EvalData) -> TaskOutput:
    settings = {"max_new_tokens": DEFAULT_NEW_TOKENS if args.max_new_tokens is None else args.max_new_tokens,
                "temperature": args.temperature or 0.0, "top_k": args.top_k, "top_p": args.top_p,
                "prune_threshold": args.prune_threshold}
    return generate_task(models, runtime, data, args.prompt, settings)


def generate_task(models: list[LoadedModel], runtime: Runtime, data: EvalData, texts: list[str],
                  settings: dict) -> TaskOutput:
    """Each model continues every prompt; prints prompt + continuation, then the speed and the cache."""
    tokenizer = data.tokenizer
    prompts = [torch.tensor([data.bos_id, *tokenizer.encode(t, add_special_tokens=False).ids]) for t in texts]
    eos_id = tokenizer.token_to_id("</s>")
    results, scalars = [], {}
    for i, m in enumerate(models):
        if runtime.precision == "bf16":
            cast_weights(m.decoder, torch.bfloat16)
        generator = torch.Generator(runtime.device).manual_seed(runtime.seed)
        ids, stats = generate(m.decoder, prompts, settings["max_new_tokens"], eos_id=eos_id, generator=generator,
                              return_stats=True, **{k: v for k, v in settings.items() if k != "max_new_tokens"})
        special = (data.bos_id, eos_id)
        continuations = [continuation_text(tokenizer, p.tolist(), row.tolist(), special)
                         for row, p in zip(ids, prompts)]
        print(f"--- {label(m, i)}")
        for text, continuation in zip(texts, continuations):
            print(f"prompt:       {text}\ncontinuation: {continuation}")
        print(speed_line(stats, len(prompts)))
        results.append({"label": label(m, i), "continuations": continuations,
                        "new_token_ids": [row[len(p):].tolist() for row, p in zip(ids, prompts)], "stats": stats})
        scalars[f"generate/{'AB'[i]}_ms_per_step"] = stats["ms_per_step"]
        scalars[f"generate/{'AB'[i]}_kept_fraction"] = stats["kept_fraction"]
    return TaskOutput({"prompts": texts, "settings": settings, "models": results}, {}, scalars)


def speed_line(stats: dict, rows: int) -> str:
    """Prefill and decode speed, and what the cache holds, on one line."""
    prefill = stats["prompt_tokens"] / max(stats["prefill_seconds"], 1e-9)
    line = (f"prefill {stats['prompt_tokens']} tokens in {stats['prefill_seconds']:.3f} s ({prefill:,.0f} tokens/s); "
            f"decode {stats['ms_per_step']:.2f} ms/step for {rows} row(s) "
            f"({rows * 1000 / stats['ms_per_step']:,.0f} tokens/s); ")
    return line + (f"cache {stats['cache_bytes'] / 2**20:.2f} MiB, kept fraction {stats['kept_fraction']:.3f}, "
                   f"state {100 * stats['state_fraction_of_kv']:.2f}% of K/V")


TASK = Task("continue --prompt with the KV cache; prints the text and the decode speed (--prune-threshold evicts)",
            frozenset({"prompt", "max_new_tokens", "temperature", "top_k", "top_p", "prune_threshold"}), run,
            check=check, add_arguments=add_arguments)
