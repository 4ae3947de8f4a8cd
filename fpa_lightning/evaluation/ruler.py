"""RULER-style synthetic long-context tasks (Hsieh et al. 2024, "RULER: What's the real context size of your
long-context language models?"), generated offline from a seed. The task families and their parameters follow
RULER; the wording is this project's.

* Needle in a haystack (``niah_*``): "the special magic number for <key> is <value>" hidden in a haystack of
  filler sentences (``noise``), of book text (``book``), or of other needles with other keys (``needles``):
  one needle (``single``), distractor needles with other keys (``multikey``), several values for the key
  (``multivalue``), several keys asked at once (``multiquery``).
* Variable tracking (``vt``): ``VAR X = 12345`` then a chain ``VAR Y = VAR X`` ... in filler; name every
  variable that holds the value.
* Common-words extraction (``cwe``): a numbered list of words from the book text in which a few words occur
  many times and the others a few times; name the frequent ones.
* Frequent-words extraction (``fwe``): coded (random) words drawn from a Zipf distribution; name the three most
  frequent.

Every item fits in its nominal length (prompt + answer tokens) and is reproducible from (task, seed, length,
index): two checkpoints always see the same prompts. The canonical answer lists the references in the order
a reader meets them (query order for several keys); see ``answers`` for how answers are scored.
"""
from __future__ import annotations

import itertools
import random
import string
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fpa_lightning.evaluation.answers import BookHaystack, PieceEncoder, PromptItem, insert_at_depths, take_units
from fpa_lightning.evaluation.passkey import FILLER

# keys of the needles: "<adjective>-<noun>" (4,096 of them)
ADJECTIVES = tuple("""
amber bitter brave brisk calm clever cold crimson curious dusty eager early faint fierce gentle gloomy golden
grand hollow humble icy idle jolly keen lively lonely loud lucky merry mild misty modest narrow noble odd pale
patient plain proud quiet rapid rare rough royal rusty silent silver sleepy slow smooth sour steady still stormy
sunny swift tame tender tidy vast velvet warm wild witty young
""".split())
NOUNS = tuple("""
anchor apple arrow badge barrel basket beacon bell blanket bridge bucket button cabin candle canyon carpet castle
cellar chimney cloud comet compass cradle crystal desk drum engine falcon feather fiddle forest fountain garden
glacier hammer harbor helmet island jacket kettle ladder lantern meadow mirror needle orchard paddle pebble pillow
puzzle quarry ribbon saddle shovel spoon thimble tower tunnel valley wagon whistle
""".split())

NIAH_INTRO = ("Special magic {kinds} are hidden in the text below. Memorize them: a question about them follows "
              "the text.")
NEEDLE = "One of the special magic {kinds} for {key} is: {value}."
NIAH_QUESTION = ("Question: what are all the special magic {kinds} for {keys} in the text above? "
                 "Answer: the special magic {kinds} for {keys} in the text above are")
VT_INTRO = "Memorize the variable assignments hidden in the text below: a question about them follows the text."
VT_QUESTION = ("Question: which variables in the text above are assigned the value {value}? "
               "Answer: the variables that are assigned the value {value} are")
CWE_INTRO = "Below is a numbered list of words. Some words occur many times in it."
CWE_QUESTION = ("Question: which {n} words occur most often in the list above? "
                "Answer: the {n} words that occur most often in the list are")
FWE_INTRO = "Below is a text of coded words. Some coded words occur much more often than others."
FWE_QUESTION = ("Question: which three coded words occur most often in the coded text above? "
                "Answer: the three most frequent coded words are")


@dataclass(frozen=True)
class NeedleSpec:
    """A needle-in-a-haystack variant (RULER's niah_* configurations)."""

    haystack: str  # "noise" (filler sentences), "book" (local text) or "needles" (needles with other keys)
    key_kind: str  # "word" (adjective-noun) or "uuid"
    value_kind: str  # "number" (7 digits) or "uuid"
    n_keys: int = 1  # needles with distinct keys; the first n_queries are asked about, the rest distract
    n_values: int = 1  # needles (values) per asked key
    n_queries: int = 1


