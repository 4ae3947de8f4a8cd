"""benchmarks/lm_study_report.py on a small fake RESULTS folder: event files written here, eval JSONs in the
structure eval.py writes (literal dicts, trimmed to the fields the report reads), some evals missing."""
import importlib.util
import json
import pathlib

import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

PATH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "lm_study_report.py"
SPEC = importlib.util.spec_from_file_location("lm_study_report", PATH)
report = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(report)

FIGURES = ("loss_curves.png", "loss_by_position.png", "passkey.png", "keys_kept_vs_loss.png")


def iv(estimate: float, lower: float, upper: float) -> dict:
    return {"estimate": estimate, "lower": lower, "upper": upper, "confidence": 0.95}


def mcnemar(p: float) -> dict:
    return {"both": 1, "a_only": 4, "b_only": 0, "neither": 5, "p_two_sided": p, "p_a_better": p / 2}


def write_run(root: pathlib.Path, backend: str, heads: bool) -> None:
    run = root / "runs" / f"study_{backend}" / "version_0"
    writer = SummaryWriter(str(run))
    # as Lightning logs them: train/ and val/ at the step count before the step (9 = after the 10th step)
    for step, loss in zip(range(9, 60, 10), [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]):
        writer.add_scalar("train/loss", loss, step)
    for step, speed in zip((9, 19, 39), (100.0, 300.0, 200.0)):
        writer.add_scalar("train/tokens_per_s", speed, step)
    writer.add_scalar("val/loss", 3.25, 30)  # LanguageModel logs val/ at the steps done (trainer.global_step)
    writer.add_scalar("val/loss", 3.5, 60)
    for step, alive in ((30, 0.5), (60, 0.25)):  # callbacks: at trainer.global_step
        if heads:
            writer.add_scalar("heads/summary/median_alive_fraction", alive, step)
            writer.add_scalar("heads/summary/nonsuffix_heads", 3.0, step)
            writer.add_scalar("heads/alive_fraction/layer_00/head_00", alive, step)
        writer.add_scalar("long_context/summary/within_context", 4.0 + alive, step)
        writer.add_scalar("long_context/loss/pos_0000", 5.0, step)
    writer.close()
    (run / "config.yaml").write_text(yaml.safe_dump({
        "trainer": {"devices": 1, "num_nodes": 1, "accumulate_grad_batches": 2},
        "data": {"init_args": {"seq_len": 64, "batch_size": 4}}}))
    (run / "hparams.yaml").write_text(yaml.safe_dump({"attention_impls": [f"{backend}:chunked"] * 2}))


def write_eval(root: pathlib.Path, name: str, task: str, results: dict, peer: str | None = "fox") -> None:
    folder = root / "eval" / name
    folder.mkdir(parents=True)
    def checkpoint(backend: str | None) -> dict | None:
        return backend and {"backend": backend, "global_step": 60}
    doc = {"checkpoint": checkpoint(name.split("-")[1] if task == "generate" else "fpa"), "compare": checkpoint(peer),
           "settings": {"device": "cpu", "precision": "32", "seed": 0, "confidence": 0.95}, "device": "cpu",
           "seconds": 1.5, "command": f"eval.py --task {task}", "task": task, "results": results}
    (folder / f"{task}.json").write_text(json.dumps(doc))


def prune_row(kept: float, increase: float, rule: dict, real: bool = False) -> dict:
    row = {"rule": rule, "loss": iv(3.0 + increase, 2.9, 3.1),
           "increase": iv(increase, increase - 0.001, increase + 0.001), "kept_fraction": kept,
           "kept_fraction_per_layer": [kept], "kept_pair_fraction": kept, "revived_pairs": 0}
    if real:
        row["real_eviction"] = {"loss": iv(3.0 + increase + 1e-7, 2.9, 3.1), "increase": iv(increase, 0, 0),
                                "kept_fraction": kept - 0.001, "cache_bytes": 134152.0,
                                "max_abs_difference_from_simulation": 1e-7}
    return row


def cache_prune(peer: str, real: bool = False) -> dict:
    thresholds = [-10.0] if real else [-10.0, -5.0]

    def rules(side: str) -> list[dict]:
        return [prune_row(0.4 + 0.1 * i, 0.0012 * (i + 1) * (2 if side == "b" else 1),
                          {"window": 700 + i} if side == "b" and peer == "sdpa" else {"threshold": t}, real)
                for i, t in enumerate(thresholds)]
    pk = {"successes": 9, "n": 10, "rate": iv(0.9, 0.555, 0.997), "success": [True] * 9 + [False],
          "kept_fraction": 0.25, "kept_fraction_per_layer": [0.25], "kept_pair_fraction": 0.2, "revived_pairs": 0}
    return {"lengths": [{"length": 2048, "documents": 2, "models": [
                {"label": "A: fpa", "unpruned_loss": iv(3.0, 2.9, 3.1), "rules": rules("a")},
                {"label": f"B: {peer}", "unpruned_loss": iv(3.1, 3.0, 3.2), "rules": rules("b")}]}],
            "passkey": [] if real else [{"length": 8192, "models": [
                {"label": "A: fpa", "rule": {"threshold": -10.0}, **pk},
                {"label": f"B: {peer}", "rule": {"window": 2000} if peer == "sdpa" else {"threshold": -10.0}, **pk}]}]}


