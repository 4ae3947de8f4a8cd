"""BABILong-style tasks (Kuratov et al. 2024): bAbI-like fact chains written by a seeded generator and hidden in
long distractor text from local books. The five patterns follow bAbI's qa1–qa5; the wording is this project's.

* qa1, single supporting fact: people move between rooms; "Where is Mary?" (her last move).
* qa2, two supporting facts: people also pick up and drop objects; "Where is the apple?" (where its carrier is,
  or where it was dropped).
* qa3, three supporting facts: "Where was the apple before the kitchen?" (the place the object was in before it
  reached the place it is in now).
* qa4, two-argument relations: "The kitchen is north of the garden."; "What is north of the garden?" or "What is
  the garden south of?".
* qa5, three-argument relations: people pick up objects and give them to each other; who gave, who received,
  what was given (about the last hand-over).

Each generator simulates the world it describes, so its answer follows from the facts by definition; the tests
check every answer with an independent reading of the fact sentences. Facts keep their order and go into the
book text at sorted random sentence boundaries; the answer is a single word.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from fpa_lightning.evaluation.answers import BookHaystack, PieceEncoder, PromptItem, insert_at_depths

PEOPLE = ("Mary", "John", "Daniel", "Sandra")
GIVERS = ("Fred", "Jeff", "Bill", "Mary")
PLACES = ("bathroom", "hallway", "kitchen", "garden", "office", "bedroom")
OBJECTS = ("football", "apple", "milk")
MOVE = ("moved", "went", "journeyed", "travelled")
TAKE = ("picked up", "got", "grabbed", "took")
DROP = ("dropped", "discarded", "put down", "left")
GIVE = ("gave", "handed", "passed")
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}

INTRO = ("The text below hides facts about people, places and objects among unrelated sentences. Read it, then "
         "answer the question with one word, using only those facts.")
QUESTION = "Question: {question} Answer:"

Story = tuple[list[str], str, str]  # (facts in order, question, one-word answer)


def qa1(rng: random.Random, n_facts: int = 6) -> Story:
    where: dict[str, str] = {}
    facts = []
    for _ in range(n_facts):
        person = rng.choice(PEOPLE)
        where[person] = rng.choice([p for p in PLACES if p != where.get(person)])
        facts.append(f"{person} {rng.choice(MOVE)} to the {where[person]}.")
    person = rng.choice(sorted(where))
    return facts, f"Where is {person}?", where[person]


class _World:
    """People with places and objects with carriers, as the facts of qa2 / qa3 / qa5 describe them."""

    def __init__(self, rng: random.Random, people: Sequence[str]):
        self.rng, self.people = rng, people
        self.where: dict[str, str] = {}  # person -> place (after their first move)
        self.carrier: dict[str, str] = {}  # object -> person holding it
        self.lying: dict[str, str] = {}  # object -> place where it was dropped
        self.trail: dict[str, list[str]] = {}  # object -> the places it has been in, consecutive repeats merged

    def place_of(self, obj: str) -> str | None:
        return self.where.get(self.carrier[obj]) if obj in self.carrier else self.lying.get(obj)

    def _visit(self, obj: str) -> None:
        place = self.place_of(obj)
        trail = self.trail.setdefault(obj, [])
        if place is not None and (not trail or trail[-1] != place):
            trail.append(place)

    def move(self) -> str:
        person = self.rng.choice(self.people)
        self.where[person] = self.rng.choice([p for p in PLACES if p != self.where.get(person)])
        for obj, holder in self.carrier.items():
            if holder == person:
                self._visit(obj)
        return f"{person} {self.rng.choice(MOVE)} to the {self.where[person]}."

    def take(self) -> str | None:
        """A located person takes a free object lying in the same place (or not yet placed anywhere)."""
        options = [(person, obj) for person in self.where for obj in OBJECTS
                   if obj not in self.carrier and self.lying.get(obj, self.where[person]) == self.where[person]]
        if not options:
            return None
        person, obj = self.rng.choice(sorted(options))
        self.carrier[obj] = person
        self.lying.pop(obj, None)
        self._visit(obj)
        return f"{person} {self.rng.choice(TAKE)} the {obj}."

    def drop(self) -> str | None:
        options = sorted((person, obj) for obj, person in self.carrier.items() if person in self.where)
        if not options:
            return None
        person, obj = self.rng.choice(options)
        del self.carrier[obj]
        self.lying[obj] = self.where[person]
        return f"{person} {self.rng.choice(DROP)} the {obj}."

    def give(self) -> tuple[str, tuple[str, str, str]] | None:
        options = sorted((person, obj) for obj, person in self.carrier.items())
        if not options:
            return None
        giver, obj = self.rng.choice(options)
        receiver = self.rng.choice([p for p in self.people if p != giver])
        self.carrier[obj] = receiver
        self._visit(obj)
        return f"{giver} {self.rng.choice(GIVE)} the {obj} to {receiver}.", (giver, obj, receiver)

    def story(self, n_facts: int, actions: dict[str, float]) -> list[str]:
        """n_facts facts: each an action drawn with the given weights (a move when the drawn one is impossible)."""
        facts = []
        names, weights = list(actions), list(actions.values())
        while len(facts) < n_facts:
            fact = getattr(self, self.rng.choices(names, weights)[0])()
            facts.append(fact if fact is not None else self.move())
        return facts


def qa2(rng: random.Random, n_facts: int = 8) -> Story:
    while True:
        world = _World(rng, PEOPLE)
        facts = world.story(n_facts, {"move": 0.5, "take": 0.3, "drop": 0.2})
        known = [obj for obj in OBJECTS if world.place_of(obj) is not None]
        if known:
            obj = rng.choice(known)
            return facts, f"Where is the {obj}?", world.place_of(obj)


def qa3(rng: random.Random, n_facts: int = 12) -> Story:
    while True:
        world = _World(rng, PEOPLE)
        facts = world.story(n_facts, {"move": 0.6, "take": 0.3, "drop": 0.1})
        # the last place must occur once in the trail, so that "before the <place>" names one moment
        asked = [obj for obj, trail in world.trail.items() if len(trail) >= 2 and trail.count(trail[-1]) == 1]
        if asked:
            obj = rng.choice(sorted(asked))
            trail = world.trail[obj]
            return facts, f"Where was the {obj} before the {trail[-1]}?", trail[-2]


def qa4(rng: random.Random) -> Story:
    """Two facts "X is <d> of Y" sharing Y, with different directions, so that both question forms have one
    answer."""
    first, second, shared = rng.sample(PLACES, 3)
    d1, d2 = rng.sample(sorted(OPPOSITE), 2)
    relations = [(first, d1, shared), (second, d2, shared)]
    facts = [f"The {x} is {d} of the {y}." for x, d, y in relations]
    rng.shuffle(facts)
    x, d, y = rng.choice(relations)
    if rng.random() < 0.5:
        return facts, f"What is {d} of the {y}?", x
    return facts, f"What is the {y} {OPPOSITE[d]} of?", x


def qa5(rng: random.Random, n_facts: int = 8) -> Story:
    """Questions about the last hand-over (giver, object, receiver)."""
    while True:
        world = _World(rng, GIVERS)
        facts, last = [], None
        while len(facts) < n_facts:
            action = rng.choices(("move", "take", "give"), (0.35, 0.3, 0.35))[0]
            result = getattr(world, action)()
            if action == "give" and result is not None:
                result, last = result
            facts.append(result if result is not None else world.move())
        if last is not None:
            giver, obj, receiver = last
            return facts, *rng.choice([
                (f"Who gave the {obj} to {receiver}?", giver),
                (f"Who received the {obj}?", receiver),
                (f"What did {giver} give to {receiver}?", obj),
                (f"Who did {giver} give the {obj} to?", receiver),
            ])


QA: dict[str, Callable[[random.Random], Story]] = {"qa1": qa1, "qa2": qa2, "qa3": qa3, "qa4": qa4, "qa5": qa5}


class BabilongBuilder:
    """Items of one qa pattern at a length: the story's facts in book text, then the question."""

    def __init__(self, tokenizer, bos_id: int, book_texts: Sequence[str]):
        self.encode = PieceEncoder(tokenizer)
        self.bos_id = bos_id
        self.book = BookHaystack(book_texts, self.encode)

    def items(self, qa: str, length: int, n: int, seed: int) -> list[PromptItem]:
        """n items, item i reproducible from (qa, seed, length, i)."""
        if qa not in QA:
            raise ValueError(f"unknown babilong task {qa!r}; known: {', '.join(QA)}")
        return [self.item(qa, length, random.Random(f"babilong/{qa}/{seed}/{length}/{i}")) for i in range(n)]

    def item(self, qa: str, length: int, rng: random.Random) -> PromptItem:
        facts, question, answer = QA[qa](rng)
        inserts = [self.encode(f) for f in facts]
        head = [self.bos_id, *self.encode(INTRO)]
        tail, answer_ids = self.encode(QUESTION.format(question=question)), self.encode(answer)
        budget = length - len(head) - len(tail) - len(answer_ids) - sum(len(i) for i in inserts)
        if budget <= 0:
            raise ValueError(f"babilong {qa}: length {length} is too short for the story and question")
        depths = sorted(rng.random() for _ in inserts)
        context, offsets = insert_at_depths(self.book.take(budget, rng), inserts, depths)
        meta = {"facts": facts, "question": question, "fact_offsets": [len(head) + o for o in offsets]}
        return PromptItem(qa, length, head + context + tail, answer_ids, (answer,), meta)
