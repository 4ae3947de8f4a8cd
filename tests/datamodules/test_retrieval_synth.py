"""The synthetic retrieval documents (datamodules.retrieval_synth): deterministic for a seed, every asked fact stated
earlier in the same document, distances within the limit (counted in the tokenizer's tokens) and following their law
(uniform or log-uniform, within the sampling error and the construction's rounding), and disjoint from the
evaluation's pass-key, RULER and BABILong tasks by construction: their templates, key/value formats, vocabularies
and filler, imported from fpa_lightning.evaluation (never copied)."""
import bisect
import json
import math
import random
import re

import pytest

from datamodules import BOS_ID
from datamodules.corpus import kjv_books
from datamodules.describe_retrieval import describe, main as describe_main
from datamodules.retrieval_synth import (COLOURS, DISTANCE_LAWS, FIRST_NAMES, ITEMS, SURNAMES, TEMPLATES, TOWN_HEADS,
                                         TOWN_TAILS, VALUE_FORMATS, RetrievalSource, distance_cdf, distance_range,
                                         prose_sentences)
from datamodules.stream import SplitSource
from fpa_lightning.evaluation import babilong, passkey, ruler

N_DOCS = 60


@pytest.fixture(scope="module")
def filler(tmp_path_factory):
    """Two KJV books as a train file: the filler's prose."""
    path = tmp_path_factory.mktemp("filler") / "train.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for _, text in kjv_books()[:2]))
    return SplitSource(files=(str(path),))


def source(filler, tok, **kw):
    kw = {"min_tokens": 64, "max_tokens": 512, "max_distance": 200, "filler_chars": 60_000, **kw}
    return RetrievalSource("retrieval", filler, tok, 512, **kw)


