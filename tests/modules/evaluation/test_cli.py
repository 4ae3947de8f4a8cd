"""eval.py end to end on tiny checkpoints: every task writes its JSON and PNG; bad arguments are clear errors."""
import dataclasses
import json
import math
import os
import shutil

import pytest
import torch

from eval import main

FAST = ["--n-boot", "200"]


def run(tmp_path, name, *argv):
    out = tmp_path / name
    path = main([*argv, "--out", str(out), *FAST])
    with open(path) as f:
        record = json.load(f)  # strict JSON (no NaN / Infinity literals)
    for png in record["figures"].values():
        assert os.path.getsize(out / png) > 1000  # named beside the JSON
    assert record["versions"]["torch"] and record["versions"]["lightning"]
    return record


def words(n: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    vocab = "the king said unto them that he would go and see the city of david in the morning".split()
    return " ".join(rng.choice(vocab) for _ in range(n))


def item_metrics(results: dict, unit: str, n_models: int) -> dict:
    """The per-item record every comparing task keeps (for eval.py seeds): its unit, a 16-hex fingerprint of the
    items, and per metric a value per model and item id (NaN, read back from "nan", where an item has none)."""
    items = results["per_item"]
    assert items["unit"] == unit and len(items["fingerprint"]) == 16 and items["cluster_by"]
    out = {}
    for m in items["metrics"]:
        assert m["direction"] in ("lower", "higher") and len(m["clusters"]) == len(m["ids"]) == len(set(m["ids"]))
        assert len(m["values"]) == n_models and all(len(v) == len(m["ids"]) for v in m["values"])
        out[m["name"]] = [[float(x) for x in v] for v in m["values"]]
    return out


def decoder_of(path):
    from fpa_lightning.evaluation.checkpoint import load_decoder

    return load_decoder(path, torch.device("cpu")).decoder


@torch.no_grad()
def next_token_nll(decoder, ids: torch.Tensor) -> torch.Tensor:
    """The reference loss: ids (B, L) -> (B, L − 1) float64, −log softmax of the full forward's logits at the next
    token (not the tasks' chunked token_losses)."""
    logits = decoder(ids[:, :-1]).double()
    return -logits.log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]


def bucket_reference(decoder, docs: list[torch.Tensor], edges: list[int]) -> list[float]:
    """Per bucket [a, b) of input positions: each document's mean loss over the positions it has there, then the
    mean over the documents that reach the bucket."""
    per_doc = [next_token_nll(decoder, doc[None])[0] for doc in docs]
    out = []
    for a, b in zip(edges, edges[1:]):
        means = [float(nll[a:b].mean()) for nll in per_doc if nll.numel() > a]
        out.append(sum(means) / len(means))
    return out


def test_pg19_long_on_the_offline_corpus_with_compare(tmp_path, ckpts):
    from datamodules import EvalCorpus

    r = run(tmp_path, "pg", "--task", "pg19_long", "--ckpt", ckpts["fpa"], "--compare", ckpts["fox"],
            "--max-len", "128", "--max-docs", "3")
    res = r["results"]
    assert res["buckets"] == [[0, 2], [2, 4], [4, 8], [8, 16], [16, 32], [32, 64], [64, 128]]
    assert res["documents"] == 3 and res["books_per_bucket"] == [3] * 7
    assert [m["label"] for m in res["models"]] == ["A: fpa", "B: fox"]
    # every bucket's loss is the full forward's mean next-token loss there, on the same documents
    docs = EvalCorpus(None).long_documents(129, 129, 3)
    assert [d.numel() for d in docs] == res["document_tokens"] == [129] * 3
    edges = [0, 2, 4, 8, 16, 32, 64, 128]
    for model, backend in zip(res["models"], ("fpa", "fox")):
        expected = bucket_reference(decoder_of(ckpts[backend]), docs, edges)
        assert [iv["estimate"] for iv in model["loss"]] == pytest.approx(expected, rel=1e-5, abs=1e-5), backend
        assert all(iv["lower"] <= iv["estimate"] <= iv["upper"] for iv in model["loss"])
    for a, b, d in zip(res["models"][0]["loss"], res["models"][1]["loss"], res["difference"]):
        assert d["estimate"] == pytest.approx(a["estimate"] - b["estimate"])
        assert d["lower"] <= d["estimate"] <= d["upper"]
    assert r["checkpoint"]["backend"] == "fpa" and r["compare"]["backend"] == "fox"
    assert "offline" in r["data"]["source"]
    # per document and bucket; books weighted equally, so each bucket's loss is the mean over its documents
    per_doc = item_metrics(res, "document", 2)
    assert list(per_doc) == [f"loss/{a}-{b}" for a, b in zip(edges, edges[1:])]
    assert "no work id" in res["per_item"]["cluster_by"]
    for k, values in enumerate(per_doc.values()):
        for model, docs in zip(res["models"], values):
            assert len(docs) == 3 and model["loss"][k]["estimate"] == pytest.approx(sum(docs) / 3)


