"""RULER-style generators: every answer is recomputed from the prompt text by an independent reading of the task's
definition; RULER's string match on known cases; the answer reader is greedy decoding."""
import re
from collections import Counter

import pytest
import torch

from fpa_lightning.evaluation.answers import (ANSWER_SLACK, PieceEncoder, PromptItem, insert_at_depths, predict,
                                              string_match_all, take_units)
from fpa_lightning.evaluation.ruler import NEEDLE_TASKS, RULER_TASKS, RulerBuilder

LENGTHS = (1024, 2048)
ITEMS = 3


@pytest.fixture(scope="module")
def builder(tokenizer):
    from datamodules import EvalCorpus

    return RulerBuilder(tokenizer, 1, EvalCorpus(None).texts(None))


def text_of(builder, item: PromptItem) -> str:
    return builder.encode.decode(item.prompt)


def check_common(builder, item: PromptItem, length: int) -> str:
    """Every item: BOS first, within its length and close to it, the answer's tokens spelling the references."""
    assert item.prompt[0] == 1 and item.tokens <= length
    assert item.tokens > 0.9 * length  # the haystack fills the budget
    answer = builder.encode.decode(item.answer)
    assert string_match_all(answer, item.references) == 1.0
    return text_of(builder, item)


@pytest.mark.parametrize("task", sorted(NEEDLE_TASKS))
def test_needle_answers_follow_from_the_text(builder, task):
    spec = NEEDLE_TASKS[task]
    for length in LENGTHS:
        for item in builder.items(task, length, ITEMS, seed=0):
            text = check_common(builder, item, length)
            needles = re.findall(r"One of the special magic (?:numbers|uuids) for (\S+) is: (\S+)\.", text)
            asked = re.search(r"Question: what are all the special magic \w+ for (.+?) in the text above\?", text)
            keys = re.split(r", | and ", asked.group(1))
            assert len(keys) == spec.n_queries
            expected = [value for key in keys for k, value in needles if k == key]  # query order, then text order
            assert list(item.references) == expected
            assert len(expected) == spec.n_queries * spec.n_values
            if spec.haystack == "needles":
                assert len(needles) > length // 150  # a haystack of needles (~20-70 tokens each) with other keys
                assert len({k for k, _ in needles}) == len(needles)
            else:
                assert len(needles) == spec.n_queries * spec.n_values + spec.n_keys - spec.n_queries
            if spec.haystack == "noise":
                assert "The grass is green." in text
            value = r"\d{7}" if spec.value_kind == "number" else r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-"
            assert all(re.match(value, v) for v in item.references)


def test_variable_tracking_answers_follow_from_the_assignments(builder):
    for length in LENGTHS:
        for item in builder.items("vt", length, ITEMS, seed=1):
            text = check_common(builder, item, length)
            value_of = {}
            for name, rhs in re.findall(r"VAR ([A-Z]{5}) = ((?:VAR [A-Z]{5})|\d+)\.", text):
                value_of[name] = value_of[rhs[4:]] if rhs.startswith("VAR") else rhs
            asked = re.search(r"which variables in the text above are assigned the value (\d+)\?", text).group(1)
            holders = [name for name, v in value_of.items() if v == asked]  # in the order of the text
            assert list(item.references) == holders and len(holders) == 5


def test_common_words_are_the_most_frequent_entries(builder):
    for length in LENGTHS:
        for item in builder.items("cwe", length, ITEMS, seed=2):
            text = check_common(builder, item, length)
            listing = text.split("Some words occur many times in it. ")[1].split(" Question:")[0]
            entries = re.findall(r"(\d+)\. (\w+)", listing)
            assert [int(n) for n, _ in entries] == list(range(1, len(entries) + 1))
            counts = Counter(w for _, w in entries)
            common = set(item.references)
            assert len(common) == 10
            assert min(counts[w] for w in common) > max(c for w, c in counts.items() if w not in common)