@pytest.fixture(scope="module")
def docs(filler, tok):
    src = source(filler, tok)
    return src, [src.document(0, 0, shard, i) for shard in (0, 1) for i in range(N_DOCS // 2)]


def test_deterministic_for_a_seed(filler, tok, docs):
    src, made = docs
    again = source(filler, tok)  # a fresh instance (a fresh worker): the same documents
    assert [again.document(0, 0, 1, i).text for i in range(N_DOCS // 2)] == [d.text for d in made[N_DOCS // 2:]]
    first = [t for t, _ in zip((t for t, _ in again.records(2, 0, 0, 0)), range(3))]
    assert first == [d.text for d in made[:3]]  # records(): document i of the shard
    assert source(filler, tok).document(1, 0, 0, 0).text != made[0].text  # another seed, other documents
    assert len({d.text for d in made}) == len(made)


def test_answers_are_stated_earlier_in_the_document(docs):
    _, made = docs
    recalled = 0
    for doc in made:
        assert 1 <= len(doc.facts) <= 4 and any(f.recall is not None for f in doc.facts)
        values = [f.value for f in doc.facts]
        assert len({f.key for f in doc.facts}) == len(doc.facts) and len(set(values)) == len(values)
        for fact in doc.facts:
            assert fact.kind in TEMPLATES and re.fullmatch(VALUE_FORMATS[fact.kind], fact.value)
            where = doc.text.index(fact.statement)
            assert fact.key in fact.statement and fact.value in fact.statement
            if fact.recall is None:
                continue
            recalled += 1
            assert fact.recall.endswith(f" {fact.value}.") and fact.key in fact.recall
            assert doc.text.index(fact.recall) > where  # asked after it was stated
            if fact.kind != "colour":  # (a colour may be a word of the prose too: "olive")
                assert fact.value not in doc.text[:where]  # the first mention of the answer is the fact itself
    assert recalled >= len(made)


def test_lengths_and_distances_in_tokens(tok, docs):
    src, made = docs

    def tokens_before(text: str, end: int) -> int:  # tokens of text[:end], the pieces' joining space excluded
        return len(tok.encode(text[:end].rstrip(" "), add_special_tokens=False).ids)

    distances = []
    for doc in made:
        assert doc.tokens == len(tok.encode(doc.text, add_special_tokens=False).ids)  # pieces tokenise as the whole
        assert doc.tokens + 2 <= src.max_tokens
        for fact in doc.facts:
            start = doc.text.index(fact.statement)
            assert tokens_before(doc.text, start) == fact.statement_start
            if fact.recall is not None:
                end = doc.text.index(fact.recall) + len(fact.recall)
                assert tokens_before(doc.text, end) == fact.recall_end
                distances.append(fact.distance)
    assert max(distances) <= src.max_distance and max(distances) > src.max_distance // 2
    lengths = [doc.tokens + 2 for doc in made]  # with BOS and EOS
    assert min(lengths) < 200 and max(lengths) > 400  # uniform in [the longest distance, 512] (to half a sentence)


# ------------------------------------------------------------------------------------ the distance law

LAW_DOCS, ALPHA = 200, 1e-3  # documents per law; the chance that a correct generator fails a bound below


def dkw_bound(n: int, alpha: float = ALPHA) -> float:
    """The Dvoretzky-Kiefer-Wolfowitz bound (Massart's constant): for n independent draws of any law F,
    P(sup_x |F_n(x) - F(x)| > eps) <= 2 exp(-2 n eps^2); the eps of probability alpha."""
    return math.sqrt(math.log(2 / alpha) / (2 * n))


def ks_distance(values: list[int], cdf, low: int, high: int) -> float:
    """sup_x |F_n(x) - F(x)| of whole numbers in [low, high] against a law of whole numbers (both step at integers,
    so the integers are every point to check)."""
    values = sorted(values)
    return max(abs(bisect.bisect_right(values, k) / len(values) - cdf(k)) for k in range(low - 1, high + 1))


def modulus(cdf, low: int, high: int, shift: int) -> float:
    """The most F(k + shift) - F(k) over k: how far moving every value by at most ``shift`` moves an empirical CDF."""
    return max(cdf(k + shift) - cdf(k) for k in range(low - 1, high + 1))


@pytest.fixture(scope="module")
def study_docs(filler, tok):
    """LAW_DOCS documents of shard 0 per distance law, at the study's length (seq_len 2048: documents of up to 2048
    tokens, distances up to 2046: 2048 less BOS and EOS)."""
    out = {}
    for law in DISTANCE_LAWS:
        src = RetrievalSource("retrieval", filler, tok, 2048, filler_chars=60_000, distance_law=law)
        out[law] = src, [src.document(0, 0, 0, i) for i in range(LAW_DOCS)]
    return out


@pytest.mark.parametrize("law", DISTANCE_LAWS)
def test_distances_follow_their_law(law, study_docs):
    """The target distances are independent draws of the law (facts are drafted and asked before any distance is
    drawn), so their empirical CDF is within the DKW bound of the law's; each distance is within the layout's rounding
    of its target, so the distances' CDF is within that bound plus the most the rounding can move it."""
    src, made = study_docs[law]
    low, high = distance_range(src.max_tokens, src.max_distance)
    assert (low, high) == (64, 2046)

    def cdf(x):
        return distance_cdf(law, low, high, x)

    longest_sentence = max(map(len, src.pool(0).ids))
    asked, slack = [], 0
    for doc in made:
        pieces = {f.key: sum(map(len, src.encode([f.statement, *([f.recall] if f.recall else [])]))) for f in doc.facts}
        for fact in doc.facts:
            if fact.recall is None:
                assert fact.target_distance is None
                continue
            # half a sentence either side of where the recall is due, a sentence more where the filler the document
            # holds ends before it (it stops up to a sentence short of max_tokens), and the other pieces placed first
            rounding = 1.5 * longest_sentence + sum(pieces.values()) - pieces[fact.key]
            assert low <= fact.target_distance <= high and fact.distance <= src.max_distance
            assert abs(fact.distance - fact.target_distance) <= rounding
            asked.append(fact)
            slack = max(slack, math.ceil(rounding))
    targets, distances = [f.target_distance for f in asked], [f.distance for f in asked]
    assert len(asked) > 1.5 * LAW_DOCS  # 2 recalls a document on average (1-4 facts, each asked with 0.8)
    assert ks_distance(targets, cdf, low, high) <= dkw_bound(len(targets))
    # Version 1's distances (a median of about 190 tokens) are 0.58 from the uniform law, far outside this bound (0.22
    # for the uniform law here; for the log-uniform law the rounding of short distances makes it loose, and the
    # targets' bound above carries the check).
    assert ks_distance(distances, cdf, low, high) <= dkw_bound(len(distances)) + modulus(cdf, low, high, slack)


def test_the_distance_laws_differ(study_docs):
    """The bound above tells the two laws apart: each law's targets are far outside it under the other law."""
    (src, uniform), (_, log_uniform) = study_docs["uniform"], study_docs["log_uniform"]
    low, high = distance_range(src.max_tokens, src.max_distance)
    for made, other in ((uniform, "log_uniform"), (log_uniform, "uniform")):
        targets = [f.target_distance for doc in made for f in doc.facts if f.recall is not None]
        wrong = ks_distance(targets, lambda x: distance_cdf(other, low, high, x), low, high)
        assert wrong > 3 * dkw_bound(len(targets))


def test_describe_prints_the_distribution(filler, tok, study_docs, tmp_path, capsys):
    src, made = study_docs["uniform"]
    summary = describe(src, 20)  # the first 20 documents of shard 0 at seed 0: those above
    distances = sorted(f.distance for doc in made[:20] for f in doc.facts if f.recall is not None)
    assert summary["recalls"] == len(distances) and summary["distance"][0.5] == pytest.approx(
        (distances[(len(distances) - 1) // 2] + distances[len(distances) // 2]) / 2)
    assert summary["above_half"]["tokens"] == 1024 and summary["law_distance"][0.5] == pytest.approx((64 + 2046) / 2)
    assert describe_main(["--filler", filler.files[0], "--seq-len", "512", "--documents", "5"]) == 0
    out = capsys.readouterr().out
    assert "5 documents" in out and "uniform targets in [64, 510]" in out and "measured" in out and "law" in out


def test_the_filler_is_prose_of_the_filler_source(filler, docs):
    src, made = docs
    text = " ".join(" ".join(t.split()) for t, _ in filler.records(1, 0, 0, 0))
    pool = src.pool(0)
    assert pool.sentences and all(s in text for s in pool.sentences)
    for doc in made[:10]:
        rest = doc.text
        for fact in doc.facts:
            rest = rest.replace(fact.statement, "").replace(fact.recall or "\0", "")
        assert all(sentence in pool.sentences for sentence in prose_sentences(rest))
    assert prose_sentences("And God said, Let there be light: and there was light. def f(x): return x. "
                           "In 1611 the translation was printed in London. See `foo` and <b>bar</b> here now.") == [
        "And God said, Let there be light: and there was light."]


# ------------------------------------------------------------------------------------ disjoint from the evaluation

def _eval_templates() -> list[str]:
    """Every fixed text of the evaluation's prompts, as the tasks define them."""
    return [passkey.INTRO, passkey.KEY_SENTENCE, passkey.QUESTION, *passkey.FILLER,
            ruler.NIAH_INTRO, ruler.NEEDLE, ruler.NIAH_QUESTION, ruler.VT_INTRO, ruler.VT_QUESTION, ruler.CWE_INTRO,
            ruler.CWE_QUESTION, ruler.FWE_INTRO, ruler.FWE_QUESTION, babilong.INTRO, babilong.QUESTION]


def _ngrams(template: str, n: int) -> set[tuple[str, ...]]:
    """Word n-grams of a template's fixed text (never across a {placeholder}), lowercased, punctuation dropped."""
    out = set()
    for segment in re.split(r"\{[^}]*\}", template):
        words = re.findall(r"[a-z0-9']+", segment.lower())
        out.update(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    return out


@pytest.fixture(scope="module")
def eval_items(tok):
    """Items of every evaluation task that the training documents must not resemble: pass-key trials, RULER's
    needle/variable-tracking/word tasks, BABILong's five patterns (built by the tasks' own builders)."""
    book = [text for _, text in kjv_books()[:1]]
    trials = passkey.PasskeyBuilder(tok, BOS_ID).trials(256, 40, seed=0)
    builder = ruler.RulerBuilder(tok, BOS_ID, book)
    items = {task: builder.items(task, 1024 if task == "cwe" else 384, 10, seed=0) for task in ruler.RULER_TASKS}
    stories = [babilong.QA[qa](random.Random(f"{qa}/{i}")) for qa in babilong.QA for i in range(20)]
    return trials, items, stories


def test_templates_share_no_phrase_with_the_evaluation(eval_items, docs):
    _, items, stories = eval_items
    _, made = docs
    ours = [t for kind in TEMPLATES.values() for group in kind.values() for t in group]
    # the evaluation's fixed texts, and the BABILong fact and question sentences its generators write
    theirs = _eval_templates() + [s for facts, question, _ in stories for s in (*facts, question)]
    for n in (3, 4):
        shared = set().union(*map(lambda t: _ngrams(t, n), ours)) & set().union(*map(lambda t: _ngrams(t, n), theirs))
        assert not shared, f"word {n}-grams shared with the evaluation's templates: {sorted(shared)}"
    for doc in made:  # no evaluation frame or filler sentence in a generated document
        assert not any(sentence in doc.text for sentence in passkey.FILLER)
        assert "pass key" not in doc.text.lower() and "special magic" not in doc.text.lower()
        assert "Question:" not in doc.text and "Answer:" not in doc.text and "VAR " not in doc.text
    assert sum(len(group) for group in TEMPLATES["code"].values()) == 6  # three phrasings of a fact and of a recall


def test_key_and_value_formats_differ_from_the_evaluation(eval_items):
    trials, items, stories = eval_items
    theirs = {str(t.key) for t in trials}  # 5-digit pass keys
    for task, task_items in items.items():
        if task in ("cwe", "fwe"):
            continue  # aggregation tasks: their answers are words of the book or random letters, not keys or values
        for item in task_items:
            theirs.update(item.references)  # values (7 digits, UUIDs), variable names, words
            theirs.update(str(k) for k in item.meta.get("keys", ()))  # needle keys: adjective-noun or UUID
            if "value" in item.meta:
                theirs.add(item.meta["value"])  # variable tracking's 5-digit value
    theirs.update(answer for _, _, answer in stories)
    assert len(theirs) > 200
    for kind, pattern in VALUE_FORMATS.items():
        matching = sorted(v for v in theirs if re.fullmatch(pattern, v, flags=re.IGNORECASE))
        assert not matching, f"evaluation keys/values in our {kind!r} format: {matching[:5]}"
    # the words our keys and values are made of are none of the evaluation's names, places, objects or key words
    words = {w.lower() for w in (*FIRST_NAMES, *SURNAMES, *COLOURS, *(w for i in ITEMS for w in i.split()))}
    words |= {(h + t).lower() for h in TOWN_HEADS for t in TOWN_TAILS}
    eval_words = {w.lower() for w in (*babilong.PEOPLE, *babilong.GIVERS, *babilong.PLACES, *babilong.OBJECTS,
                                      *ruler.ADJECTIVES, *ruler.NOUNS)}
    assert not words & eval_words