def test_pg19_long_on_local_parquet_with_custom_buckets(tmp_path, ckpts, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from datamodules import BOS_ID, EOS_ID

    folder = tmp_path / "pg19" / "data"
    folder.mkdir(parents=True)
    books = [words(300, i) for i in range(3)]
    pq.write_table(pa.table({"text": books + ["too short"]}), folder / "test-00000.parquet")
    r = run(tmp_path, "pg_local", "--task", "pg19_long", "--ckpt", ckpts["fpa"], "--data", str(tmp_path / "pg19"),
            "--max-len", "96", "--buckets", "0", "64", "96")
    assert r["results"]["documents"] == 3  # the short book is skipped (min tokens = max_len + 1)
    assert r["results"]["buckets"] == [[0, 64], [64, 96]] and "difference" not in r["results"]
    # the reference reads the books itself: [BOS] text [EOS] with the tokenizer, the first 97 tokens
    docs = [torch.tensor([BOS_ID, *tokenizer.encode(text).ids, EOS_ID])[:97] for text in books]
    expected = bucket_reference(decoder_of(ckpts["fpa"]), docs, [0, 64, 96])
    assert [iv["estimate"] for iv in r["results"]["models"][0]["loss"]] == pytest.approx(expected, rel=1e-5)


class CopyDecoder(torch.nn.Module):
    """A checkpoint's Decoder whose predictions are replaced by a copying rule that solves the pass key by itself: at
    t it finds the latest earlier j within the last `window` tokens whose trigram ends like t's and predicts the token
    after j (all-zero logits, so token 0, when none is found). A window longer than the prompt answers every trial;
    a window of 0 answers none; a window of 60 misses keys deeper than that. Everything else (config, parameters,
    implementations) is the real Decoder's, so the command line runs unchanged."""

    def __init__(self, decoder, window: int, vocab_size: int = 32000):
        super().__init__()
        self.inner, self.window = decoder, window
        self.vocab_size = vocab_size if decoder is None else decoder.cfg.vocab_size
        self.lm_head = torch.nn.Identity()

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner, name)

    def features(self, ids: torch.Tensor, segment_ids=None) -> torch.Tensor:
        logits = torch.zeros(*ids.shape, self.vocab_size)
        for b, seq in enumerate(ids.tolist()):
            for t in range(2, len(seq)):
                for j in range(t - 1, max(1, t - self.window), -1):
                    if seq[j - 2 : j + 1] == seq[t - 2 : t + 1]:
                        logits[b, t, seq[j + 1]] = 1.0
                        break
        return logits


def greedy_answer(model, prompt: torch.Tensor, steps: int) -> list[int]:
    """The reference: append the argmax of the last position, one token at a time."""
    ids, out = prompt[None].clone(), []
    for _ in range(steps):
        nxt = model.lm_head(model.features(ids))[0, -1].argmax()
        out.append(int(nxt))
        ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return out