def test_frequent_words_are_the_top_three(builder):
    for length in LENGTHS:
        for item in builder.items("fwe", length, ITEMS, seed=3):
            text = check_common(builder, item, length)
            coded = text.split("much more often than others. ")[1].split(" Question:")[0].split()
            ranked = Counter(coded).most_common()
            assert list(item.references) == [w for w, _ in ranked[:3]]
            assert ranked[0][1] > ranked[1][1] > ranked[2][1] > ranked[3][1]


def test_items_are_reproducible_and_vary(builder):
    a = builder.items("niah_multikey_1", 1024, 2, seed=5)
    b = builder.items("niah_multikey_1", 1024, 2, seed=5)
    assert [x.prompt for x in a] == [x.prompt for x in b]
    assert a[0].prompt != a[1].prompt
    assert builder.items("niah_multikey_1", 1024, 1, seed=6)[0].prompt != a[0].prompt


def test_too_short_and_unknown_are_errors(builder, tokenizer):
    with pytest.raises(ValueError, match="too short"):
        builder.items("cwe", 256, 1, seed=0)
    with pytest.raises(ValueError, match="unknown ruler task"):
        builder.items("qa_1", 1024, 1, seed=0)
    with pytest.raises(ValueError, match="needs book text"):
        RulerBuilder(tokenizer, 1, None).items("niah_single_2", 1024, 1, seed=0)
    assert set(RULER_TASKS) == {*NEEDLE_TASKS, "vt", "cwe", "fwe"}


def test_string_match_on_known_cases():
    assert string_match_all("The numbers are 1234567 and 7654321.", ["1234567", "7654321"]) == 1.0
    assert string_match_all("1234567, 1111111", ["1234567", "7654321"]) == 0.5
    assert string_match_all("ABCDE fghij", ["abcde", "FGHIJ", "KLMNO"]) == pytest.approx(2 / 3)  # case-insensitive
    assert string_match_all("", ["x"]) == 0.0
    assert string_match_all("kitchens", ["kitchen"]) == 1.0  # a substring counts, as in RULER


def test_insert_at_depths_and_take_units():
    units = [[1], [2], [3], [4]]
    tokens, offsets = insert_at_depths(units, [[8, 8], [9]], [0.5, 1.0])
    assert tokens == [1, 2, 8, 8, 3, 4, 9] and offsets == [2, 6]
    assert insert_at_depths(units, [[7]], [0.0]) == ([7, 1, 2, 3, 4], [0])
    assert take_units(iter([[1, 1], [2], [3, 3, 3], [4]]), 4) == [[1, 1], [2]]  # stops at the first misfit
    with pytest.raises(ValueError):
        insert_at_depths(units, [[7]], [1.5])


def greedy_decode(decoder, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(decoder(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt):]


def test_predict_is_greedy_decoding(ckpts, tokenizer):
    """The answer read through the KV cache equals token-by-token argmax decoding with full forward passes."""
    from fpa_lightning.evaluation.checkpoint import load_decoder

    decoder = load_decoder(ckpts["fpa"], torch.device("cpu")).decoder
    encoder = PieceEncoder(tokenizer)
    prompt = [1, *encoder("The sky is blue. The grass is")]
    greedy = greedy_decode(decoder, prompt, 3 + ANSWER_SLACK)
    for answer in (greedy[:3], greedy[:2] + [greedy[2] + 1]):  # the canonical answer sets only the length
        p = predict(decoder, PromptItem("t", 64, prompt, answer, ("x",)), encoder, eos_id=None)
        assert p.tokens == greedy and p.text == tokenizer.decode(greedy)
    eos = greedy[1]  # generation ends at the first EOS, which is left out
    p = predict(decoder, PromptItem("t", 64, prompt, greedy[:3], ("x",)), encoder, eos_id=eos)
    assert p.tokens == greedy[:greedy.index(eos)]