@pytest.fixture
def results_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "results"
    for backend in ("fpa", "fox", "sdpa"):
        write_run(root, backend, heads=backend != "sdpa")
    (root / "status.tsv").write_text("train_fpa\t0\t1234\tpython train.py fit\n"
                                     "eval_ruler-fpa-fox\t2\t9\tpython eval.py --task ruler\n")
    for peer, diff in (("fox", -0.0123), ("sdpa", 0.0456)):
        write_eval(root, f"test_loss-fpa-{peer}", "test_loss", {
            "sequences": 180, "seq_len": 64, "tokens": 11520,
            "models": [{"label": "A: fpa", "loss": iv(3.1, 3.0, 3.2)},
                       {"label": f"B: {peer}", "loss": iv(3.2, 3.1, 3.3)}],
            "difference": iv(diff, diff - 0.002, diff + 0.002), "margin": 0.00995, "verdict": "superior"}, peer)
    write_eval(root, "pg19_long-fpa-fox", "pg19_long", {
        "documents": 5, "document_tokens": [513] * 5, "buckets": [[0, 64], [64, 512]], "books_per_bucket": [5, 5],
        "models": [{"label": "A: fpa", "loss": [iv(4.0, 3.9, 4.1), iv(3.5, 3.4, 3.6)]},
                   {"label": "B: fox", "loss": [iv(4.1, 4.0, 4.2), iv(3.75, 3.6, 3.9)]}],
        "difference": [iv(-0.1, -0.2, 0.0), iv(-0.25, -0.3, -0.2)]})
    write_eval(root, "passkey-fpa-fox", "passkey", {
        "lengths": [{"length": 2048, "trials": [], "models": [
            {"label": "A: fpa", "successes": 9, "n": 10, "rate": iv(0.9, 0.555, 0.997), "success": [],
             "mean_answer_nll": 0.1},
            {"label": "B: fox", "successes": 5, "n": 10, "rate": iv(0.5, 0.187, 0.813), "success": [],
             "mean_answer_nll": 1.0}], "mcnemar": mcnemar(0.0625)}],
        "trials_per_length": 10, "scorer": "one pass (teacher forcing)", "mcnemar_pooled": mcnemar(0.03125)})
    write_eval(root, "cache_prune-fpa-fox", "cache_prune", cache_prune("fox"))
    write_eval(root, "cache_prune-fpa-sdpa", "cache_prune", cache_prune("sdpa"), "sdpa")
    write_eval(root, "cache_prune_real-fpa-fox", "cache_prune", cache_prune("fox", real=True))
    write_eval(root, "generate-fpa", "generate", {
        "prompts": ["And God said unto Moses,"], "settings": {"max_new_tokens": 8, "temperature": 0.0},
        "models": [{"label": "A: fpa", "continuations": [" Go down\nunto Pharaoh"], "new_token_ids": [[1]],
                    "stats": {"kept_fraction": 1.0, "ms_per_step": 3.2957}}]}, None)
    write_eval(root, "lm_eval-fpa-fox", "lm_eval", {"tasks": [{
        "task": "kjv_cloze", "metric": "acc", "mcnemar": mcnemar(0.625),
        "models": [{"label": "A: fpa", "value": 0.2778, "stderr": 0.1086, "n": 18},
                   {"label": "B: fox", "value": 0.3333, "stderr": 0.1143, "n": 18}]}], "harness": {}})
    return root


