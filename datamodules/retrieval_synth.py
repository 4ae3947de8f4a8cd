"""Synthetic retrieval documents for training: facts hidden in the corpus's own prose and asked for later
in the same document, seeded and reproducible. A source of a train data mixture (``datamodules.mixture``,
``synthetic: retrieval``).

A document is a run of consecutive prose sentences (the *filler*: read from a train split, never an evaluation split)
with one to ``max_facts`` facts inserted at random depths. Each fact ties a key to a value; most facts are then
recalled later in the same document, by a sentence that names the key again and ends with the value, at most
``max_distance`` tokens after the fact's first token (by default the training length). Four kinds of fact, each
with three phrasings of the fact and three of its recall:

* ``code``: a person's locker code, ``KT-4471`` (two capitals, a hyphen, four digits);
* ``count``: sacks of barley in a town's granary, a number of 3 or 4 digits;
* ``hometown``: the town a person comes from (invented town names, ``Wenbury``);
* ``colour``: the colour of a person's belonging (``the teapot of Ottilie Ashdown ... is teal``).

Disjoint from the evaluation by construction: the evaluation's pass key is 5 digits, RULER's values are 7 digits or
UUIDs under "adjective-noun" or UUID keys, its variables 5 capitals, BABILong's people are single first names among
rooms and three objects; none of those formats, names, words or templates is used here, and there is no instruction,
"Question:"/"Answer:" frame or repeated noise sentence (``tests/datamodules/test_retrieval_synth.py`` checks this
against the evaluation's own templates and keys). The filler is prose of the mixture's train data. Held-out documents
of this kind, from validation prose and seeds no train stream uses, are ``eval.py --task retrieval_recall``'s
(``datamodules.evaluation.EvalCorpus.retrieval_documents``).

Distances. A recall's distance (tokens from its fact's first token to the end of the recall) is drawn first, from
``distance_law`` on [``MIN_SPAN``, ``max_distance``] (at most the document's ``max_tokens`` - 2 tokens): ``uniform``
(the default; the study's, whose pass keys at the training length lie at uniform depths) or ``log_uniform`` (as
many short distances as long ones per factor of two). The document is built around the draws: its length is uniform
between the longest of them (``min_tokens`` at least) and ``max_tokens``, each fact is planned at a uniform depth that
leaves room for its recall, and the pieces go between whole filler sentences, each within about half a sentence of
where it is due (``_lay_out``), never past ``max_distance``. So the distances follow the law up to that rounding
(``Fact.target_distance`` keeps the draw; ``tests/datamodules/test_retrieval_synth.py`` checks both against the law).
Before the draw came first (version 1), a recall sat at a uniform sentence boundary after its fact in a document of
uniform length, and the distances were mostly short (a median of about 190 tokens at ``seq_len`` 2048). What the
documents look like, offline: ``python -m datamodules.describe_retrieval``.

Lengths are counted in tokens of the data's tokenizer: every piece (a filler sentence, a fact, a recall) is tokenised
on its own as it reads after a space and the document is the pieces joined by single spaces, which with the Mistral
tokenizer tokenises to exactly the pieces' tokens (``datamodules.packing``), so the distances hold in the packed
stream. Document ``i`` of a shard is a pure function of (seed, source name, pass, shard, i) and the filler.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from . import sources

GENERATOR = "retrieval"
VERSION = 2  # in the resume fingerprint: a change of templates or of the draws is a change of data (2: distance laws)

FIRST_NAMES = ("Ottilie", "Barnaby", "Wilhelmina", "Caspian", "Imogen", "Leopold", "Rosalind", "Thaddeus", "Philippa",
               "Evander", "Marisol", "Ignatius", "Seraphine", "Alaric", "Henrietta", "Desmond", "Perpetua", "Ambrose",
               "Clementine", "Florian", "Isadora", "Lysander", "Octavia", "Quentin", "Beatrix", "Cornelius",
               "Delphine", "Gideon", "Honora", "Jasper", "Lavinia", "Magnus")
SURNAMES = ("Ashdown", "Blackwood", "Calloway", "Drummond", "Ellingham", "Fairweather", "Greaves", "Hollis", "Ingram",
            "Jessop", "Kettering", "Lockhart", "Merriweather", "Northcott", "Oakes", "Pemberton", "Quayle",
            "Ravensworth", "Stirling", "Thorne", "Underhill", "Whitlock", "Yardley", "Abernathy", "Bramwell",
            "Crowther", "Dunmore", "Estcourt", "Fennimore", "Gatling", "Harrowgate", "Illingworth")
TOWN_HEADS = ("Wen", "Ald", "Bry", "Cor", "Dun", "Elm", "Fen", "Gral", "Hol", "Kes", "Lor", "Mar", "Nor", "Ost", "Pel",
              "Quen", "Ros", "Sel", "Tor", "Ul", "Vey", "Wyl", "Brack", "Thist")
TOWN_TAILS = ("bury", "mere", "holt", "wick", "stow", "ford", "dale", "combe", "thorpe", "haven", "ridge", "moor")
ITEMS = ("bicycle", "umbrella", "scarf", "kite", "teapot", "notebook", "rowing boat", "satchel", "weathervane",
         "typewriter", "bookcase", "gramophone")
COLOURS = ("teal", "maroon", "ochre", "indigo", "lilac", "scarlet", "turquoise", "beige", "mauve", "olive", "cobalt",
           "magenta", "saffron", "charcoal")
CODE_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"  # no I or O (read as 1 and 0)

#: the value formats, as regular expressions (a test checks the evaluation's keys and values match none of them)
VALUE_FORMATS = {
    "code": r"[A-HJ-NP-Z]{2}-\d{4}",
    "count": r"[1-9]\d{2,3}",
    "hometown": "(?:" + "|".join(TOWN_HEADS) + ")(?:" + "|".join(TOWN_TAILS) + ")",
    "colour": "(?:" + "|".join(COLOURS) + ")",
}

#: per kind: the phrasings of the fact and of its recall ({key}, {value}, and {item} for colours). A recall ends with
#: its value (then a full stop): the value's tokens are the answer the document asks for.
TEMPLATES = {
    "code": {
        "facts": ("The locker code that {key} was assigned is {value}.",
                  "{key} keeps the tools behind a locker whose code is {value}.",
                  "Everyone at the yard knew that the locker code of {key} was {value}."),
        "recalls": ("Which locker code belongs to {key}? The code is {value}.",
                    "To open the locker of {key}, one enters {value}.",
                    "Recalling the yard once more, {key} had the locker code {value}."),
    },
    "count": {
        "facts": ("The granary at {key} holds {value} sacks of barley.",
                  "At {key} the millers counted {value} sacks of barley in the granary.",
                  "A ledger from {key} lists {value} sacks of barley in store."),
        "recalls": ("How many sacks of barley were stored at {key}? There were {value}.",
                    "The barley count for the granary at {key} stood at {value}.",
                    "Going back to the ledgers, the sacks of barley at {key} numbered {value}."),
    },
    "hometown": {
        "facts": ("{key} was born and raised in {value}.",
                  "Long before the journey, {key} had lived in the town of {value}.",
                  "The birthplace of {key} is the town of {value}."),
        "recalls": ("In which town was {key} born? The town was {value}.",
                    "As told before, the hometown of {key} is {value}.",
                    "Asked about home, {key} would always name {value}."),
    },
    "colour": {
        "facts": ("{key} owns a {item} painted {value}.",
                  "The {item} that belongs to {key} is {value} all over.",
                  "At the market {key} chose a {value} {item}."),
        "recalls": ("What colour is the {item} of {key}? It is {value}.",
                    "The {item} owned by {key}, as described earlier, is {value}.",
                    "Picture the {item} of {key} again: its colour is {value}."),
    },
}
KINDS = tuple(TEMPLATES)
RECALL_PROBABILITY = 0.8  # a fact is recalled with this probability (the others are distractors); one at least is

#: options of a ``synthetic: retrieval`` mixture source, and their defaults (``RetrievalSource`` says what None means)
OPTIONS = {"filler": None, "min_tokens": None, "max_tokens": None, "max_distance": None, "max_facts": 4,
           "filler_chars": 1_000_000, "distance_law": "uniform"}
DISTANCE_LAWS = ("uniform", "log_uniform")  # how target distances are drawn (draw_distance)
MIN_SPAN = 64  # tokens: the least min_tokens and max_distance (a fact and its recall take ~20-40 tokens together)
MAX_FACTS = 8  # facts per document at most (their keys and values are distinct: 14 colours bound the draws)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_PROSE = re.compile(r"[A-Z][A-Za-z ,;:'()\-]*[a-z][.!?]")


def prose_sentences(text: str) -> list[str]:
    """The sentences of ``text`` that read as plain prose: whitespace normalised, split after . ! or ?, kept when a
    capital starts them, they hold only ASCII letters, spaces and , ; : ' ( ) - (no digits, so a number asked for is
    never in the filler; no markup or code), five words at least, 30-400 characters."""
    out = []
    for sentence in _SENTENCE_END.split(" ".join(text.split())):
        if 30 <= len(sentence) <= 400 and _PROSE.fullmatch(sentence) and sentence.count(" ") >= 4:
            out.append(sentence)
    return out


def read_prose(records, max_chars: int) -> tuple[list[str], int, Counter]:
    """The prose sentences of ``records`` (``(text, skip reason)`` pairs, a split's in its order) up to the document
    that reaches ``max_chars`` characters of them, the usable documents read, and the records skipped by reason."""
    sentences, chars, documents, skipped = [], 0, 0, Counter()
    for text, reason in records:
        if reason is not None:
            skipped[reason] += 1
            continue
        documents += 1
        found = prose_sentences(text or "")
        sentences += found
        chars += sum(map(len, found))
        if chars >= max_chars:
            break
    return sentences, documents, skipped


def encode_pieces(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Each text's token ids on its own, without special tokens (how a document's pieces are counted)."""
    return [e.ids for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]


class FillerPool:
    """Prose sentences, each tokenised as it reads after a space; a filler is a run of consecutive ones from a random
    start, wrapping around."""

    def __init__(self, sentences: Sequence[str], encode):
        if not sentences:
            raise ValueError("no prose sentence for the filler")
        self.sentences = list(sentences)
        self.ids = encode(self.sentences)

    def take(self, budget: int, rng: random.Random) -> list[int]:
        """Indices of consecutive sentences (cyclic) from a random start, as many as fit in ``budget`` tokens."""
        start, out, used = rng.randrange(len(self.sentences)), [], 0
        while len(out) < len(self.sentences):
            index = (start + len(out)) % len(self.sentences)
            if used + len(self.ids[index]) > budget:
                break
            out.append(index)
            used += len(self.ids[index])
        return out


@dataclass(frozen=True)
class Fact:
    """One fact of a document: its kind, key and value, its sentence, its recall (None: a distractor, never asked),
    and where they lie in the document's tokens (BOS excluded): the fact's first token and the recall's end."""

    kind: str
    key: str
    value: str
    statement: str
    recall: str | None
    statement_start: int
    recall_end: int | None
    target_distance: int | None = None  # the distance drawn for its recall (module docstring, "Distances")

    @property
    def distance(self) -> int | None:
        """Tokens from the fact's first token to the end of its recall (the span a model must hold it over)."""
        return None if self.recall_end is None else self.recall_end - self.statement_start


@dataclass(frozen=True)
class RetrievalDocument:
    text: str
    tokens: int  # of the text (BOS/EOS excluded)
    facts: list[Fact] = field(default_factory=list)


def _person(rng: random.Random) -> str:
    return f"{rng.choice(FIRST_NAMES)} {rng.choice(SURNAMES)}"


def _town(rng: random.Random) -> str:
    return rng.choice(TOWN_HEADS) + rng.choice(TOWN_TAILS)


def _draw_fact(kind: str, rng: random.Random, used: set[str]) -> tuple[str, str, dict]:
    """(key, value, extra template fields) of a new fact; keys and values not in ``used`` (then added to it)."""
    def fresh(draw) -> str:
        while (value := draw()) in used:
            pass
        used.add(value)
        return value

    if kind == "code":
        return fresh(lambda: _person(rng)), fresh(
            lambda: "".join(rng.choices(CODE_LETTERS, k=2)) + f"-{rng.randint(0, 9999):04d}"), {}
    if kind == "count":
        return fresh(lambda: _town(rng)), fresh(lambda: str(rng.randint(100, 9999))), {}
    if kind == "hometown":
        return fresh(lambda: _person(rng)), fresh(lambda: _town(rng)), {}
    return fresh(lambda: _person(rng)), fresh(lambda: rng.choice(COLOURS)), {"item": rng.choice(ITEMS)}


def distance_range(max_tokens: int, max_distance: int) -> tuple[int, int]:
    """The tokens [low, high] that target distances are drawn from: ``MIN_SPAN`` to ``max_distance``, within the
    ``max_tokens - 2`` tokens of a document between its BOS and EOS."""
    high = min(max_distance, max_tokens - 2)
    return min(MIN_SPAN, high), high


def draw_distance(law: str, low: int, high: int, rng: random.Random) -> int:
    """A target distance in [low, high] tokens: ``uniform`` (every distance as likely), or ``log_uniform`` (uniform in
    log distance, rounded: as many in [64, 128] as in [1024, 2048])."""
    if law == "uniform":
        return rng.randint(low, high)
    return min(high, max(low, round(math.exp(rng.uniform(math.log(low), math.log(high))))))


def distance_cdf(law: str, low: int, high: int, x: float) -> float:
    """P(a target distance <= x) under ``law`` on [low, high]: the law of ``draw_distance``, integers included (a
    log-uniform draw is k when its unrounded value is below k + 1/2)."""
    if x < low:
        return 0.0
    if x >= high:
        return 1.0
    k = math.floor(x)
    if law == "uniform":
        return (k - low + 1) / (high - low + 1)
    return min(1.0, math.log((k + 0.5) / low) / math.log(high / low))


def distance_quantile(law: str, low: int, high: int, q: float) -> float:
    """The distance below which a fraction ``q`` of the targets lie (the continuous form, for reading)."""
    return low + q * (high - low) if law == "uniform" else low * (high / low) ** q


def _draft_facts(rng: random.Random, encode, max_facts: int, limit: int):
    """1-``max_facts`` facts: (kind, key, value, fact sentence, recall sentence) each, whether each is asked
    (``RECALL_PROBABILITY``, one at least) and the token ids of both sentences; the last ones are left out until
    the sentences of those asked take ``limit`` tokens at most (``limit``: the longest distance)."""
    used: set[str] = set()
    drafts = []
    for _ in range(rng.randint(1, max_facts)):
        kind = rng.choice(KINDS)
        key, value, extra = _draw_fact(kind, rng, used)
        drafts.append((kind, key, value, rng.choice(TEMPLATES[kind]["facts"]).format(key=key, value=value, **extra),
                       rng.choice(TEMPLATES[kind]["recalls"]).format(key=key, value=value, **extra)))
    asked = [rng.random() < RECALL_PROBABILITY for _ in drafts]
    encoded = encode([text for draft in drafts for text in draft[3:]])
    ids = [(encoded[2 * n], encoded[2 * n + 1]) for n in range(len(drafts))]
    while True:
        if not any(asked):
            asked[rng.randrange(len(asked))] = True
        if len(drafts) == 1 or _inserted(ids, asked) <= limit:
            return drafts, asked, ids
        drafts, ids, asked = drafts[:-1], ids[:-1], asked[:-1]


def _inserted(ids, asked) -> int:
    """Tokens of the facts and of the recalls asked."""
    return sum(len(s) + (len(r) if a else 0) for (s, r), a in zip(ids, asked))


def make_document(rng: random.Random, pool: FillerPool, encode, min_tokens: int, max_tokens: int,
                  max_distance: int, max_facts: int, distance_law: str = "uniform") -> RetrievalDocument:
    """One document of at most ``max_tokens`` tokens with BOS and EOS, built around its distances (module
    docstring, "Distances"): 1-``max_facts`` facts, each asked with ``RECALL_PROBABILITY`` (one at least) at a
    target distance drawn from ``distance_law`` on ``distance_range``; the length is uniform in [the longest target
    (``min_tokens`` at least), ``max_tokens``]; each fact is planned at a uniform depth that leaves room for its
    recall, and ``_lay_out`` places the pieces between filler sentences."""
    low, high = distance_range(max_tokens, max_distance)
    drafts, asked, ids = _draft_facts(rng, encode, max_facts, high)
    targets = {n: draw_distance(distance_law, low, high, rng) for n in range(len(drafts)) if asked[n]}
    inserted = _inserted(ids, asked)
    content = rng.randint(max(min_tokens - 2, max(targets.values()), inserted), max_tokens - 2)  # BOS, EOS out
    planned = [rng.randint(0, content - targets.get(n, len(ids[n][0]))) for n in range(len(drafts))]
    run = pool.take(max_tokens - 2 - inserted, rng)  # the most filler that fits; the layout stops near `content`
    order, starts, ends, tokens = _lay_out([len(pool.ids[i]) for i in run], [(len(s), len(r)) for s, r in ids],
                                           planned, targets, content, max_distance)
    texts = [pool.sentences[run[n]] if what == "filler" else drafts[n][3 + (what == "recall")] for what, n in order]
    facts = [Fact(kind, key, value, statement, recall if asked[n] else None, starts[n], ends.get(n), targets.get(n))
             for n, (kind, key, value, statement, recall) in enumerate(drafts)]
    return RetrievalDocument(" ".join(texts), tokens, facts)


def _lay_out(filler: list[int], sizes: list[tuple[int, int]], planned: list[int], targets: dict[int, int],
             content: int, max_distance: int):
    """The order of a document's pieces, left to right: filler sentences (``filler``: their tokens, in order), facts
    (``sizes[n]``: tokens of fact n's sentence and of its recall) and the recalls asked (``targets``: fact ->
    target distance).

    A fact is due at its ``planned`` first token, a recall at its fact's actual first token plus its target minus its
    own length; the next filler sentence goes in unless a piece is due before its middle, so a piece lands within
    half a sentence of where it is due (later when other pieces are due at the same place), and the pieces after the
    filler runs out go at the end. The filler stops within half a sentence of ``content`` tokens once nothing is
    due. No recall ends more than ``max_distance`` tokens after its fact's first token: before anything goes in, the
    recalls waiting must still fit in that, placed earliest deadline first after it; otherwise the first of them goes
    in now (always possible while the facts and recalls of a document take ``max_distance`` tokens at most).

    Returns (order: ("filler" | "fact" | "recall", index), facts' first tokens, recalls' ends, tokens in all)."""
    order, starts, ends = [], {}, {}
    waiting_facts = set(range(len(sizes)))
    waiting_recalls: dict[int, int] = {}  # fact -> the last token its recall may end at
    position, next_sentence = 0, 0

    def fits(extra: int, recalls: dict[int, int]) -> bool:
        end = position + extra
        for n, deadline in sorted(recalls.items(), key=lambda item: (item[1], item[0])):
            end += sizes[n][1]
            if end > deadline:
                return False
        return True

    def put(what: str, n: int) -> None:
        nonlocal position
        recalls = dict(waiting_recalls)
        if what == "recall":
            del recalls[n]
        size = filler[n] if what == "filler" else sizes[n][what == "recall"]
        asks = what == "fact" and n in targets  # its recall joins those waiting
        while not fits(size, {**recalls, **({n: position + max_distance} if asks else {})}):
            first = min(recalls, key=lambda m: (recalls[m], m))  # never n: a recall first in line always fits
            put("recall", first)
            del recalls[first]
        order.append((what, n))
        if what == "fact":
            starts[n] = position
            waiting_facts.discard(n)
            if asks:
                waiting_recalls[n] = position + max_distance
        elif what == "recall":
            ends[n] = position + size
            del waiting_recalls[n]
        position += size

    while True:
        due = [(planned[n], 0, n) for n in waiting_facts]
        due += [(starts[n] + targets[n] - sizes[n][1], 1, n) for n in waiting_recalls]
        sentence = filler[next_sentence] if next_sentence < len(filler) else None
        if due and (sentence is None or min(due)[0] <= position + sentence / 2):
            _, is_recall, n = min(due)
            put("recall" if is_recall else "fact", n)
        elif sentence is not None and (due or position + sentence / 2 <= content):
            put("filler", next_sentence)
            next_sentence += 1
        else:
            return order, starts, ends, position


class RetrievalSource:
    """An endless stream of synthetic retrieval documents (records ``(text, None)``) for one shard, like a
    ``stream.SplitSource``'s ``records``. The filler pool is read from ``filler`` (a train ``SplitSource``: its first
    ``filler_chars`` characters of prose in the seeded file order) and tokenised once per process.

    Args:
        name: the mixture source's name (part of every document's seed).
        filler: where the prose comes from (a train split of the mixture's data).
        tokenizer: the data's tokenizer (lengths and distances are counted in its tokens).
        seq_len: the training length: the default of ``max_tokens`` and ``max_distance``.
        min_tokens / max_tokens: document length range, BOS and EOS included (None: ``max_tokens // 16``, 64 at least;
            ``seq_len``).
        max_distance: the most tokens from a fact's first token to the end of its recall (None: ``seq_len``).
        max_facts: facts per document (1 to this many).
        filler_chars: characters of prose read for the filler pool.
        distance_law: how a recall's target distance is drawn: ``uniform`` or ``log_uniform`` on ``distance_range``
            (module docstring, "Distances").
    """

    def __init__(self, name: str, filler, tokenizer, seq_len: int, min_tokens: int | None = None,
                 max_tokens: int | None = None, max_distance: int | None = None, max_facts: int = 4,
                 filler_chars: int = 1_000_000, distance_law: str = "uniform"):
        self.name, self.filler, self.tokenizer = name, filler, tokenizer
        self.max_facts, self.filler_chars, self.distance_law = max_facts, filler_chars, distance_law
        if distance_law not in DISTANCE_LAWS:
            raise ValueError(f"mixture source {name!r}: distance_law must be one of {', '.join(DISTANCE_LAWS)}, got "
                             f"{distance_law!r}")
        self.max_tokens = seq_len if max_tokens is None else max_tokens
        self.min_tokens = max(MIN_SPAN, self.max_tokens // 16) if min_tokens is None else min_tokens
        self.max_distance = seq_len if max_distance is None else max_distance
        if not 1 <= max_facts <= MAX_FACTS:
            raise ValueError(f"mixture source {name!r}: max_facts must be 1 to {MAX_FACTS}, got {max_facts}")
        if not MIN_SPAN <= self.min_tokens <= self.max_tokens or self.max_distance < MIN_SPAN:
            raise ValueError(
                f"mixture source {name!r}: need {MIN_SPAN} <= min_tokens <= max_tokens and max_distance >= {MIN_SPAN} "
                f"tokens, got min_tokens={self.min_tokens}, max_tokens={self.max_tokens}, max_distance="
                f"{self.max_distance} (max_tokens and max_distance default to seq_len={seq_len}, min_tokens to "
                f"max_tokens // 16); set "
                f"mixture.{name}.min_tokens/max_tokens/max_distance")
        self._pool: FillerPool | None = None
        self._pool_seed: int | None = None

    def __getstate__(self) -> dict:  # the pool is rebuilt in each worker process, never pickled
        return {**self.__dict__, "_pool": None, "_pool_seed": None}

    def options(self) -> dict:
        return {"generator": GENERATOR, "version": VERSION, "min_tokens": self.min_tokens,
                "max_tokens": self.max_tokens, "max_distance": self.max_distance, "max_facts": self.max_facts,
                "filler_chars": self.filler_chars, "distance_law": self.distance_law}

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return encode_pieces(self.tokenizer, texts)

    def pool(self, seed: int) -> FillerPool:
        if self._pool is None or self._pool_seed != seed:
            sentences, _, _ = read_prose(self.filler.records(1, 0, seed, 0), self.filler_chars)
            if not sentences:
                self._no_prose()
            self._pool, self._pool_seed = FillerPool(sentences, self.encode), seed
        return self._pool

    def check_filler(self, seed: int = 0) -> None:
        """Fail fast (``ValueError``) when the filler holds no prose sentence; reads it only up to the first one."""
        for text, _ in self.filler.records(1, 0, seed, 0):
            if prose_sentences(text or ""):
                return
        self._no_prose()

    def _no_prose(self):
        raise ValueError(
            f"mixture source {self.name!r}: its filler ({_describe(self.filler)}) holds no prose sentence "
            f"(datamodules.retrieval_synth.prose_sentences); give it a filler of prose (the option "
            f"mixture.{self.name}.filler names a data source of the mixture)")

    def document(self, seed: int, epoch: int, shard: int, index: int) -> RetrievalDocument:
        rng = random.Random(f"{GENERATOR}/{seed}/{self.name}/{epoch}/{shard}/{index}")
        return make_document(rng, self.pool(seed), self.encode, self.min_tokens, self.max_tokens,
                             self.max_distance, self.max_facts, self.distance_law)

    def records(self, num_shards: int, shard: int, seed: int, epoch: int) -> Iterator[sources.Record]:
        index = 0
        while True:
            yield self.document(seed, epoch, shard, index).text, None
            index += 1


def _describe(source) -> str:
    if getattr(source, "hub_id", None) is not None:
        return f"hub {source.hub_id!r} split {source.hub_split!r}"
    files = getattr(source, "files", ())
    return f"{len(files)} file(s)" + (f", {files[0]} ..." if files else "")

