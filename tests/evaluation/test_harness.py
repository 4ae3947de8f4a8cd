"""The lm-evaluation-harness adapter: its log-likelihoods equal our own Decoder.token_losses, greedy generation equals
token-by-token argmax decoding, and eval.py runs a local YAML task through lm_eval.simple_evaluate offline."""
import json

import pytest
import torch

import lm_eval  # noqa: F401  (the eval extra, in dev: a broken install fails, it is not skipped)
from lm_eval.api.instance import Instance

from eval import main  # noqa: E402
from fpa_lightning.evaluation.checkpoint import load_decoder  # noqa: E402
from fpa_lightning.evaluation.harness import DecoderLM  # noqa: E402
from fpa_lightning.evaluation.scoring import Runtime  # noqa: E402

CPU = torch.device("cpu")
QUESTIONS = [("And God said, Let there be", ["light", "cheese", "radio"]),
             ("In the beginning God created the heaven and the", ["earth", "car", "phone"]),
             ("The king said unto", ["them", "blue", "seven"])]


@pytest.fixture(scope="module")
def lm(ckpts, tokenizer):
    decoder = load_decoder(ckpts["fpa"], CPU).decoder
    return DecoderLM(decoder, tokenizer, 1, 2, Runtime(CPU, "32", 0, 100, 0.95), max_length=48, batch_size=3)


def own_logprob(lm, context_ids, continuation_ids) -> float:
    """−Σ token_losses over the continuation, one sequence at a time."""
    ids = torch.tensor([context_ids + continuation_ids])
    with torch.no_grad():
        losses = lm.decoder.token_losses(ids[:, :-1], ids[:, 1:])[0]
    return -float(losses[-len(continuation_ids):].sum())


def own_greedy(lm, context_ids, continuation_ids) -> bool:
    ids = torch.tensor([context_ids + continuation_ids])
    with torch.no_grad():
        argmax = lm.decoder(ids[:, :-1])[0, -len(continuation_ids):].argmax(-1)
    return argmax.tolist() == continuation_ids


def request(kind, *args):
    return Instance(request_type=kind, doc={}, arguments=args, idx=0)


def test_loglikelihood_equals_token_losses(lm):
    pairs = [("The sky is", " blue"), ("The sky is ", "blue"), ("", "Hello there"), ("Abc", " def ghi jkl"),
             ("word " * 60, " end")]  # the last one is left-truncated to max_length
    out = lm.loglikelihood([request("loglikelihood", c, x) for c, x in pairs])
    for (context, continuation), (logprob, greedy) in zip(pairs, out):
        ctx, cont = lm.encode_pair(context, continuation)
        assert ctx[0] == 1 and lm.tokenizer.decode(cont).strip() == continuation.strip()
        kept = (ctx + cont)[-(lm.max_length + 1):]
        assert logprob == pytest.approx(own_logprob(lm, kept[:-len(cont)], cont), rel=1e-5, abs=1e-4)
        assert greedy == own_greedy(lm, kept[:-len(cont)], cont)


def test_rolling_loglikelihood_scores_every_token_once(lm):
    short, long = "In the beginning God created the heaven.", " ".join(["and the earth was without form"] * 20)
    out = lm.loglikelihood_rolling([request("loglikelihood_rolling", short), request("loglikelihood_rolling", long)])
    tokens = lm.encode(short)
    assert out[0] == pytest.approx(own_logprob(lm, [1], tokens), rel=1e-5)
    tokens, n = lm.encode(long), lm.max_length
    assert len(tokens) > 2 * n
    expected = own_logprob(lm, [1], tokens[:n])  # the first window: n tokens after BOS
    for start in range(n, len(tokens), n):  # later windows: n tokens predicted from the n before each
        end = min(start + n, len(tokens))
        expected += own_logprob(lm, tokens[end - n - 1:start], tokens[start:end])
    assert out[1] == pytest.approx(expected, rel=1e-5)


def test_generate_until_is_greedy(lm):
    prompt = "The sky is"
    ids = [1, *lm.encode(prompt)]
    for _ in range(5):
        with torch.no_grad():
            ids.append(int(lm.decoder(torch.tensor([ids]))[0, -1].argmax()))
    expected = lm.tokenizer.decode([t for t in ids[-5:] if t != 2])
    out = lm.generate_until([request("generate_until", prompt, {"until": ["zzqqzz"], "max_gen_toks": 5})])
    assert out == [expected]
    with pytest.raises(ValueError, match="only greedy"):
        lm.generate_until([request("generate_until", prompt, {"do_sample": True})])


def test_eval_runs_a_local_yaml_task_offline(tmp_path, ckpts, lm, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    docs = [{"question": q, "choices": c, "answer": 0} for q, c in QUESTIONS]
    (tmp_path / "tiny.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / "tiny.yaml").write_text(f"""task: tiny_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tmp_path / "tiny.jsonl"}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
""")
    path = main(["--task", "lm_eval", "--ckpt", ckpts["fpa"], "--compare", ckpts["fox"], "--tasks", "tiny_choice",
                 "--include-path", str(tmp_path), "--out", str(tmp_path / "out"), "--n-boot", "100"])
    row = json.load(open(path))["results"]["tasks"][0]
    assert row["task"] == "tiny_choice" and row["metric"] == "acc" and row["models"][0]["n"] == 3
    # the harness's accuracy from our own token_losses: the choice " x" with the highest log-likelihood
    correct = 0
    for question, choices in QUESTIONS:
        scores = [own_logprob(lm, *lm.encode_pair(question, " " + c)) for c in choices]
        correct += scores.index(max(scores)) == 0
    assert row["models"][0]["value"] == pytest.approx(correct / 3)
    assert set(row["mcnemar"]) >= {"p_a_better"} and "exact_interval" in row["models"][1]
    captured = capsys.readouterr()
    assert "lm_eval A loglikelihood: 9/9 requests" in captured.err and "tiny_choice" in captured.out
