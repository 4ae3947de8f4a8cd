"""cache_prune: loss increase and kept fraction when keys whose bias fell below a threshold are dropped (simulated
in the chunked forward pass, analysis.pruning, with the decoding runtime's rule, generation.rule), and pass-key
success under the first threshold. With --real-eviction the same documents also go through the real KV cache
(fpa_lightning.generation), which drops the keys from storage: its loss and kept fraction are reported beside the
simulation's."""
from __future__ import annotations

import argparse

import matplotlib.pyplot as plt
import numpy as np
import torch

from fpa_lightning.analysis.pruning import pruned_cache, window_for_fraction
from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.data import EvalData, long_documents_and_works
from fpa_lightning.evaluation.passkey import PasskeyBuilder
from fpa_lightning.evaluation.scoring import Runtime, check_vocab, token_losses
from fpa_lightning.evaluation.seeds import HIGHER_IS_BETTER, LOWER_IS_BETTER
from fpa_lightning.evaluation.stats import clopper_pearson
from fpa_lightning.generation.rule import PruneRule, check_rule
from fpa_lightning.generation.session import PIECE_TOKENS, cached_token_losses, default_piece_tokens, rows_per_pass
from modules.evaluation.progress import Progress, ScorePath, Work, start, timed
from modules.evaluation.tasks.common import (Task, TaskOutput, document_clusters, errorbar, intervals, label, metric,
                                             per_item)
from modules.evaluation.tasks.passkey import DEFAULT_TRIALS, score_all, trial_ids

DEFAULT_LENGTHS = [2048, 8192]
DEFAULT_THRESHOLDS = [-10.0, -20.0, -5.0, -2.0, -1.0]  # the first one also prunes the pass-key trials
DEFAULT_BLOCK_ROWS = 512  # query rows per block of the simulation: fewer, larger kernel launches than the layer's
#                           64-row blocks (its speed: BENCHMARKS.md, "Scoring with real eviction")


def run(args: argparse.Namespace, models: list[LoadedModel], runtime: Runtime, data: EvalData) -> TaskOutput:
    passkey_lengths = [8192, 16384] if args.passkey_lengths is None else args.passkey_lengths
    return cache_prune(models, runtime, data, args.lengths or DEFAULT_LENGTHS,
                       args.thresholds or DEFAULT_THRESHOLDS, args.window, passkey_lengths,
                       args.trials or DEFAULT_TRIALS, args.max_docs, real_eviction=bool(args.real_eviction),
                       block_rows=args.block_rows or DEFAULT_BLOCK_ROWS, piece_tokens=args.piece_tokens)


def add_arguments(group) -> None:
    group.add_argument("--real-eviction", action="store_const", const=True, help="cache_prune: also decode every "
                       "document through the real KV cache (keys evicted from storage) and report its loss and kept "
                       "fraction beside the simulation's, on the same documents")
    group.add_argument("--block-rows", type=int, help="cache_prune: query rows per block of the pruning simulation "
                       f"(default {DEFAULT_BLOCK_ROWS}); the results do not depend on it, its memory grows with it "
                       "(batch × heads × rows × length per temporary)")
    group.add_argument("--piece-tokens", type=int, help="cache_prune --real-eviction: tokens per decoding pass "
                       "through the KV cache (keys a query rejects are hidden from the later queries of its piece and "
                       "freed after it, so the results equal per-token eviction) (default: "
                       f"{PIECE_TOKENS['fpa_piece']} where every layer runs FPA's piece kernel, which holds no "
                       f"rows × keys tensor, else {PIECE_TOKENS['other']}); documents shorter than a piece are "
                       "scored together, as many as fill one; the results do not depend on it")


def check(args: argparse.Namespace, models: list[LoadedModel]) -> None:
    check_prune_setup(models, args.window)
    rules = [PruneRule(threshold=t) for t in args.thresholds or DEFAULT_THRESHOLDS]  # each threshold's one check
    if args.real_eviction:  # and the real cache's checks of the model (the simulation needs none)
        for m in filter(has_bias, models):
            for rule in rules:
                check_rule(m.decoder, rule)