def test_collect_copies_the_numbers(results_dir):
    results = report.collect(results_dir)
    fpa = results["training"]["fpa"]
    assert fpa["steps"] == 60 and fpa["tokens_per_step"] == 4 * 64 * 2 and fpa["tokens_seen"] == 60 * 512
    assert fpa["final_train_loss"] == pytest.approx(3.0)  # the mean of the last five of 6, 5, 4, 3, 2, 1
    assert (fpa["final_val_loss"], fpa["best_val_loss"], fpa["median_tokens_per_s"]) == (3.5, 3.25, 200.0)
    assert fpa["train_seconds"] == 1234 and results["training"]["fox"]["train_seconds"] is None
    assert fpa["heads"] == {"step": 60, "values": {"median_alive_fraction": 0.25, "nonsuffix_heads": 3.0}}
    assert results["training"]["sdpa"]["heads"] is None
    assert fpa["long_context"]["values"]["summary/within_context"] == 4.25
    assert fpa["curves"]["val/loss"] == [[30 * 512, 3.25], [60 * 512, 3.5]]
    assert fpa["attention_impls"] == ["fpa:chunked", "fpa:chunked"] and results["training_context"] == 64
    evals = results["evals"]
    assert evals["test_loss-fpa-fox"]["difference"]["estimate"] == -0.0123
    assert evals["test_loss-fpa-fox"]["header"]["command"] == "eval.py --task test_loss"
    assert evals["ruler-fpa-fox"] is None and evals["babilong-fpa-sdpa"] is None
    assert evals["passkey-fpa-fox"]["mcnemar_pooled"]["p_two_sided"] == 0.03125
    assert evals["cache_prune_real-fpa-fox"]["lengths"][0]["a"]["rules"][0]["real_eviction"]["kept_fraction"] == 0.399
    assert evals["generate-fpa"]["ms_per_step"] == 3.2957
    assert [e["exit_code"] for e in results["status"]] == [0, 2]
    json.dumps(results, allow_nan=False)  # plain JSON


def test_render_tables(results_dir):
    text = report.render(report.collect(results_dir))
    assert "| FPA | 60 | 30,720 | 3.0000 | 3.5000 | 3.2500 | 200 | 1234 | fpa:chunked ×2 | 4.2500 |" in text
    assert "| FPA vs FoX | 3.1000 [3.0000, 3.2000] | 3.2000 [3.1000, 3.3000] | -0.0123 [-0.0143, -0.0103] |" in text
    assert "+0.0456 [+0.0436, +0.0476]" in text
    assert "| 64–512 | 5 | 3.5000 | 3.7500 | — | -0.2500 [-0.3000, -0.2000] | — |" in text
    assert "| 2048 | 0.900 [0.555, 0.997] | 0.500 [0.187, 0.813] | — | 0.062 | — |" in text
    assert "| all (pooled) | — | — | — | 0.031 | — |" in text
    # FPA's threshold, FoX's same threshold, softmax's matched window, in one row
    assert ("| 2048 | -5 | 0.500 | +0.0024 [+0.0014, +0.0034] | 0.500 | +0.0048 [+0.0038, +0.0058] | 701 | 0.500 | "
            "+0.0048 [+0.0038, +0.0058] |") in text
    assert "kept 0.250 (window 2000)" in text
    assert ("| FPA | 2048 | 2 | threshold -10 | 3.0000 | 0.400 | 0.399 | +0.0012 [+0.0002, +0.0022] | "
            "+0.0012 [+0.0000, +0.0000] | 1.0e-07 | 134,152 |") in text
    assert "| median_alive_fraction | 0.250 | 0.250 | — |" in text and "| nonsuffix_heads | 3 | 3 | — |" in text
    assert "| kjv_cloze | acc | 18 | 0.278 ± 0.109 | 0.333 ± 0.114 | 0.62 |" in text
    assert "prompt: And God said unto Moses,\n  FPA       Go down⏎unto Pharaoh\n" in text  # one line per sample
    assert "| FPA | 3.30 | 8 |" in text
    assert "`ruler-fpa-fox`: not run / failed (see status.tsv) — `eval_ruler-fpa-fox` exit 2" in text
    assert "`babilong-fpa-sdpa`: not run / failed (see status.tsv)\n" in text
    assert "`generate-fox`: not run" in text and "| eval_ruler-fpa-fox | 2 | 9 |" in text


def test_command_line_and_check(results_dir, tmp_path, capsys):
    out = tmp_path / "report"
    assert report.main([str(results_dir), "--out", str(out)]) == 0
    text = (out / "results.json").read_text()
    assert json.loads(text)["evals"]["test_loss-fpa-fox"]["difference"]["estimate"] == -0.0123
    assert list(json.loads(text)) == ["evals", "second", "status", "training", "training_context"]  # sorted keys
    for name in FIGURES:
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert report.main(["--check", str(out)]) == 0
    tables = out / "tables.md"
    tables.write_text(tables.read_text().replace("-0.0123 [", "-0.0124 ["))
    capsys.readouterr()
    assert report.main(["--check", str(out)]) == 1
    diff = capsys.readouterr().out
    changed = [line for line in diff.splitlines() if line.startswith(("-|", "+|"))]
    assert len(changed) == 2 and "-0.0124 [" in changed[0] and "-0.0123 [" in changed[1]


