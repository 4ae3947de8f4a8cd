"""Seeds as a first-class axis, end to end on tiny checkpoints: every result records its checkpoints' training seeds;
``eval.py seeds`` pairs per-seed result files by those seeds and writes the seed-level comparison; ``--ckpt A0 A1
--compare B0 B1`` evaluates each pair and runs the same comparison; one pair prints no verdict."""
import json
import os

import pytest
import yaml

from eval import main

FAST = ["--n-boot", "200"]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, make_module):
    """{(backend, seed): checkpoint} for fpa and fox, seeds 0 and 1, each in a LightningCLI run folder
    (<run>/version_0/checkpoints/last.ckpt beside <run>/version_0/config.yaml holding seed_everything and the data's
    seed, as train.py saves them)."""
    root = tmp_path_factory.mktemp("seeded")
    out = {}
    for b, backend in enumerate(("fpa", "fox")):
        for seed in (0, 1):
            run = root / f"{backend}_s{seed}" / "version_0"
            (run / "checkpoints").mkdir(parents=True)
            (run / "config.yaml").write_text(yaml.safe_dump({
                "seed_everything": seed, "data": {"init_args": {"seed": 0}}, "model": {"optim": {"lr": 1e-3}}}))
            out[backend, seed] = save_checkpoint(make_module(backend, seed=10 * b + seed),
                                                 run / "checkpoints" / "last.ckpt")
    return out


def save_checkpoint(module, path) -> str:
    """As tests/conftest.py saves its tiny checkpoints: one optimiser step through a Trainer, the real format."""
    import lightning as L
    import torch

    ids = torch.randint(3, 32000, (2, 17))
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(
        [{"input_ids": ids[:, :-1], "labels": ids[:, 1:]}], batch_size=None))
    trainer.save_checkpoint(path)
    return str(path)


def evaluate(tmp_path, name, *argv) -> dict:
    path = main([*argv, "--out", str(tmp_path / name), *FAST])
    with open(path) as f:
        return json.load(f)


def test_results_record_training_seeds_and_seeds_compares_them(tmp_path, seeded, capsys):
    files = {}
    for (backend, seed), ckpt in seeded.items():
        record = evaluate(tmp_path, f"{backend}{seed}", "--task", "test_loss", "--ckpt", ckpt, "--seq-len", "32",
                          "--max-docs", "6")
        assert record["checkpoint"]["seed_everything"] == seed and record["checkpoint"]["data_seed"] == 0
        assert record["checkpoint"]["lr"] == pytest.approx(1e-3)  # the checkpoint's optim hyper-parameters
        assert record["checkpoint"]["training_config"].endswith("config.yaml")
        items = record["results"]["per_item"]
        assert items["unit"] == "row" and len(items["metrics"][0]["values"][0]) == 6
        files[backend, seed] = str(tmp_path / f"{backend}{seed}" / "test_loss.json")
    assert len({json.load(open(p))["results"]["per_item"]["fingerprint"] for p in files.values()}) == 1
    capsys.readouterr()
    out = tmp_path / "seeds"
    # A's files in the other order: pairing is by the recorded seed, not by position
    path = main(["seeds", "--task", "test_loss", "--a", files["fpa", 1], files["fpa", 0],
                 "--b", files["fox", 0], files["fox", 1], "--out", str(out), "--n-boot", "300"])
    assert path == str(out / "test_loss_seeds.json") and os.path.getsize(out / "test_loss_seeds.png") > 1000
    result = json.load(open(path))
    assert result["seeds"] == [0, 1] and [p["a"] for p in result["pairs"]] == [files["fpa", 0], files["fpa", 1]]
    (loss,) = result["metrics"]
    for s, seed in enumerate((0, 1)):  # each seed's difference is its pair's difference of mean row losses
        a, b = (json.load(open(files[k, seed]))["results"]["models"][0]["loss"]["estimate"] for k in ("fpa", "fox"))
        assert loss["per_seed"][s]["seed"] == seed and loss["per_seed"][s]["estimate"] == pytest.approx(a - b)
    assert loss["mean"] == pytest.approx(sum(s["estimate"] for s in loss["per_seed"]) / 2)
    assert loss["t_interval"]["lower"] <= loss["mean"] <= loss["t_interval"]["upper"]
    assert loss["verdict"] in {"superior", "non-inferior", "inferior", "inconclusive"}
    assert result["margin"] == 0.00995 and result["note"] is None and loss["direction"] == "lower"
    text = capsys.readouterr().out
    assert "per training seed [0, 1]" in text and "sign p" in text and loss["verdict"] in text
    # one pair: the intervals, but no verdict, and the output says why
    main(["seeds", "--task", "test_loss", "--a", files["fpa", 0], "--b", files["fox", 0], "--out",
          str(tmp_path / "one"), "--n-boot", "100"])
    text = capsys.readouterr().out
    one = json.load(open(tmp_path / "one" / "test_loss_seeds.json"))
    assert one["metrics"][0]["verdict"] is None and one["metrics"][0]["t_interval"] is None
    assert "no verdict" in text and "evaluation noise only" in text
    assert not any(word in text for word in ("superior", "non-inferior", "inconclusive"))