def has_bias(model: LoadedModel) -> bool:
    return model.decoder.has_bias()


def _doc_losses(model: LoadedModel, docs: list, runtime: Runtime, bar: Progress, index: int,
                rule: PruneRule | None, block_rows: int) -> tuple[np.ndarray, dict]:
    """Mean loss per document, (N,), under `rule` (None: unpruned, on the same hooked path), and the kept stats."""
    losses = []
    with pruned_cache(model.decoder, rule, block_rows) as stats:
        for d in docs:
            losses.append(float(token_losses(model.decoder, d[None], runtime).mean()))
            bar.advance(d.numel(), index)
    return np.array(losses), stats.as_dict()


def _work(models: list[LoadedModel], docs_at: dict, n_rules: int, window: int | None,
          passkey_sizes: list[int], real_eviction: bool = False) -> list[Work]:
    """Per model: each document once unpruned and once per rule, then every pass-key trial once. With real eviction,
    each document once more per rule through the KV cache, a path of its own cost (``Work.model`` = number of models
    + the model's index, calibrated with ``_calibration_scores``)."""
    work = []
    sizes = [d.numel() for docs in docs_at.values() for d in docs]
    for i, m in enumerate(models):
        rules = 1 if window is not None and not has_bias(m) else n_rules
        work.append(Work(i, sizes * (1 + rules) + passkey_sizes))
        if real_eviction:
            work.append(Work(len(models) + i, sizes * rules))
    return work


