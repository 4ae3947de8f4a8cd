"""lm-eval's own `hf` model on an export (trust_remote_code=True) scores as our adapter (`eval.py --task lm_eval`):
on the local cloze task the same accuracies and, per item, the same log-likelihoods and greedy flags; on a local
generation task the same greedy continuations (batched, left-padded, through FPACache)."""
import json
import pathlib

import pytest
import torch

import transformers  # noqa: E402,F401  declared in the dev extra: a broken install fails here rather than skips
import lm_eval  # noqa: E402  declared in the dev extra
from lm_eval.tasks import TaskManager  # noqa: E402

from eval import main  # noqa: E402
from fpa_lightning.evaluation.checkpoint import load_decoder  # noqa: E402
from fpa_lightning.evaluation.harness import DecoderLM  # noqa: E402
from fpa_lightning.evaluation.scoring import Runtime  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
CLOZE = "kjv_cloze"  # examples/lm_eval: 18 verse endings, 4 choices each
PROMPTS = ["In the beginning God created", "The LORD is my shepherd;", "And God said, Let there be"]


@pytest.fixture(scope="module")
def export(ckpts, tmp_path_factory):
    out = tmp_path_factory.mktemp("lm_eval") / "export"
    main(["export", "--ckpt", ckpts["fpa"], "--out", str(out)])
    return out


@pytest.fixture(scope="module")
def adapter(ckpts, tokenizer):
    decoder = load_decoder(ckpts["fpa"], torch.device("cpu")).decoder
    return DecoderLM(decoder, tokenizer, 1, 2, Runtime(torch.device("cpu"), "32", 0, 100, 0.95), batch_size=4)


def hf_model(export, manager: TaskManager, task: str) -> dict:
    """`lm_eval --model hf --model_args pretrained=EXPORT,trust_remote_code=True` on one task, in process."""
    return lm_eval.simple_evaluate(model="hf", tasks=[task], task_manager=manager, log_samples=True, bootstrap_iters=0,
                                   model_args=f"pretrained={export},trust_remote_code=True,device=cpu,batch_size=4")


def per_item(run: dict, task: str) -> list[tuple[int, list]]:
    """(doc id, filtered responses) of every scored document."""
    return sorted((s["doc_id"], s["filtered_resps"]) for s in run["samples"][task])


def test_cloze_scores_equal_our_adapter(export, adapter, ckpts, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the task's data_files path is relative to the repository root
    ours = main(["--task", "lm_eval", "--ckpt", ckpts["fpa"], "--include-path", "examples/lm_eval", "--tasks", CLOZE,
                 "--batch-size", "4", "--out", str(tmp_path / "ours"), "--n-boot", "100"])
    ours = {row["metric"]: row["models"][0]["value"] for row in json.load(open(ours))["results"]["tasks"]}
    manager = TaskManager(include_path=str(REPO / "examples" / "lm_eval"), include_defaults=False)
    hf = hf_model(export, manager, CLOZE)
    assert {m: hf["results"][CLOZE][f"{m},none"] for m in ("acc", "acc_norm")} == ours
    reference = lm_eval.simple_evaluate(model=adapter, tasks=[CLOZE], task_manager=manager, log_samples=True,
                                        bootstrap_iters=0)
    items, expected = per_item(hf, CLOZE), per_item(reference, CLOZE)
    assert [doc for doc, _ in items] == list(range(18)) == [doc for doc, _ in expected]
    for (_, responses), (_, reference_responses) in zip(items, expected):
        assert [greedy for _, greedy in responses] == [greedy for _, greedy in reference_responses]
        assert [lp for lp, _ in responses] == pytest.approx([lp for lp, _ in reference_responses], rel=1e-5, abs=1e-5)


def test_generate_until_equals_our_adapter(export, adapter, tmp_path):
    (tmp_path / "gen.jsonl").write_text("".join(json.dumps({"q": p, "a": "x"}) + "\n" for p in PROMPTS))
    (tmp_path / "gen.yaml").write_text(f"""task: tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tmp_path / "gen.jsonl"}
test_split: test
output_type: generate_until
doc_to_text: "{{{{q}}}}"
doc_to_target: "{{{{a}}}}"
generation_kwargs:
  until: ["zzqqzz"]
  max_gen_toks: 12
  do_sample: false
metric_list:
  - metric: exact_match
""")
    manager = TaskManager(include_path=str(tmp_path), include_defaults=False)
    hf = hf_model(export, manager, "tiny_gen")
    reference = lm_eval.simple_evaluate(model=adapter, tasks=["tiny_gen"], task_manager=manager, log_samples=True,
                                        bootstrap_iters=0)
    texts = per_item(hf, "tiny_gen")
    assert texts == per_item(reference, "tiny_gen") and all(text[0] for _, text in texts)  # non-empty, identical