def test_seeds_refuses_what_does_not_pair(tmp_path, seeded, capsys):
    def passkey(name, ckpt, *extra):
        evaluate(tmp_path, name, "--task", "passkey", "--ckpt", ckpt, "--lengths", "128", "--trials", "2", *extra)
        return str(tmp_path / name / "passkey.json")

    a0, a1 = passkey("a0", seeded["fpa", 0]), passkey("a1", seeded["fpa", 1])
    b0, other_items = passkey("b0", seeded["fox", 0]), passkey("b1", seeded["fox", 1], "--seed", "5")
    cases = [
        (["--a", a0, a1, "--b", b0], "the seeds do not pair up: --a has [0, 1], --b has [0]"),
        (["--a", a0, a0, "--b", b0, b0], "--a: seed 0 appears twice"),
        (["--a", a0, a1, "--b", b0, other_items], "different items"),
        (["--a", a0], "a single-model result; give the other side's files with --b"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exc:
            main(["seeds", "--task", "passkey", *argv, "--out", str(tmp_path / "refused")])
        assert exc.value.code == 2
        assert message in capsys.readouterr().err, argv
    with pytest.raises(SystemExit):
        main(["seeds", "--task", "test_loss", "--a", a0, "--b", b0, "--out", str(tmp_path / "refused")])
    assert "a result of task 'passkey', not 'test_loss'" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()


def test_several_pairs_evaluate_each_and_compare_across_seeds(tmp_path, seeded, capsys):
    out = tmp_path / "multi"
    path = main(["--task", "passkey", "--ckpt", seeded["fpa", 0], seeded["fpa", 1], "--compare", seeded["fox", 0],
                 seeded["fox", 1], "--lengths", "128", "--trials", "3", "--out", str(out), *FAST])
    assert path == str(out / "passkey_seeds.json")
    result = json.load(open(path))
    assert result["seeds"] == [0, 1] and result["metrics"][0]["name"] == "success/128"
    for i, pair in enumerate(result["pairs"]):  # each pair's own paired result, the same code path as one pair
        paired = json.load(open(out / f"pair{i}" / "passkey.json"))
        assert pair["a"] == pair["b"] == str(out / f"pair{i}" / "passkey.json")
        successes = [m["successes"] for m in paired["results"]["lengths"][0]["models"]]
        assert result["metrics"][0]["per_seed"][i]["estimate"] == pytest.approx((successes[0] - successes[1]) / 3)
    assert result["metrics"][0]["direction"] == "higher"
    # pairs whose seeds differ are refused before any compute
    with pytest.raises(SystemExit):
        main(["--task", "passkey", "--ckpt", seeded["fpa", 0], seeded["fpa", 1], "--compare", seeded["fox", 1],
              seeded["fox", 0], "--lengths", "128", "--trials", "1", "--out", str(tmp_path / "crossed")])
    assert "each pair must record one training seed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--task", "passkey", "--ckpt", seeded["fpa", 0], seeded["fpa", 1], "--compare", seeded["fox", 0]])
    assert "2 --ckpt and 1 --compare checkpoints" in capsys.readouterr().err


def test_one_pair_compare_prints_no_verdict(tmp_path, seeded, capsys):
    record = evaluate(tmp_path, "pair", "--task", "test_loss", "--ckpt", seeded["fpa", 0], "--compare",
                      seeded["fox", 0], "--seq-len", "32", "--max-docs", "4")
    text = capsys.readouterr().out
    assert record["results"]["verdict"] is None and "evaluation noise only" in record["results"]["note"]
    assert "difference" in record["results"]  # the paired interval stays
    assert "evaluation noise only" in text and "eval.py seeds" in text
    assert not any(word in text for word in ("superior", "non-inferior", "inconclusive"))


