"""eval.py's generation pieces on tiny checkpoints: --task generate, cache_prune --real-eviction, passkey through
the pruned KV cache."""
import json

import pytest
import torch

from eval import main
from fpa_lightning.generation.naive import greedy_without_cache

FAST = ["--n-boot", "200"]


def run(tmp_path, name, *argv):
    with open(main([*argv, "--out", str(tmp_path / name), *FAST])) as f:
        return json.load(f)


def test_generate_prints_the_continuation_and_its_speed(tmp_path, ckpts, capsys):
    r = run(tmp_path, "gen", "--task", "generate", "--ckpt", ckpts["fpa"], "--compare", ckpts["fox"],
            "--prompt", "And God said", "In the beginning God created", "--max-new-tokens", "5",
            "--prune-threshold", "-1")
    out = capsys.readouterr().out
    assert out.count("continuation: ") == 4 and "ms/step" in out and "kept fraction" in out
    for model in r["results"]["models"]:
        assert [len(ids) for ids in model["new_token_ids"]] == [5, 5]  # random tiny models never say </s> here
        assert 0 < model["stats"]["kept_fraction"] <= 1 and model["stats"]["cache_bytes"] > 0
    assert r["results"]["settings"]["prune_threshold"] == -1.0


def test_generate_is_greedy_decoding(tmp_path, ckpts, tokenizer, capsys):
    """The new token ids of each model and prompt (a batch of unequal lengths, through the KV cache) equal greedy
    decoding by full forward passes; the printed continuation is their text."""
    from fpa_lightning.evaluation.checkpoint import load_decoder
    from fpa_lightning.generation import continuation_text

    prompts = ["And God said", "In the beginning God created the heaven and the earth"]
    r = run(tmp_path, "greedy", "--task", "generate", "--ckpt", ckpts["fpa"], "--compare", ckpts["fox"],
            "--prompt", *prompts, "--max-new-tokens", "6")
    out = capsys.readouterr().out
    eos = tokenizer.token_to_id("</s>")
    for model, backend in zip(r["results"]["models"], ("fpa", "fox")):
        decoder = load_decoder(ckpts[backend], torch.device("cpu")).decoder
        for text, new_ids, continuation in zip(prompts, model["new_token_ids"], model["continuations"]):
            prompt = [1, *tokenizer.encode(text, add_special_tokens=False).ids]
            expected = greedy_without_cache(decoder, prompt, 6, eos)
            assert new_ids == expected, (backend, text)
            assert continuation == continuation_text(tokenizer, prompt, prompt + expected, (1, eos))
            assert f"continuation: {continuation}" in out
        assert model["stats"]["kept_fraction"] == 1.0  # nothing is evicted without --prune-threshold


@pytest.mark.parametrize("piece, docs, rows", [("24", 2, 1), ("170", 3, 2)])
def test_cache_prune_real_eviction_matches_the_simulation(tmp_path, ckpts, capsys, piece, docs, rows):
    """Each document's loss and the kept fraction through the real cache equal the simulation's. Pieces of 24: 80
    queries in 4 decoding passes (ending mid-document), one document per call; pieces of 170: two documents of 80
    queries per call, then the third alone."""
    r = run(tmp_path, "cp", "--task", "cache_prune", "--ckpt", ckpts["fpa"], "--compare", ckpts["sdpa"],
            "--lengths", "80", "--thresholds", "-2", "--passkey-lengths", "--max-docs", str(docs), "--real-eviction",
            "--block-rows", "32", "--piece-tokens", piece)
    # the estimate and the bar count the decoding passes too: per model each document unpruned, under the rule, and
    # through the KV cache under the rule; the bar's last line has every pass done, then the time against the estimate
    lines = capsys.readouterr().err.splitlines()
    passes = 2 * 3 * docs
    assert any(f"cache_prune: {passes} passes" in line for line in lines) and f"{passes}/{passes} passes" in lines[-2]
    assert lines[-1].startswith("cache_prune: took ") and "x the estimate)" in lines[-1]
    (entry,) = r["results"]["lengths"]
    for model in entry["models"]:
        (row,) = model["rules"]
        real = row["real_eviction"]
        assert real["kept_fraction"] == pytest.approx(row["kept_fraction"], abs=1e-5) and real["kept_fraction"] < 1
        assert real["max_abs_difference_from_simulation"] < 1e-4  # float32 rounding only, per document
        assert real["loss"]["estimate"] == pytest.approx(row["loss"]["estimate"], abs=1e-4)
        assert real["attention_impl"] == "naive"  # "auto" scores pieces with the einsums on a CPU
        assert real["piece_tokens"] == int(piece) and real["documents_per_pass"] == rows
        assert real["tokens"] == docs * 80 and real["tokens_per_second"] == pytest.approx(docs * 80 / real["seconds"])


def test_passkey_through_the_pruned_cache(tmp_path, ckpts):
    r = run(tmp_path, "pk", "--task", "passkey", "--ckpt", ckpts["fpa"], "--compare", ckpts["sdpa"],
            "--lengths", "128", "--trials", "2", "--prune-threshold", "-10", "--window", "32")
    assert r["results"]["scorer"] == "greedy decoding, pruned KV cache"
    fpa, sdpa = r["results"]["lengths"][0]["models"]
    assert fpa["rule"] == {"threshold": -10.0} and sdpa["rule"] == {"window": 32}
    assert fpa["n"] == sdpa["n"] == 2 and 0 < sdpa["kept_fraction"] < 1


@pytest.mark.parametrize("argv, message", [
    (["--task", "generate"], "needs --prompt"),
    (["--task", "passkey", "--prompt", "x"], "--prompt does not apply to --task passkey"),
    (["--task", "passkey", "--prune-threshold", "-10"], "needs --window"),
])
def test_generation_options_are_checked(ckpts, capsys, argv, message):
    with pytest.raises(SystemExit):
        main([*argv, "--ckpt", ckpts["sdpa"]])
    assert message in capsys.readouterr().err