def test_passkey_with_compare(tmp_path, ckpts, monkeypatch, tokenizer):
    """Success per trial, rates and McNemar counts against greedy decoding of models built to answer: A copies within
    60 tokens (some keys are deeper), B copies from anywhere (every key)."""
    from modules.evaluation import cli
    from fpa_lightning.evaluation.passkey import PasskeyBuilder

    windows = {ckpts["fpa"]: 60, ckpts["sdpa"]: 10**6}
    real_load = cli.load_decoder

    def load_forced(path, device, impl=None):
        loaded = real_load(path, device, impl)
        return dataclasses.replace(loaded, decoder=CopyDecoder(loaded.decoder, windows[path]))

    monkeypatch.setattr(cli, "load_decoder", load_forced)
    r = run(tmp_path, "pk", "--task", "passkey", "--ckpt", ckpts["fpa"], "--compare", ckpts["sdpa"],
            "--lengths", "128", "160", "--trials", "4", "--seed", "3")
    lengths = r["results"]["lengths"]
    assert [e["length"] for e in lengths] == [128, 160]
    builder = PasskeyBuilder(tokenizer, bos_id=1)
    pooled = {"both": 0, "neither": 0, "a_only": 0, "b_only": 0}
    for e in lengths:
        trials = builder.trials(e["length"], 4, seed=3)
        assert [(t["key"], t["depth"], t["tokens"]) for t in e["trials"]] == [(t.key, t.depth, t.length) for t in trials]
        expected = []
        for window in (60, 10**6):
            model = CopyDecoder(None, window)
            expected.append([greedy_answer(model, t.input_ids[: t.prompt_len], t.answer.numel()) == t.answer.tolist()
                             for t in trials])
        for m, wins in zip(e["models"], expected):
            assert m["success"] == wins and m["successes"] == sum(wins) and m["n"] == 4
            assert m["rate"]["estimate"] == sum(wins) / 4
            assert m["rate"]["lower"] <= m["rate"]["estimate"] <= m["rate"]["upper"]
        assert all(expected[1])  # B, copying from anywhere, answers every trial
        a, b = expected
        counts = {"both": sum(x and y for x, y in zip(a, b)), "neither": sum(not x and not y for x, y in zip(a, b)),
                  "a_only": sum(x and not y for x, y in zip(a, b)), "b_only": sum(y and not x for x, y in zip(a, b))}
        assert {k: e["mcnemar"][k] for k in counts} == counts
        pooled = {k: pooled[k] + counts[k] for k in counts}
    assert {k: r["results"]["mcnemar_pooled"][k] for k in pooled} == pooled
    per_trial = item_metrics(r["results"], "trial", 2)
    assert list(per_trial) == ["success/128", "success/160"]
    for e in lengths:
        assert per_trial[f"success/{e['length']}"] == [[float(w) for w in m["success"]] for m in e["models"]]
    assert 0 < pooled["both"] and 0 < pooled["b_only"]  # A both finds and misses keys: its outcomes are mixed