def test_record_written_apart_from_the_page(results_dir, tmp_path, capsys):
    """--record puts the JSON record under results while the tables and figures go to the page's folder; --check
    reads the record from there, and a changed record no longer matches the committed tables."""
    page, record = tmp_path / "docs" / "study", tmp_path / "results" / "first" / "results.json"
    assert report.main([str(results_dir), "--out", str(page), "--record", str(record)]) == 0
    assert not (page / "results.json").exists() and (page / "tables.md").exists()
    assert json.loads(record.read_text())["evals"]["test_loss-fpa-fox"]["difference"]["estimate"] == -0.0123
    assert report.main(["--check", str(page), "--record", str(record)]) == 0
    record.write_text(record.read_text().replace("-0.0123", "-0.0125"))
    capsys.readouterr()
    assert report.main(["--check", str(page), "--record", str(record)]) == 1
    assert "-0.0125 [" in capsys.readouterr().out


def test_missing_pieces_are_reported(tmp_path):
    root = tmp_path / "results"
    write_run(root, "fpa", heads=True)
    results = report.collect(root)
    assert results["status"] == [] and results["training"]["fox"] is None
    text = report.render(results)
    assert "| FoX | not run / failed (see status.tsv) |" in text
    assert text.count("not run / failed") == 2 + len(report.EVALS)  # FoX's and softmax's training, every eval
    for draw in report.FIGURES.values():  # figures say what is missing instead of failing
        draw(results, tmp_path / "figure.png")


def test_a_folder_without_runs_fails_clearly(tmp_path):
    with pytest.raises(SystemExit, match="no runs/ folder"):
        report.collect(tmp_path)


def test_committed_study_tables_come_from_the_committed_json():
    """docs/lm_study/tables.md is exactly the tables rendered from the first study's record, and the record holds the
    run's numbers that docs/lm_study.md quotes (a hand edit of either fails here)."""
    study = PATH.parents[1] / "docs" / "lm_study"
    record = PATH.parents[1] / "benchmarks" / "results" / "lm_study_first" / "results.json"
    assert report.check(study, record) == 0
    results = json.loads(record.read_text())
    assert round(results["evals"]["test_loss-fpa-fox"]["difference"]["estimate"], 4) == -0.0130
    assert results["training"]["fpa"]["tokens_seen"] == 25_559_040
    assert round(results["evals"]["test_loss-fpa-sdpa"]["difference"]["estimate"], 4) == -0.3738
    doc = (PATH.parents[1] / "docs" / "lm_study.md").read_text()
    assert "first study's FPA − FoX of −0.0130" in doc  # quoted as one draw of the seed spread, with no verdict
    assert "−0.3738 (one pair; evaluation noise [−0.3888, −0.3591])" in doc


def test_second_training_fills_the_missing_evals_and_is_marked(results_dir, tmp_path):
    """--second: evals the first run lacks come from the second, marked; the first run's own evals are kept even where
    the second has one too; both trainings' final losses are listed side by side."""
    first = tmp_path / "first"
    write_run(first, "fpa", heads=True)
    write_run(first, "fox", heads=True)
    (first / "status.tsv").write_text("train_fpa\t0\t10\tpython train.py fit\n")
    write_eval(first, "test_loss-fpa-fox", "test_loss", {
        "sequences": 3, "seq_len": 64, "tokens": 192,
        "models": [{"label": "A: fpa", "loss": iv(9.0, 8.9, 9.1)}, {"label": "B: fox", "loss": iv(9.5, 9.4, 9.6)}],
        "difference": iv(-0.5, -0.6, -0.4), "margin": 0.01, "verdict": "superior"})
    results = report.collect(first, results_dir)
    evals = results["evals"]
    assert evals["test_loss-fpa-fox"]["training"] == "first"  # the first run's own, not the second's (-0.0123)
    assert evals["test_loss-fpa-fox"]["difference"]["estimate"] == -0.5
    assert evals["lm_eval-fpa-fox"]["training"] == "second" and evals["lm_eval-fpa-fox"]["tasks"][0]["a"]["value"] == 0.2778
    assert "test_loss-fpa-fox" not in results["second"]["evals"] and "lm_eval-fpa-fox" in results["second"]["evals"]
    assert results["second"]["training"]["sdpa"]["final_val_loss"] == 3.5 and results["training"]["sdpa"] is None
    text = report.render(json.loads(json.dumps(results)))
    assert 'Measured on the second training of the same configs (see "Second training"): `lm_eval-fpa-fox`.' in text
    assert "## Second training" in text
    assert "| FPA | 3.5000 | 3.5000 | +0.0000 |" in text and "| softmax | — | 3.5000 | — |" in text
    assert "| train_fpa | 0 | 1234 |" in text.split("## Second training")[1]  # the second run's status.tsv
    assert "## Second training" not in report.render(report.collect(first))
