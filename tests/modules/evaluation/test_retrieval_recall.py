"""eval.py --task retrieval_recall: held-out synthetic retrieval documents (validation filler, seeds of their own), the
value tokens found exactly, a teacher-forced scorer that an oracle passes and a uniform model fails by the expected
amount, and the command line end to end on tiny checkpoints."""
import json
import math
import random
import shutil
from types import SimpleNamespace

import pytest
import torch

from datamodules import EvalCorpus, offline_corpus_dir
from eval import main
from datamodules.retrieval_synth import DISTANCE_LAWS, KINDS, RetrievalSource
from datamodules.stream import SplitSource
from fpa_lightning.evaluation.checkpoint import LoadedModel
from fpa_lightning.evaluation.recall import recall_document, score_values
from fpa_lightning.evaluation.scoring import Runtime
from modules.evaluation.tasks import retrieval_recall as task
from test_cli import FAST, error_of, run  # (this folder is on sys.path under pytest)

VALIDATION_WORDS = "heron river willow meadow lantern quiet silver morning".split()
TRAIN_WORDS = "crow anvil granite harbour copper thunder".split()


def prose(words: list[str], sentences: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(" ".join(rng.choice(words) for _ in range(8)).capitalize() + "." for _ in range(sentences))


def write_split(folder, split: str, texts: list[str]) -> None:
    (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


@pytest.fixture(scope="module")
def offline():
    """The offline corpus (KJV books): its validation split is the filler."""
    return EvalCorpus(None)


@pytest.fixture(scope="module")
def two_proses(tmp_path_factory):
    """A folder whose train and validation splits are prose of disjoint vocabularies."""
    folder = tmp_path_factory.mktemp("two_proses")
    write_split(folder, "train", [prose(TRAIN_WORDS, 300, 0)])
    write_split(folder, "validation", [prose(VALIDATION_WORDS, 300, 1)])
    return folder


def test_value_spans_are_exactly_the_values_tokens_for_every_kind(offline):
    tok = offline.tokenizer
    kinds = set()
    for doc in offline.retrieval_documents(512, 30, 0, "log_uniform"):
        made = recall_document(tok, offline.bos_id, offline.eos_id, doc.text, doc.facts)
        asked = [f for f in doc.facts if f.recall is not None]
        assert [it.value for it in made.items] == [f.value for f in asked] and made.items
        assert made.input_ids[0] == offline.bos_id and made.input_ids[-1] == offline.eos_id
        assert made.input_ids.numel() == doc.tokens + 2 <= 512  # the pieces' tokens are the whole text's
        baseline = tok.decode(made.baseline_ids.tolist())
        assert not any(f.statement in baseline for f in doc.facts) and all(f.recall in baseline for f in asked)
        for it, fact in zip(made.items, asked):
            a, b = it.span
            assert tok.decode(made.input_ids[a:b].tolist()) == fact.value
            assert tok.decode(made.input_ids[b:b + 1].tolist()) == "."  # the recall's full stop, then its end
            assert b == fact.recall_end and it.distance == fact.distance  # recall_end counts tokens after BOS
            a, b = it.baseline_span
            assert tok.decode(made.baseline_ids[a:b].tolist()) == fact.value
            kinds.add(it.kind)
    assert kinds == set(KINDS)


def test_documents_are_deterministic_held_out_and_filled_from_the_validation_split(offline, two_proses):
    assert task.DISTANCE_LAWS == DISTANCE_LAWS
    texts = [d.text for d in offline.retrieval_documents(256, 6, 0, "uniform")]
    assert texts == [d.text for d in EvalCorpus(None).retrieval_documents(256, 6, 0, "uniform")]  # a fresh reader
    assert not set(texts) & {d.text for d in offline.retrieval_documents(256, 6, 1, "uniform")}  # another seed
    assert offline.describe()["split"] == "validation"
    # a train stream's documents for the same seed, length and law, even with the same filler: other documents
    train = RetrievalSource("retrieval", SplitSource(files=(str(offline_corpus_dir() / "validation.jsonl"),)),
                            offline.tokenizer, 256, distance_law="uniform")
    streamed = [train.document(0, 0, 0, i) for i in range(6)]
    assert len(train.pool(0).sentences) == offline.describe()["filler"]["sentences"]
    assert not set(texts) & {d.text for d in streamed}
    # filler from the validation split only
    corpus = EvalCorpus(str(two_proses))
    words = {w.strip(".").lower() for d in corpus.retrieval_documents(256, 6, 0, "log_uniform") for w in d.text.split()}
    assert set(VALIDATION_WORDS) <= words and not words & set(TRAIN_WORDS)
    assert corpus.describe()["filler"]["sentences"] == 300


def test_missing_validation_prose_and_short_lengths_are_clear_errors(tmp_path, offline):
    write_split(tmp_path, "test", [prose(VALIDATION_WORDS, 10, 0)])
    with pytest.raises(ValueError, match="validation split"):
        EvalCorpus(str(tmp_path)).retrieval_documents(256, 1, 0, "uniform")
    write_split(tmp_path, "validation", ["1234 5678 90", "x" * 500])
    with pytest.raises(ValueError, match="no prose sentence"):
        EvalCorpus(str(tmp_path)).retrieval_documents(256, 1, 0, "uniform")
    with pytest.raises(ValueError, match="too short"):
        offline.retrieval_documents(40, 1, 0, "uniform")


class Fake(torch.nn.Module):
    """A decoder whose logits are all on the token ``shift`` positions ahead (1: the true next token, an oracle; 0:
    the current token), or uniform (``shift`` None)."""

    def __init__(self, shift: int | None, vocab: int = 32000):
        super().__init__()
        self.shift, self.vocab = shift, vocab
        self.weight = torch.nn.Parameter(torch.zeros(1))  # where the progress bar's calibration finds the device
        self.cfg = SimpleNamespace(vocab_size=vocab, max_seq_len=128, attention=SimpleNamespace(backend="fake"))

    def features(self, ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, 1): the token it will predict
        return torch.roll(ids, -(self.shift or 0), dims=1)[..., None].float()

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:  # (n, 1) -> (n, V)
        if self.shift is None:
            return torch.zeros(*hidden.shape[:-1], self.vocab)
        return 100.0 * torch.nn.functional.one_hot(hidden[..., 0].long(), self.vocab).float()


def test_the_scorer_passes_an_oracle_and_fails_shifted_and_uniform_models(offline):
    runtime = Runtime(torch.device("cpu"), "32", 0, 200, 0.95)
    models = [LoadedModel(name, Fake(shift), 1) for name, shift in (("oracle", 1), ("uniform", None))]
    out = task.retrieval_recall(models, runtime, offline, [128], 8, "log_uniform")
    (entry,) = out.results["lengths"]
    oracle, uniform = entry["models"]
    for key in ("exact", "baseline_exact"):
        assert oracle["all"][key]["estimate"] == 1.0 and uniform["all"][key]["estimate"] == 0.0
    assert oracle["all"]["nll"] == pytest.approx(0.0, abs=1e-6) and oracle["all"]["baseline_nll"] == pytest.approx(
        0.0, abs=1e-6)
    for item in out.results["items"]:  # uniform: every value token costs log V
        assert item["nll"][1] == pytest.approx(item["value_tokens"] * math.log(32000), rel=1e-6)
        assert item["baseline_nll"][1] == pytest.approx(item["nll"][1], rel=1e-6)
    assert entry["mcnemar"]["a_only"] == entry["items"] == sum(b["n"] for b in oracle["buckets"])
    assert "oracle" not in out.table and "A: fake" in out.table  # labels name the backend
    made = offline.retrieval_documents(128, 1, 0, "uniform")[0]
    doc = recall_document(offline.tokenizer, offline.bos_id, offline.eos_id, made.text, made.facts)
    # one position off (the current token instead of the next) misses every value
    assert not any(hit for hit, _ in score_values(Fake(0), doc.input_ids, [it.span for it in doc.items],
                                                  torch.device("cpu")))


def test_cli_writes_buckets_kinds_and_items_with_compare(tmp_path, ckpts, capsys):
    r = run(tmp_path, "rr", "--task", "retrieval_recall", "--ckpt", ckpts["fpa"], "--compare", ckpts["fox"],
            "--lengths", "64", "128", "--trials", "3")
    res = r["results"]
    assert r["data"]["split"] == "validation" and r["data"]["filler"]["sentences"] > 100
    assert [e["length"] for e in res["lengths"]] == [64, 128] and res["training_length"] == 64
    assert [e["beyond_training"] for e in res["lengths"]] == [False, True] and res["distance_law"] == "log_uniform"
    for e in res["lengths"]:
        assert e["documents"] == 3 and len(e["models"]) == 2 and "mcnemar" in e
        for m in e["models"]:
            assert sum(b["n"] for b in m["buckets"]) == sum(k["n"] for k in m["kinds"]) == m["all"]["n"] == e["items"]
            for b in m["buckets"]:
                low, high = b["distance"]
                assert high == 2 * low and 0 <= b["exact"]["lower"] <= b["exact"]["upper"] <= 1
    metrics = {m["name"]: m for m in res["per_item"]["metrics"]}
    assert list(metrics) == ["exact/64", "nll/64", "exact/128", "nll/128"] and res["per_item"]["unit"] == "fact"
    assert len(res["items"]) == sum(e["items"] for e in res["lengths"])
    assert all(len(it["exact"]) == 2 and it["bucket"][0] <= it["distance"] < it["bucket"][1] for it in res["items"])
    out = capsys.readouterr()
    assert "retrieval recall:" in out.out and "* beyond the training length (64 tokens)" in out.out
    assert "retrieval_recall: 6 documents" in out.err
    # the default length is the checkpoint's training length; a length below a document's least is refused
    single = run(tmp_path, "one", "--task", "retrieval_recall", "--ckpt", ckpts["sdpa"], "--trials", "2")
    assert [e["length"] for e in single["results"]["lengths"]] == [64]
    assert "too short" in error_of(capsys, ["--task", "retrieval_recall", "--ckpt", ckpts["fpa"], "--lengths", "40",
                                            "--out", str(tmp_path / "short")])


def test_several_pairs_compare_across_seeds(tmp_path, ckpts):
    """One pair per training seed (the seed read from each run's config.yaml): each pair evaluated, then eval.py seeds
    on the per-fact metrics."""
    paths = {}
    for backend in ("fpa", "fox"):
        for seed in (0, 1):
            folder = tmp_path / f"{backend}_s{seed}" / "version_0"
            (folder / "checkpoints").mkdir(parents=True)
            (folder / "config.yaml").write_text(f"seed_everything: {seed}\n")
            paths[backend, seed] = str(shutil.copy(ckpts[backend], folder / "checkpoints" / "last.ckpt"))
    path = main(["--task", "retrieval_recall", "--ckpt", paths["fpa", 0], paths["fpa", 1], "--compare",
                 paths["fox", 0], paths["fox", 1], "--trials", "2", "--out", str(tmp_path / "seeds"), *FAST])
    with open(path) as f:
        result = json.load(f)
    assert result["seeds"] == [0, 1] and [m["name"] for m in result["metrics"]] == ["exact/64", "nll/64"]