def _calibration_rule(biased: bool, thresholds: list[float], window: int | None, lengths: list[int]) -> PruneRule:
    """The rule a model's passes are timed with: a biased model's first threshold; without a bias the given window,
    or a quarter of the shortest length."""
    if biased:
        return PruneRule(threshold=thresholds[0])
    return PruneRule(window=window or max(1, min(lengths) // 4))


def _calibration_scores(thresholds: list[float], window: int | None, lengths: list[int], runtime: Runtime,
                        block_rows: int, piece_tokens: int | None):
    """The two scores the estimate times, each under the model's calibration rule: the simulated passes'
    (``token_losses`` hooked with the rule in `block_rows` blocks, as ``_doc_losses`` runs them, not the model's own
    path in its configured blocks, whose cost differs) and, per model, the real KV cache's (``_decoded_losses`` on
    as many documents per call as ``_real_eviction`` batches)."""
    def rule(decoder) -> PruneRule:
        return _calibration_rule(decoder.has_bias(), thresholds, window, lengths)

    def hooked(decoder, ids: torch.Tensor) -> np.ndarray:
        with pruned_cache(decoder, rule(decoder), block_rows):
            return token_losses(decoder, ids, runtime)

    def decoded(model: LoadedModel) -> ScorePath:
        piece = piece_tokens or default_piece_tokens(model.decoder, rule(model.decoder))

        def score(decoder, ids: torch.Tensor) -> tuple:
            return _decoded_losses(decoder, ids, rule(decoder), runtime, piece)
        return ScorePath(model.decoder, score, lambda tokens: rows_per_pass(piece, tokens))
    return hooked, decoded


def _decoded_losses(decoder, ids: torch.Tensor, rule: PruneRule, runtime: Runtime, piece_tokens: int | None) -> tuple:
    """ids (1, L + 1) through the real KV cache under `rule`, `piece_tokens` queries per pass (None: the session's
    default): ``cached_token_losses``' losses (1, L) and session."""
    with runtime.autocast():
        return cached_token_losses(decoder, ids.to(runtime.device), rule, piece=piece_tokens)


def _rules(model: LoadedModel, thresholds: list[float], partner_fractions: list[float] | None,
           window: int | None, length: int) -> list[PruneRule]:
    """Threshold rules for a model with a bias; for one without, a sliding window: the given one, or per
    threshold the window whose mean kept fraction matches the partner model's."""
    if has_bias(model):
        return [PruneRule(threshold=t) for t in thresholds]
    if window is not None:
        return [PruneRule(window=window)]
    return [PruneRule(window=window_for_fraction(f, length)) for f in partner_fractions]


def check_prune_setup(models: list[LoadedModel], window: int | None) -> None:
    """Fail before any compute when a model without a bias has no window to compare with."""
    if window is None and not any(has_bias(m) for m in models):
        raise ValueError("cache_prune: a checkpoint without an attention bias (softmax) is pruned with a sliding "
                         "window; give --window, or --compare it with a checkpoint that has a bias (FPA, FoX) "
                         "to match that model's kept fraction")


def cache_prune(models: list[LoadedModel], runtime: Runtime, data: EvalData, lengths: list[int],
                thresholds: list[float], window: int | None, passkey_lengths: list[int], n_trials: int,
                max_docs: int | None, real_eviction: bool = False,
                block_rows: int = DEFAULT_BLOCK_ROWS, piece_tokens: int | None = None) -> TaskOutput:
    """Loss increase from dropping keys whose bias fell below each threshold (bootstrap over documents, paired
    with the unpruned pass on the same chunked path) and the mean fraction of keys kept; softmax gets a
    sliding window of the same mean kept fraction. Then pass-key success with the first threshold.
    real_eviction: each rule's row also gets ``real_eviction``, the same documents decoded through the KV cache,
    `piece_tokens` per pass (None: the session's default)."""
    check_prune_setup(models, window)
    order = sorted(range(len(models)), key=lambda i: not has_bias(models[i]))  # biased models first
    per_length, scalars, increases = [], {}, {}  # increases[length][i]: model i's per-document increase per rule
    read = {length: long_documents_and_works(data, length + 1, length + 1, max_docs) for length in lengths}
    docs_at = {length: docs for length, (docs, _) in read.items()}
    works_at = {length: works for length, (_, works) in read.items()}
    builder = PasskeyBuilder(data.tokenizer, data.bos_id)
    passkey_sizes = [t.length for n in passkey_lengths for t in builder.trials(n, n_trials, runtime.seed)]
    hooked, decoded = _calibration_scores(thresholds, window, lengths, runtime, block_rows, piece_tokens)
    bar = start("cache_prune", [m.decoder for m in models],
                _work(models, docs_at, len(thresholds), window, passkey_sizes, real_eviction), hooked,
                paths=[decoded(m) for m in models] if real_eviction else (),
                shorten="fewer --max-docs, --lengths, --thresholds, --passkey-lengths or --trials",
                unit="passes")
    for length, docs in docs_at.items():
        entry = {"length": length, "documents": len(docs), "models": [None] * len(models)}
        fractions = None
        for i in order:
            m = models[i]
            check_vocab(m.decoder, max(int(d.max()) for d in docs))
            bar.set_stage(f"{length} {'AB'[i]}")
            # the same hooked path with every key kept: pairs with each pruned pass
            base, _ = _doc_losses(m, docs, runtime, bar, i, None, block_rows)
            rows = []
            for rule in _rules(m, thresholds, fractions, window, length):
                losses, kept = _doc_losses(m, docs, runtime, bar, i, rule, block_rows)
                increases.setdefault(length, [[] for _ in models])[i].append((rule, losses - base))
                rows.append({"rule": rule.describe(), "loss": intervals(losses, runtime)[0].as_dict(),
                             "increase": intervals(losses - base, runtime)[0].as_dict(), **kept})
                if real_eviction:
                    rows[-1]["real_eviction"] = _real_eviction(m, docs, rule, runtime, base, losses, bar,
                                                                len(models) + i, piece_tokens)
                    scalars[f"cache_prune/{'AB'[i]}_real_kept/{length}/{_rule_tag(rule)}"] = \
                        rows[-1]["real_eviction"]["kept_fraction"]
                scalars[f"cache_prune/{'AB'[i]}_increase/{length}/{_rule_tag(rule)}"] = rows[-1]["increase"]["estimate"]
                scalars[f"cache_prune/{'AB'[i]}_kept/{length}/{_rule_tag(rule)}"] = kept["kept_fraction"]
            if has_bias(m) and fractions is None:
                fractions = [r["kept_fraction"] for r in rows]
            entry["models"][i] = {"label": label(m, i), "unpruned_loss": intervals(base, runtime)[0].as_dict(),
                                  "rules": rows}
        per_length.append(entry)
    results = {"lengths": per_length,
               "passkey": _pruned_passkey(models, order, runtime, builder, thresholds[0], window, passkey_lengths,
                                          n_trials, bar, block_rows)}
    bar.close()
    items = [d for docs in docs_at.values() for d in docs] + [
        t.input_ids for n in passkey_lengths for t in builder.trials(n, n_trials, runtime.seed)]
    results["per_item"] = per_item("document", items, document_clusters(next(iter(works_at.values())), [])[0],
                                   _item_metrics(increases, works_at, results["passkey"], len(models)))
    for e in results["passkey"]:
        for i, r in enumerate(e["models"]):
            scalars[f"cache_prune/{'AB'[i]}_passkey/{e['length']}"] = r["rate"]["estimate"]
    return TaskOutput(results, {"cache_prune": _plot_prune(results)}, scalars)


def _real_eviction(model: LoadedModel, docs: list, rule: PruneRule, runtime: Runtime, base: np.ndarray,
                   simulated: np.ndarray, bar: Progress, path: int, piece_tokens: int | None) -> dict:
    """The documents (of one length) through the real KV cache under `rule`, ``rows_per_pass`` of them per call: loss,
    increase over the unpruned pass, kept fraction (every query, as the simulation counts it), allocated cache bytes
    at the end per document, the largest difference of a document's loss from the simulation's (rounding only: the
    two compute the same thing), the attention over the cache that ran (``DecodeSession.piece_attention_impl_used``),
    its tokens per piece and documents per call, and the tokens scored per second of this path alone (synchronised
    wall time, the speed issue #25 sets a goal for)."""
    piece = piece_tokens or default_piece_tokens(model.decoder, rule)
    rows = rows_per_pass(piece, docs[0].numel())
    losses, kept, cache_bytes, impls = [], [], [], set()
    tokens, seconds = 0, 0.0
    for first in range(0, len(docs), rows):
        batch = torch.stack(docs[first : first + rows])  # (b, L + 1): the task's documents have one length
        (per_token, session), took = timed(runtime.device, _decoded_losses, model.decoder, batch, rule, runtime, piece)
        seconds += took
        tokens += per_token.numel()
        impls.add(session.piece_attention_impl_used)
        losses += per_token.mean(dim=1).tolist()
        stats = session.stats()
        # the batch's counts: with rows of one length, its kept fraction is the mean of the documents' own
        kept += [stats["kept_per_query"]["kept_fraction"]] * len(batch)
        cache_bytes += [stats["cache_bytes"] / len(batch)] * len(batch)
        for doc in batch:
            bar.advance(doc.numel(), path)
    losses = np.array(losses)
    return {"loss": intervals(losses, runtime)[0].as_dict(), "increase": intervals(losses - base, runtime)[0].as_dict(),
            "kept_fraction": float(np.mean(kept)), "cache_bytes": float(np.mean(cache_bytes)),
            "max_abs_difference_from_simulation": float(np.abs(losses - simulated).max()),
            "attention_impl": ", ".join(sorted(impls)), "piece_tokens": piece, "documents_per_pass": rows,
            "tokens": tokens, "seconds": seconds, "tokens_per_second": tokens / max(seconds, 1e-9)}


def _item_metrics(increases: dict, works_at: dict, passkey: list[dict], n_models: int) -> list[dict]:
    """The cost per document of each rule at each length (the loss increase over the unpruned pass; A's k-th rule
    pairs with B's k-th, softmax's window matched to it), named by A's rule, documents clustered by work where the
    data know it; then pass-key success per trial."""
    metrics = []
    for length, per_model in increases.items():
        docs = [f"{length}/doc{j}" for j in range(len(per_model[0][0][1]))]
        clusters = document_clusters(works_at[length], docs)[1]
        for k in range(min(len(rules) for rules in per_model)):
            metrics.append(metric(f"increase/{length}/{_rule_tag(per_model[0][k][0])}", LOWER_IS_BETTER, docs,
                                  [rules[k][1] for rules in per_model], clusters))
    for entry in passkey:
        metrics.append(metric(f"passkey/{entry['length']}", HIGHER_IS_BETTER,
                              trial_ids(entry["length"], entry["models"][0]["n"]),
                              [entry["models"][i]["success"] for i in range(n_models)]))
    return metrics


def _rule_tag(rule: PruneRule) -> str:
    return f"threshold{rule.threshold:g}" if rule.window is None else f"window{rule.window}"


def _pruned_passkey(models: list[LoadedModel], order: list[int], runtime: Runtime, builder: PasskeyBuilder,
                    threshold: float, window: int | None, lengths: list[int], n_trials: int,
                    bar: Progress, block_rows: int) -> list[dict]:
    """Pass-key success with the primary threshold (softmax: the window of the partner's kept fraction)."""
    out = []
    for length in lengths:
        trials = builder.trials(length, n_trials, runtime.seed)
        entry, fraction = {"length": length, "models": [None] * len(models)}, None
        for i in order:
            m = models[i]
            check_vocab(m.decoder, max(int(t.input_ids.max()) for t in trials))
            rule = _rules(m, [threshold], [fraction] if fraction is not None else None, window, length)[0]
            bar.set_stage(f"pass key {length} {'AB'[i]}")
            with pruned_cache(m.decoder, rule, block_rows) as stats:
                wins = [s.success for s in score_all(m, trials, runtime, bar, i)]
            kept = stats.as_dict()
            fraction = kept["kept_fraction"] if fraction is None and has_bias(m) else fraction
            entry["models"][i] = {"label": label(m, i), "rule": rule.describe(), "successes": sum(wins),
                                  "n": len(wins), "rate": clopper_pearson(sum(wins), len(wins), runtime.confidence).as_dict(),
                                  "success": wins, **kept}
        out.append(entry)
    return out


def _plot_prune(results: dict) -> plt.Figure:
    n = len(results["lengths"])
    fig, axes = plt.subplots(1, n, figsize=(5.5 * n, 4), squeeze=False)
    for ax, entry in zip(axes[0], results["lengths"]):
        for r in entry["models"]:
            rows = sorted(r["rules"], key=lambda row: row["kept_fraction"])  # a curve, whatever the sweep order
            kept = [row["kept_fraction"] for row in rows]
            errorbar(ax, kept, [row["increase"] for row in rows], label=r["label"])
            for x, row in zip(kept, rows):
                ax.annotate(f"{next(iter(row['rule'].values())):g}", (x, row["increase"]["estimate"]),
                            fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.axhline(0, color="grey")
        ax.set(xlabel="mean fraction of keys kept", ylabel="loss increase (nats)",
               title=f"cache pruning at {entry['length']} tokens ({entry['documents']} docs)")
        ax.legend()
    fig.tight_layout()
    return fig


TASK = Task("loss increase and kept fraction when keys whose bias fell below a threshold are dropped",
            frozenset({"lengths", "trials", "thresholds", "window", "passkey_lengths", "max_docs", "data",
                       "real_eviction", "block_rows", "piece_tokens"}), run, check=check, impl="chunked",
            add_arguments=add_arguments,
            option_help={
                "lengths": f"cache_prune: evaluation lengths (default {' '.join(map(str, DEFAULT_LENGTHS))})",
                "trials": f"cache_prune: pass-key trials per length under pruning (default {DEFAULT_TRIALS})",
                "max_docs": "cache_prune: at most this many documents per length",
                "window": "cache_prune: sliding window for a checkpoint without a bias (default: matched to the "
                          "compared model's kept fraction)"})