NEEDLE_TASKS = {
    "niah_single_1": NeedleSpec("noise", "word", "number"),
    "niah_single_2": NeedleSpec("book", "word", "number"),
    "niah_single_3": NeedleSpec("book", "word", "uuid"),
    "niah_multikey_1": NeedleSpec("book", "word", "number", n_keys=4),
    "niah_multikey_2": NeedleSpec("needles", "word", "number"),
    "niah_multikey_3": NeedleSpec("needles", "uuid", "uuid"),
    "niah_multivalue": NeedleSpec("book", "word", "number", n_values=4),
    "niah_multiquery": NeedleSpec("book", "word", "number", n_keys=4, n_queries=4),
}
RULER_TASKS = (*NEEDLE_TASKS, "vt", "cwe", "fwe")
BOOK_TASKS = frozenset({*(name for name, spec in NEEDLE_TASKS.items() if spec.haystack == "book"), "cwe"})

VT_HOPS = 4  # a chain of 5 variables (RULER: one chain, four hops)
CWE_COMMON, CWE_COMMON_REPEATS, CWE_RARE_REPEATS = 10, 30, 3  # RULER's cwe settings
FWE_ALPHA, FWE_TOP = 2.0, 3  # Zipf exponent over the coded vocabulary; the answer's size


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _value(kind: str, rng: random.Random) -> str:
    return str(rng.randint(1_000_000, 9_999_999)) if kind == "number" else _uuid(rng)


def _keys(kind: str, n: int, rng: random.Random) -> list[str]:
    """n distinct keys."""
    if kind == "uuid":
        return [_uuid(rng) for _ in range(n)]
    pairs = rng.sample(range(len(ADJECTIVES) * len(NOUNS)), n)
    return [f"{ADJECTIVES[p // len(NOUNS)]}-{NOUNS[p % len(NOUNS)]}" for p in pairs]