@pytest.fixture
def slim(tmp_path):
    import zstandard

    chunk = tmp_path / "slim" / "test" / "chunk1"
    chunk.mkdir(parents=True)
    lines = "".join(json.dumps({"text": words(120, i), "meta": {}}) + "\n" for i in range(6)).encode()
    (chunk / "example_test_0.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    return tmp_path / "slim"


@pytest.fixture
def worse_ckpt(tmp_path, ckpts):
    """The fpa checkpoint with its final norm scaled by 30: the same model made far more confident, so its loss on
    text is much higher (a checkpoint that is clearly worse, for a known verdict)."""
    ckpt = torch.load(ckpts["fpa"], weights_only=True)
    ckpt["state_dict"]["model.norm.weight"] = ckpt["state_dict"]["model.norm.weight"] * 30
    path = tmp_path / "worse.ckpt"
    torch.save(ckpt, path)
    return str(path)


def test_test_loss_on_slimpajama_layout_keeps_every_row(tmp_path, ckpts, slim, worse_ckpt):
    """The losses are the full forward's mean loss per sequence, each row's kept (per_item) with a fingerprint of
    the rows' token ids; one pair gives the paired interval and no verdict (evaluation noise only), also in cases
    with a known answer: A against itself (difference exactly 0), A against a clearly worse B and the reverse."""
    from datamodules import EvalCorpus
    from fpa_lightning.evaluation.seeds import fingerprint, token_digest

    r = run(tmp_path, "tl", "--task", "test_loss", "--ckpt", ckpts["fpa"], "--compare", ckpts["fox"],
            "--data", str(slim), "--seq-len", "32", "--max-docs", "10", "--margin", "0.5")
    res = r["results"]
    assert res["sequences"] == 10 and res["seq_len"] == 32 and res["margin"] == 0.5
    sequences = torch.cat([torch.cat([b["input_ids"], b["labels"][:, -1:]], dim=1)
                           for b in EvalCorpus(str(slim)).test_sequences(32, 4, 10)])
    assert sequences.shape == (10, 33)
    items = res["per_item"]
    assert items["unit"] == "row" and items["fingerprint"] == fingerprint([token_digest(row) for row in sequences])
    (loss,) = items["metrics"]
    assert loss["name"] == "loss" and loss["direction"] == "lower" and loss["ids"] == [f"row{i}" for i in range(10)]
    for model, backend, rows in zip(res["models"], ("fpa", "fox"), loss["values"]):
        per_sequence = next_token_nll(decoder_of(ckpts[backend]), sequences).mean(dim=1)
        assert rows == pytest.approx(per_sequence.tolist(), rel=1e-5), backend
        assert model["loss"]["estimate"] == pytest.approx(float(per_sequence.mean()), rel=1e-6), backend
    d = res["difference"]
    assert d["estimate"] == pytest.approx(res["models"][0]["loss"]["estimate"] - res["models"][1]["loss"]["estimate"])
    assert res["verdict"] is None and "evaluation noise only" in res["note"]
    for name, a, b, sign in (("same", ckpts["fpa"], ckpts["fpa"], 0), ("better", ckpts["fpa"], worse_ckpt, -1),
                             ("worse", worse_ckpt, ckpts["fpa"], 1)):
        res = run(tmp_path, f"tl_{name}", "--task", "test_loss", "--ckpt", a, "--compare", b, "--data", str(slim),
                  "--seq-len", "32", "--max-docs", "10", "--margin", "0.5")["results"]
        assert res["verdict"] is None, name
        interval = res["difference"]
        assert (interval["lower"] == interval["upper"] == 0) if sign == 0 else (sign * interval["lower"] > 0
                                                                                and sign * interval["upper"] > 0)


def test_test_loss_offline_default_seq_len(tmp_path, ckpts):
    r = run(tmp_path, "tl_off", "--task", "test_loss", "--ckpt", ckpts["fox"], "--max-docs", "3")
    assert r["results"]["seq_len"] == 64 and r["results"]["sequences"] == 3  # the model's training context


def test_cache_prune_fpa_against_a_matched_window_softmax(tmp_path, ckpts):
    r = run(tmp_path, "cp", "--task", "cache_prune", "--ckpt", ckpts["fpa"], "--compare", ckpts["sdpa"],
            "--lengths", "64", "96", "--thresholds", "-10", "-1", "--passkey-lengths", "128", "--trials", "2",
            "--max-docs", "2")
    assert r["checkpoint"]["impl_per_layer"] == ["fpa:chunked"] * 2
    for e in r["results"]["lengths"]:
        fpa, sdpa = e["models"]
        assert [row["rule"] for row in fpa["rules"]] == [{"threshold": -10.0}, {"threshold": -1.0}]
        assert all("window" in row["rule"] for row in sdpa["rules"])
        for f_row, s_row in zip(fpa["rules"], sdpa["rules"]):
            assert 0 < f_row["kept_fraction"] <= 1 and f_row["revived_pairs"] == 0
            assert s_row["kept_fraction"] == pytest.approx(f_row["kept_fraction"], abs=0.1)  # matched mean size
    (pk,) = r["results"]["passkey"]
    assert pk["length"] == 128 and pk["models"][0]["rule"] == {"threshold": -10.0} and pk["models"][0]["n"] == 2
    # the cost per document of each threshold (softmax: its matched window), named by A's rule; pass keys per trial
    per_doc = item_metrics(r["results"], "document", 2)
    assert list(per_doc) == [f"increase/{n}/threshold{t}" for n in (64, 96) for t in (-10, -1)] + ["passkey/128"]
    for e in r["results"]["lengths"]:
        for k, t in enumerate((-10, -1)):
            for model, docs in zip(e["models"], per_doc[f"increase/{e['length']}/threshold{t}"]):
                assert len(docs) == 2 and sum(docs) / 2 == pytest.approx(model["rules"][k]["increase"]["estimate"])
    assert per_doc["passkey/128"] == [[float(w) for w in m["success"]] for m in pk["models"]]


def test_ruler_with_compare(tmp_path, ckpts, capsys):
    tasks = ["niah_multivalue", "vt"]
    r = run(tmp_path, "ruler", "--task", "ruler", "--ckpt", ckpts["fpa"], "--compare", ckpts["fox"],
            "--lengths", "512", "768", "--trials", "2", "--ruler-tasks", *tasks)
    res = r["results"]
    assert [(row["task"], row["length"]) for row in res["tasks"]] == [(t, n) for n in (512, 768) for t in tasks]
    for row in res["tasks"]:
        assert len(row["items"]) == 2 and all(item["tokens"] <= row["length"] for item in row["items"])
        for m in row["models"]:
            assert m["n"] == 2 and m["complete"] == sum(s == 1.0 for s in m["scores"])
            assert m["score"]["estimate"] == pytest.approx(sum(m["scores"]) / 2)
            assert m["complete_rate"]["lower"] <= m["complete_rate"]["estimate"] <= m["complete_rate"]["upper"]
        assert set(row["mcnemar"]) >= {"p_two_sided", "p_a_better"}
    for avg in res["average"]:
        for i, m in enumerate(avg["models"]):
            rows = [row for row in res["tasks"] if row["length"] == avg["length"]]
            assert m["score"] == pytest.approx(sum(row["models"][i]["score"]["estimate"] for row in rows) / len(tasks))
    assert "greedy generation through the KV cache" in res["scoring"] and "King James" in r["data"]["source"]
    per_item = item_metrics(res, "item", 2)
    assert list(per_item) == [f"score/{t}/{n}" for n in (512, 768) for t in tasks] + ["score/average/512",
                                                                                        "score/average/768"]
    for row in res["tasks"]:
        assert per_item[f"score/{row['task']}/{row['length']}"] == [m["scores"] for m in row["models"]]
    assert res["per_item"]["metrics"][0]["ids"] == ["niah_multivalue/512/0", "niah_multivalue/512/1"]
    out = capsys.readouterr().out
    assert "string-match score (A: fpa / B: fox)" in out and "average" in out and "McNemar p" in out


def test_babilong_single_model(tmp_path, ckpts):
    r = run(tmp_path, "babi", "--task", "babilong", "--ckpt", ckpts["sdpa"], "--lengths", "512", "--trials", "2",
            "--qa", "qa1", "qa4", "--max-docs", "2")
    res = r["results"]
    assert [row["task"] for row in res["tasks"]] == ["qa1", "qa4"] and res["book_documents"] == 2
    assert all(len(row["items"][0]["facts"]) >= 2 for row in res["tasks"])
    assert "mcnemar" not in res["tasks"][0] and "B_score" not in str(r["results"]["average"])
    per_item = item_metrics(res, "item", 1)
    assert list(per_item) == ["score/qa1/512", "score/qa4/512", "score/average/512"]
    pooled = [s for row in res["tasks"] for s in row["models"][0]["scores"]]
    assert per_item["score/average/512"] == [pooled]


def test_tensorboard_logging(tmp_path, ckpts):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run(tmp_path, "tb", "--task", "passkey", "--ckpt", ckpts["fpa"], "--lengths", "128", "--trials", "2",
        "--tensorboard", str(tmp_path / "tb"))
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert "passkey/A_success_rate/128" in acc.Tags()["scalars"]
    assert acc.Scalars("passkey/A_success_rate/128")[0].step == 1  # the checkpoint's global step
    assert acc.Tags()["images"] == ["passkey"]


def test_impl_override_is_recorded(tmp_path, ckpts):
    r = run(tmp_path, "naive", "--task", "passkey", "--ckpt", ckpts["fox"], "--impl", "naive",
            "--lengths", "128", "--trials", "1")
    assert r["checkpoint"]["impl_per_layer"] == ["fox:naive"] * 2


def error_of(capsys, argv) -> str:
    """The error line of a refused command: exit code 2 and exactly one line ``eval.py: error: ...``."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("eval.py: error: ")]
    assert len(lines) == 1, lines
    return lines[0]


def test_bad_arguments_are_clear_errors(tmp_path, ckpts, capsys):
    fpa, sdpa = ckpts["fpa"], ckpts["sdpa"]
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    import torch

    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"lr": 1.0}}, foreign)
    real = torch.load(fpa, weights_only=True)
    other_shape = tmp_path / "other_shape.ckpt"  # hyper-parameters of a wider MLP than the weights
    torch.save({**real, "hyper_parameters": {**real["hyper_parameters"],
                                             "model": {**real["hyper_parameters"]["model"], "d_mlp": 96}}}, other_shape)
    fewer = tmp_path / "fewer_layers.ckpt"  # the weights of one layer missing
    torch.save({**real, "state_dict": {k: v for k, v in real["state_dict"].items() if ".blocks.1." not in k}}, fewer)
    renamed = tmp_path / "renamed.ckpt"  # a hyper-parameter this version does not know
    torch.save({**real, "hyper_parameters": {**real["hyper_parameters"],
                                             "model": {**real["hyper_parameters"]["model"], "n_layers": 2}}}, renamed)
    pickled = tmp_path / "pickled.ckpt"  # an object that needs unpickling code (refused by weights_only)
    torch.save({**real, "extra": torch.nn.Identity()}, pickled)
    fix = "evaluate it with the code that trained it"
    cases = [
        (["--task", "perplexity", "--ckpt", fpa], "invalid choice: 'perplexity'"),
        (["--task", "passkey", "--ckpt", str(tmp_path / "missing.ckpt")], "does not exist"),
        (["--task", "passkey", "--ckpt", str(garbage)], "cannot read checkpoint"),
        (["--task", "passkey", "--ckpt", str(pickled)], "Unsupported global"),
        (["--task", "passkey", "--ckpt", str(foreign)], "no 'model' hyper-parameters"),
        (["--task", "passkey", "--ckpt", str(other_shape)], "tensors of another shape"),
        (["--task", "passkey", "--ckpt", fpa, "--compare", str(fewer)], "missing 9 ("),
        (["--task", "passkey", "--ckpt", str(renamed)], "unexpected keyword argument 'n_layers'"),
        (["--task", "passkey", "--ckpt", fpa, "--margin", "0.01"], "--margin does not apply to --task passkey"),
        (["--task", "test_loss", "--ckpt", fpa, "--margin", "0.01"], "--margin needs --compare"),
        (["--task", "cache_prune", "--ckpt", fpa, "--block-rows", "0"], "--block-rows must be a positive integer, got 0"),
        (["--task", "cache_prune", "--ckpt", fpa, "--piece-tokens", "0"], "--piece-tokens must be a positive integer"),
        (["--task", "passkey", "--ckpt", fpa, "--piece-tokens", "8"], "--piece-tokens does not apply to --task passkey"),
        (["--task", "passkey", "--ckpt", fpa, "--lengths", "0"], "--lengths has invalid values [0]"),
        (["--task", "cache_prune", "--ckpt", fpa, "--thresholds", "nan"], "--thresholds: prune_threshold must be a number"),
        (["--task", "cache_prune", "--ckpt", fpa, "--thresholds", "-5", "2"], "--thresholds: prune_threshold must be <= 0"),
        (["--task", "passkey", "--ckpt", fpa, "--lengths", "40", "--trials", "1"], "too short"),
        (["--task", "pg19_long", "--ckpt", fpa, "--max-len", "64", "--buckets", "0", "80"], "bucket edges"),
        (["--task", "pg19_long", "--ckpt", fpa, "--data", str(tmp_path / "nowhere")], "does not exist"),
        (["--task", "cache_prune", "--ckpt", sdpa], "sliding window"),
        (["--task", "cache_prune", "--ckpt", fpa, "--impl", "naive"], "--impl must be chunked"),
        (["--task", "passkey", "--ckpt", fpa, "--impl", "fused"], "needs a CUDA GPU"),
        (["--task", "passkey", "--ckpt", fpa, "--device", "cuda"], "no CUDA device"),
    ]
    for argv, message in cases:
        if "CUDA" in message and torch.cuda.is_available():
            continue
        line = error_of(capsys, argv)
        assert message in line, argv
        checkpoint = argv[-1] if "--compare" in argv else argv[argv.index("--ckpt") + 1]
        if checkpoint.startswith(str(tmp_path)):  # a bad checkpoint: named, with what to do
            assert repr(checkpoint) in line and ("train.py" in line or fix in line), line


def test_a_parquet_without_the_text_column_is_a_clear_error(tmp_path, ckpts, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "pg19" / "data"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"body": [words(300, 0)]}), folder / "test-00000.parquet")
    line = error_of(capsys, ["--task", "pg19_long", "--ckpt", ckpts["fpa"], "--data", str(tmp_path / "pg19"),
                             "--max-len", "64", "--out", str(tmp_path / "out")])
    assert "no column 'text'" in line and "test-00000.parquet" in line and "'text' field" in line, line
    assert not (tmp_path / "out").exists()


def help_of(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_help_lists_the_tasks(capsys):
    out = help_of(capsys, ["--help"])
    assert all(task in out for task in ("pg19_long", "passkey", "test_loss", "cache_prune", "ruler", "babilong",
                                        "lm_eval", "probes", "eval.py export --help"))
    assert "--ckpt" in out and "--n-boot" in out and "--lengths" not in out  # the options of every task, no other


def test_a_tasks_help_shows_its_options_and_no_other_tasks(capsys):
    from modules.evaluation.cli import TASK_SPECIFIC_OPTIONS, build_parser
    from modules.evaluation.tasks import TASKS

    for name, task in TASKS.items():
        out = help_of(capsys, ["--task", name, "--help"])
        assert f"--task {name}: {task.description}" in out and "--ckpt" in out and "--confidence" in out
        if task.options:  # the task's own options first, then the common ones (issue #47)
            own, common = out.index(f"\n--task {name}:\n"), out.index("\noptions of every task:\n")
            assert own < common < out.index("\n  --ckpt CKPT")
        for option in TASK_SPECIFIC_OPTIONS:
            flag = f"--{option.replace('_', '-')} "
            assert (flag in out) == (option in task.options), (name, option)
        # each option is described as this task reads it, also one that several tasks read (but --data)
        helps = {a.dest: a.help for a in build_parser([name])._actions if a.dest in TASK_SPECIFIC_OPTIONS}
        assert all(text.startswith(name) for dest, text in helps.items() if dest != "data"), helps
    passkey = help_of(capsys, ["--task", "passkey", "--help"])
    assert "--qa" not in passkey and "--margin" not in passkey and "--max-len" not in passkey
    assert "passkey: prompt lengths (default 3072 4096 8192 16384)" in " ".join(passkey.split())
    assert "--qa" in help_of(capsys, ["--help", "--task", "babilong"])  # in any order


def test_default_folders_are_unique_per_checkpoint_and_nothing_is_overwritten(tmp_path, ckpts, monkeypatch, capsys):
    """Two runs' last.ckpt get two default folders (run folder, step and a hash of the path in the name); a second
    evaluation into a folder with a result is refused and leaves it untouched; --overwrite replaces it."""
    monkeypatch.chdir(tmp_path)
    paths = []
    for run_name in ("alpha", "beta"):
        folder = tmp_path / "runs" / run_name / "version_0" / "checkpoints"
        folder.mkdir(parents=True)
        paths.append(str(shutil.copy(ckpts["fpa"], folder / "last.ckpt")))
    argv = ["--task", "passkey", "--lengths", "128", "--trials", "1", *FAST]
    written = [main([*argv, "--ckpt", path]) for path in paths]
    folders = [os.path.basename(os.path.dirname(p)) for p in written]
    assert folders[0] != folders[1]
    assert folders[0].startswith("passkey-alpha_version_0-last-step1-")
    assert folders[1].startswith("passkey-beta_version_0-last-step1-")
    compared = main([*argv, "--ckpt", paths[0], "--compare", paths[1]])
    assert os.path.basename(os.path.dirname(compared)) == f"{folders[0]}-vs-{folders[1][len('passkey-'):]}"
    before = {name: (tmp_path / os.path.dirname(written[0]) / name).read_bytes()
              for name in ("passkey.json", "passkey.png")}
    line = error_of(capsys, [*argv, "--ckpt", paths[0]])
    assert "passkey.json exists" in line and "--overwrite" in line
    after = {name: (tmp_path / os.path.dirname(written[0]) / name).read_bytes() for name in before}
    assert after == before
    (tmp_path / os.path.dirname(written[0]) / "passkey.json").unlink()  # a figure alone is protected too
    assert "passkey.png exists" in error_of(capsys, [*argv, "--ckpt", paths[0]])
    assert (tmp_path / os.path.dirname(written[0]) / "passkey.png").read_bytes() == before["passkey.png"]
    assert main([*argv, "--ckpt", paths[0], "--overwrite"]) == written[0]
    with open(written[0]) as f:
        assert "--overwrite" in json.load(f)["command"]


def test_write_outputs_refuses_to_replace_and_writes_json_atomically(tmp_path):
    from modules.evaluation.report import write_outputs
    from modules.evaluation.tasks.common import TaskOutput

    out = tmp_path / "out"
    path = write_outputs(str(out), "demo", {"command": "first"}, TaskOutput({"x": 1.0}), None)
    original = (out / "demo.json").read_bytes()
    with pytest.raises(FileExistsError, match="demo.json exists"):
        write_outputs(str(out), "demo", {"command": "second"}, TaskOutput({"x": 2.0}), None)
    assert (out / "demo.json").read_bytes() == original
    # a record that fails half-way through serialisation leaves the earlier file whole, and no temporary file
    with pytest.raises(TypeError):
        write_outputs(str(out), "demo", {"command": "third"}, TaskOutput({"x": 3.0, "z": object()}), None,
                      overwrite=True)
    assert (out / "demo.json").read_bytes() == original and os.listdir(out) == ["demo.json"]
    write_outputs(str(out), "demo", {"command": "fourth"}, TaskOutput({"x": 4.0}), None, overwrite=True)
    with open(path) as f:
        assert json.load(f)["results"] == {"x": 4.0}