def test_seeds_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["seeds", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--a" in out and "--b" in out and "--margin" in out and "needs >= 2 seeds" in " ".join(out.split())


def test_documents_of_one_work_are_one_cluster(tmp_path, seeded):
    """Data that name each document's work (EvalData.long_document_works): pg19_long records the works as the
    documents' clusters, and eval.py seeds resamples each seed's documents by work."""
    import numpy as np

    from datamodules import EvalCorpus
    from fpa_lightning.evaluation.seeds import cluster_means
    from modules.evaluation.cli import main as cli_main

    class Works(EvalCorpus):  # two editions of each work: documents 0 and 1 are work w0, 2 and 3 are w1
        def long_document_works(self, tokens, min_tokens, limit):
            return [(doc, f"w{j // 2}") for j, doc in enumerate(self.long_documents(tokens, min_tokens, limit))]

    files = {}
    for backend in ("fpa", "fox"):
        for seed in (0, 1):
            out = tmp_path / f"{backend}{seed}"
            files[backend, seed] = cli_main(["--task", "pg19_long", "--ckpt", seeded[backend, seed], "--max-len", "64",
                                             "--buckets", "0", "32", "64", "--max-docs", "4", "--out", str(out),
                                             *FAST], data_factory=Works)
    record = json.load(open(files["fpa", 0]))["results"]["per_item"]
    assert record["cluster_by"].startswith("work") and record["metrics"][0]["clusters"] == ["w0", "w0", "w1", "w1"]
    path = main(["seeds", "--task", "pg19_long", "--a", files["fpa", 0], files["fpa", 1], "--b", files["fox", 0],
                 files["fox", 1], "--out", str(tmp_path / "seeds"), "--n-boot", "300", "--seed", "4"])
    result = json.load(open(path))
    assert [m["name"] for m in result["metrics"]] == ["loss/0-32", "loss/32-64"]
    for s, seed in enumerate((0, 1)):
        a, b = (np.array(json.load(open(files[k, seed]))["results"]["per_item"]["metrics"][0]["values"][0])
                for k in ("fpa", "fox"))
        by_work = cluster_means(a - b, ["w0", "w0", "w1", "w1"], n_boot=300, seed=4 + s)
        assert result["metrics"][0]["per_seed"][s] == {"seed": seed, **by_work.as_dict()}
        assert by_work.as_dict() != cluster_means(a - b, None, n_boot=300, seed=4 + s).as_dict()


def test_a_checkpoint_without_a_run_config_records_null_seeds(tmp_path, ckpts, capsys):
    """A checkpoint saved outside a LightningCLI run (no config.yaml beside it, no data module): the seeds are null,
    the rate comes from the checkpoint's optim hyper-parameters, and eval.py seeds refuses the file."""
    record = evaluate(tmp_path, "bare", "--task", "passkey", "--ckpt", ckpts["fpa"], "--lengths", "128",
                      "--trials", "1")
    described = record["checkpoint"]
    assert (described["seed_everything"], described["data_seed"], described["training_config"]) == (None, None, None)
    assert described["lr"] == pytest.approx(1e-3)
    assert "training seed None" in capsys.readouterr().err
    path = str(tmp_path / "bare" / "passkey.json")
    with pytest.raises(SystemExit):
        main(["seeds", "--task", "passkey", "--a", path, "--b", path, "--out", str(tmp_path / "refused")])
    assert "records no training seed" in capsys.readouterr().err


def test_several_metrics_are_read_together():
    """pg19_long's position buckets are read together: with seven metrics each verdict rests on the t-interval at
    1 − 0.05/7, so a bucket whose two seeds happen to agree (+0.0043, +0.0049: "inferior" alone) is inconclusive,
    while the reported 95 % interval stays as it was; one metric keeps the plain 95 % verdict."""
    import math

    import numpy as np

    from modules.evaluation.seeds import seed_comparison, table

    def pairs(values_by_metric: dict[str, list[float]]) -> list[dict]:
        out = []
        for s in range(2):
            metrics = {name: {"direction": "lower", "ids": ["d0", "d1"], "clusters": ["w0", "w1"],
                              "values": np.full(2, values[s])} for name, values in values_by_metric.items()}
            zeros = {name: {**m, "values": np.zeros(2)} for name, m in metrics.items()}
            out.append({"seed": s, "a": f"a{s}.json", "b": f"b{s}.json", "a_training": {}, "b_training": {},
                        "a_metrics": metrics, "b_metrics": zeros, "fingerprint": "f"})
        return out

    buckets = {f"loss/{i}": ([0.0043, 0.0049] if i == 1 else [-0.01, 0.02]) for i in range(7)}
    result = seed_comparison("pg19_long", pairs(buckets), None, 0.95, 200, 0)
    assert result["metrics_read_together"] == 7 and result["verdict_confidence"] == pytest.approx(1 - 0.05 / 7)
    close = next(m for m in result["metrics"] if m["name"] == "loss/1")
    assert close["t_interval"]["lower"] > 0 and close["verdict"] == "inconclusive"
    assert close["verdict_interval"]["lower"] < 0 < close["verdict_interval"]["upper"]
    assert "Bonferroni over the 7 metrics read together" in table(result)
    alone = seed_comparison("pg19_long", pairs({"loss/1": [0.0043, 0.0049]}), None, 0.95, 200, 0)
    assert alone["metrics_read_together"] == 1 and alone["metrics"][0]["verdict"] == "inferior"
    assert alone["metrics"][0]["t_interval"]["lower"] == pytest.approx(0.0046 - math.tan(0.475 * math.pi) * 0.0003)
    assert "Bonferroni" not in table(alone)