def _and(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def book_words(texts: Sequence[str]) -> list[str]:
    """Distinct lowercase alphabetic words of at least three letters, in order of first appearance."""
    seen = {}
    for text in texts:
        for raw in text.split():
            word = raw.strip(string.punctuation).lower()
            if len(word) >= 3 and word.isalpha() and word.isascii():
                seen.setdefault(word, None)
    return list(seen)


class RulerBuilder:
    """Builds the items of every task; ``book_texts`` feed the book haystack and the cwe vocabulary (needed only
    for the tasks in BOOK_TASKS)."""

    def __init__(self, tokenizer, bos_id: int, book_texts: Sequence[str] | None = None):
        self.encode = PieceEncoder(tokenizer)
        self.bos_id = bos_id
        self.noise = self.encode.many(FILLER)
        self.book = BookHaystack(book_texts, self.encode) if book_texts else None
        self.words = book_words(book_texts) if book_texts else []
        self.word_ids = dict(zip(self.words, self.encode.many(self.words)))  # cwe list entries: "<n>." then the word
        self.number_ids: list[list[int]] = []  # number_ids[i] = tokens of f"{i + 1}."

    def items(self, task: str, length: int, n: int, seed: int) -> list[PromptItem]:
        """n items of ``task`` at ``length`` tokens, item i reproducible from (task, seed, length, i)."""
        make = self._maker(task)
        return [make(length, random.Random(f"ruler/{task}/{seed}/{length}/{i}")) for i in range(n)]

    def _maker(self, task: str) -> Callable[[int, random.Random], PromptItem]:
        if task in NEEDLE_TASKS:
            spec = NEEDLE_TASKS[task]
            if spec.haystack == "book" and self.book is None:
                raise ValueError(f"ruler task {task} needs book text for its haystack")
            return lambda length, rng: self.needles(task, spec, length, rng)
        if task == "cwe" and not self.words:
            raise ValueError("ruler task cwe needs book text for its words")
        makers = {"vt": self.variable_tracking, "cwe": self.common_words, "fwe": self.frequent_words}
        if task not in makers:
            raise ValueError(f"unknown ruler task {task!r}; known: {', '.join(RULER_TASKS)}")
        return makers[task]

    # ------------------------------------------------------------------------------------------ assembly

    def _item(self, task: str, length: int, intro: str, context: list[int], question: str, answer: str,
              references: Sequence[str], meta: dict) -> PromptItem:
        prompt = [self.bos_id, *self.encode(intro), *context, *self.encode(question)]
        item = PromptItem(task, length, prompt, self.encode(answer), tuple(references), meta)
        if item.tokens > length:
            raise ValueError(f"ruler {task}: length {length} is too short: the prompt without haystack already "
                             f"has {item.tokens} tokens")
        return item

    def _budget(self, length: int, fixed_texts: Sequence[str], inserts: Sequence[list[int]], task: str) -> int:
        budget = length - 1 - sum(len(self.encode(t)) for t in fixed_texts) - sum(len(i) for i in inserts)
        if budget <= 0:
            raise ValueError(f"ruler {task}: length {length} is too short for its question and needles")
        return budget

    # ------------------------------------------------------------------------------------------ the tasks

    def needles(self, task: str, spec: NeedleSpec, length: int, rng: random.Random) -> PromptItem:
        kinds = "numbers" if spec.value_kind == "number" else "uuids"
        keys = _keys(spec.key_kind, spec.n_keys, rng)
        queried = keys[:spec.n_queries]
        # (key, value) needles: n_values per queried key, one per distractor key
        needles = [(k, _value(spec.value_kind, rng)) for k in queried for _ in range(spec.n_values)]
        needles += [(k, _value(spec.value_kind, rng)) for k in keys[spec.n_queries:]]
        rng.shuffle(needles)
        inserts = [self.encode(NEEDLE.format(kinds=kinds, key=k, value=v)) for k, v in needles]
        # references in the order a reader meets them: by key in query order, values in text order
        values = [v for q in queried for k, v in needles if k == q]
        question = NIAH_QUESTION.format(kinds=kinds, keys=_and(queried))
        intro = NIAH_INTRO.format(kinds=kinds)
        budget = self._budget(length, [intro, question, ", ".join(values)], inserts, task)
        haystack = self._haystack(spec, budget, rng, kinds, set(keys))
        depths = sorted(rng.random() for _ in inserts)
        context, _ = insert_at_depths(haystack, inserts, depths)
        return self._item(task, length, intro, context, question, ", ".join(values), values,
                          {"keys": queried, "depths": depths, "needles": len(needles)})

    def _haystack(self, spec: NeedleSpec, budget: int, rng: random.Random, kinds: str,
                  used: set[str]) -> list[list[int]]:
        if spec.haystack == "noise":
            return take_units(itertools.cycle(self.noise), budget)
        if spec.haystack == "book":
            return self.book.take(budget, rng)

        def distractor() -> str:  # a needle with a key not asked about, a value of the same kind
            while (key := _keys(spec.key_kind, 1, rng)[0]) in used:
                pass
            used.add(key)
            return NEEDLE.format(kinds=kinds, key=key, value=_value(spec.value_kind, rng))

        units = [self.encode(distractor())]
        total = len(units[0])
        while total <= budget:  # batches of about as many as still fit, tokenised together
            more = self.encode.many([distractor() for _ in range(int((budget - total) * len(units) / total) + 8)])
            units += more
            total += sum(len(u) for u in more)
        return take_units(units, budget)

    def variable_tracking(self, length: int, rng: random.Random) -> PromptItem:
        value = str(rng.randint(10_000, 99_999))
        names = []
        while len(names) < VT_HOPS + 1:
            name = "".join(rng.choices(string.ascii_uppercase, k=5))
            if name not in names:
                names.append(name)
        statements = [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in zip(names, names[1:])]
        inserts = [self.encode(s) for s in statements]
        question = VT_QUESTION.format(value=value)
        budget = self._budget(length, [VT_INTRO, question, " ".join(names)], inserts, "vt")
        haystack = take_units(itertools.cycle(self.noise), budget)
        depths = sorted(rng.random() for _ in inserts)  # the chain in order: each assignment after the one it reads
        context, _ = insert_at_depths(haystack, inserts, depths)
        return self._item("vt", length, VT_INTRO, context, question, " ".join(names), names,
                          {"value": value, "depths": depths})

    def common_words(self, length: int, rng: random.Random) -> PromptItem:
        """CWE_COMMON words occur CWE_COMMON_REPEATS times and the words that fill the rest of the list
        CWE_RARE_REPEATS times; where the common words would take more than half the list (short lengths) both
        shrink, the common words always occurring more often."""
        question = CWE_QUESTION.format(n=CWE_COMMON)
        pool = rng.sample(self.words, min(len(self.words), length // 8 + CWE_COMMON))  # more words than fit
        common, rare = pool[:CWE_COMMON], iter(pool[CWE_COMMON:])
        numbers = self._numbers(length)
        entry = len(numbers[-1]) + max(len(self.word_ids[w]) for w in common)  # tokens of a common entry, at most
        budget = self._budget(length, [CWE_INTRO, question, ", ".join(common)], [], "cwe")
        repeats = min(CWE_COMMON_REPEATS, budget // (2 * entry * CWE_COMMON))  # common words: at most half the list
        rare_repeats = min(CWE_RARE_REPEATS, repeats - 1)
        if rare_repeats < 1:
            raise ValueError(f"ruler cwe: length {length} is too short for a list in which {CWE_COMMON} words "
                             "occur more often than others")
        words = common * repeats
        used = sum(len(numbers[i]) + len(self.word_ids[w]) for i, w in enumerate(words))
        for word in rare:  # add rare words while the numbered list still fits
            cost = sum(len(numbers[len(words) + j]) + len(self.word_ids[word]) for j in range(rare_repeats))
            if used + cost > budget:
                break
            words += [word] * rare_repeats
            used += cost
        rng.shuffle(words)
        context = [t for i, w in enumerate(words) for t in numbers[i] + self.word_ids[w]]
        answer = sorted(common, key=words.index)  # in order of first appearance
        return self._item("cwe", length, CWE_INTRO, context, question, ", ".join(answer), answer,
                          {"repeats": repeats, "rare_repeats": rare_repeats, "list_size": len(words)})

    def _numbers(self, n: int) -> list[list[int]]:
        """Tokens of "1.", "2.", ..., f"{n}." (cached; a list entry "<i>. <word>" is these followed by the word's)."""
        if len(self.number_ids) < n:
            self.number_ids += self.encode.many([f"{i}." for i in range(len(self.number_ids) + 1, n + 1)])
        return self.number_ids[:n]

    def frequent_words(self, length: int, rng: random.Random) -> PromptItem:
        """Coded words drawn from Zipf(FWE_ALPHA) over a coded vocabulary until the budget is full; redrawn until
        the top FWE_TOP counts are distinct and above the rest, so the answer (most frequent first) is unique."""
        question = FWE_QUESTION
        for _ in range(100):
            vocab = list(dict.fromkeys("".join(rng.choices(string.ascii_lowercase, k=6)) for _ in range(64)))
            weights = [(rank + 1) ** -FWE_ALPHA for rank in range(len(vocab))]
            encoded = {w: self.encode(w) for w in vocab}
            longest = sorted(vocab, key=lambda w: len(encoded[w]))[-FWE_TOP:]  # the longest possible answer
            budget = self._budget(length, [FWE_INTRO, question, ", ".join(longest)], [], "fwe") - 2
            words, used = [], 0
            for word in rng.choices(vocab, weights, k=budget):  # more than fit: every word has a token at least
                if used + len(encoded[word]) > budget:
                    break
                words.append(word)
                used += len(encoded[word])
            counts = Counter(words).most_common()
            top = [c for _, c in counts[:FWE_TOP + 1]]
            if len(top) > FWE_TOP and len(set(top)) == len(top):  # c1 > c2 > c3 > c4
                break
        else:
            raise ValueError(f"ruler fwe: no unique top {FWE_TOP} at length {length}")
        context = [t for w in words for t in encoded[w]]
        answer = [w for w, _ in counts[:FWE_TOP]]
        return self._item("fwe", length, FWE_INTRO, context, question, ", ".join(answer), answer,
                          {"counts": dict(counts[:FWE_TOP + 1]), "words": len(words)})
