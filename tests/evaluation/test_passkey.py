"""The pass-key generator (length, depth, text) and the one-pass scorer against token-by-token greedy decoding."""
import pytest
import torch

from fpa_lightning.evaluation.passkey import FILLER, KEY_SENTENCE, QUESTION, PasskeyBuilder, score_trial


@pytest.fixture(scope="module")
def builder(tokenizer):
    return PasskeyBuilder(tokenizer, bos_id=1)


def test_trial_length_and_text(builder, tokenizer):
    longest_sentence = max(len(s) for s in builder.filler)
    for length in (128, 256, 1000):
        t = builder.trial(length, depth=0.3, key=12345)
        assert length - longest_sentence < t.length <= length
        assert t.input_ids.numel() == t.length - 1  # the last answer token is only a label
        assert t.input_ids[0] == 1
        text = tokenizer.decode(t.input_ids[1 : t.prompt_len].tolist())  # after BOS
        assert KEY_SENTENCE.format(key=12345) in text and text.endswith(QUESTION) and FILLER[0] in text
        assert tokenizer.decode(t.answer.tolist()).strip() == "12345"
        # assembling separately tokenised sentences equals tokenising the whole prompt text
        whole = tokenizer.encode(text, add_special_tokens=False).ids
        assert whole == t.input_ids[1 : t.prompt_len].tolist()


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_key_sits_at_the_requested_depth(builder, depth):
    t = builder.trial(1024, depth=depth, key=54321)
    key_ids = builder.encode(KEY_SENTENCE.format(key=54321))
    assert t.input_ids[t.key_start : t.key_start + len(key_ids)].tolist() == key_ids
    filler_start = 1 + len(builder.intro)
    filler_end = t.prompt_len - len(builder.question)  # filler region incl. the key sentence
    filler_tokens = filler_end - filler_start - len(key_ids)
    measured = (t.key_start - filler_start) / filler_tokens
    assert measured == pytest.approx(depth, abs=0.02)  # one filler sentence of ~1000 tokens is < 1%


def test_trials_are_reproducible_and_vary(builder):
    a, b = builder.trials(256, 20, seed=7), builder.trials(256, 20, seed=7)
    assert [(x.key, x.depth) for x in a] == [(x.key, x.depth) for x in b]
    assert all(torch.equal(x.input_ids, y.input_ids) for x, y in zip(a, b))
    assert len({x.key for x in a}) > 15 and all(10_000 <= x.key <= 99_999 for x in a)
    assert [x.key for x in builder.trials(256, 20, seed=8)] != [x.key for x in a]


def test_too_short_or_bad_depth_is_an_error(builder):
    with pytest.raises(ValueError, match="too short"):
        builder.trial(40, 0.5, 11111)
    with pytest.raises(ValueError, match="depth"):
        builder.trial(256, 1.5, 11111)


class WindowedCopyModel(torch.nn.Module):
    """Duck-typed Decoder that solves the task by copying: at t it finds the latest earlier j whose
    trigram ends like t's within the last `window` tokens and predicts the token after j. Keys deeper
    than the window are missed, so outcomes are mixed."""

    def __init__(self, window: int, vocab: int = 32000):
        super().__init__()
        self.window, self.vocab = window, vocab
        self.lm_head = torch.nn.Identity()

    def features(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids[0].tolist()
        logits = torch.zeros(1, len(seq), self.vocab)
        for t in range(2, len(seq)):
            for j in range(t - 1, max(1, t - self.window), -1):
                if seq[j - 2 : j + 1] == seq[t - 2 : t + 1]:
                    logits[0, t, seq[j + 1]] = 1.0
                    break
        return logits


def greedy_decode(model, prompt: torch.Tensor, steps: int) -> list[int]:
    """The reference: append the argmax token one step at a time."""
    ids = prompt[None].clone()
    out = []
    for _ in range(steps):
        nxt = model.lm_head(model.features(ids))[0, -1].argmax()
        out.append(int(nxt))
        ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return out


def test_one_pass_scorer_agrees_with_greedy_decoding(builder, ckpts):
    from fpa_lightning.evaluation.checkpoint import load_decoder

    tiny = load_decoder(ckpts["fpa"], torch.device("cpu")).decoder
    trials = builder.trials(160, 12, seed=1)
    outcomes = []
    for model in (WindowedCopyModel(window=60), tiny):
        for t in trials:
            greedy = greedy_decode(model, t.input_ids[: t.prompt_len], t.answer.numel()) == t.answer.tolist()
            assert score_trial(model, t, torch.device("cpu")).success == greedy
            outcomes.append(greedy)
    assert any(outcomes) and not all(outcomes)  # both branches of the comparison were exercised
