"""BABILong-style generators: each answer is recomputed by an independent reading of the fact sentences (the bAbI
definitions), and the facts sit in order inside book text within the item's length."""
import random
import re

import pytest

from fpa_lightning.evaluation.babilong import QA, BabilongBuilder

SEEDS = range(300)
MOVE = re.compile(r"^(\w+) (?:moved|went|journeyed|travelled) to the (\w+)\.$")
TAKE = re.compile(r"^(\w+) (?:picked up|got|grabbed|took) the (\w+)\.$")
DROP = re.compile(r"^(\w+) (?:dropped|discarded|put down|left) the (\w+)\.$")
GIVE = re.compile(r"^(\w+) (?:gave|handed|passed) the (\w+) to (\w+)\.$")
RELATION = re.compile(r"^The (\w+) is (north|south|east|west) of the (\w+)\.$")


def replay(facts):
    """People's places, objects' carriers, and each object's places over time, read from the sentences."""
    where, carrier, lying, trail, gives = {}, {}, {}, {}, []

    def visit(obj):
        place = where.get(carrier[obj]) if obj in carrier else lying.get(obj)
        if place and trail.setdefault(obj, [])[-1:] != [place]:
            trail[obj].append(place)

    for fact in facts:
        if m := MOVE.match(fact):
            where[m[1]] = m[2]
            for obj in [o for o, p in carrier.items() if p == m[1]]:
                visit(obj)
        elif m := TAKE.match(fact):
            carrier[m[2]] = m[1]
            lying.pop(m[2], None)
            visit(m[2])
        elif m := DROP.match(fact):
            assert carrier.pop(m[2]) == m[1]  # only the carrier drops an object
            lying[m[2]] = where[m[1]]
        elif m := GIVE.match(fact):
            assert carrier[m[2]] == m[1]  # only the carrier gives it away
            carrier[m[2]] = m[3]
            gives.append((m[1], m[2], m[3]))
            visit(m[2])
        else:
            raise AssertionError(f"unreadable fact {fact!r}")
    return where, carrier, lying, trail, gives


def solve(qa, facts, question):
    if qa == "qa4":
        relations = [RELATION.match(f).groups() for f in facts]
        if m := re.match(r"What is (\w+) of the (\w+)\?", question):
            (answer,) = {x for x, d, y in relations if d == m[1] and y == m[2]}
            return answer
        m = re.match(r"What is the (\w+) (\w+) of\?", question)
        opposite = {"north": "south", "south": "north", "east": "west", "west": "east"}
        (answer,) = {x for x, d, y in relations if y == m[1] and opposite[d] == m[2]}
        return answer
    where, carrier, lying, trail, gives = replay(facts)
    if m := re.match(r"Where is (\w+)\?", question):
        return where[m[1]]
    if m := re.match(r"Where is the (\w+)\?", question):
        return where[carrier[m[1]]] if m[1] in carrier else lying[m[1]]
    if m := re.match(r"Where was the (\w+) before the (\w+)\?", question):
        places = trail[m[1]]
        assert places[-1] == m[2] and places.count(m[2]) == 1
        return places[-2]
    last = {}  # the last hand-over matching each question form
    for giver, obj, receiver in gives:
        last[("gave", obj, receiver)] = giver
        last[("received", obj)] = receiver
        last[("what", giver, receiver)] = obj
        last[("to", giver, obj)] = receiver
    for pattern, key in ((r"Who gave the (\w+) to (\w+)\?", "gave"), (r"Who received the (\w+)\?", "received"),
                         (r"What did (\w+) give to (\w+)\?", "what"), (r"Who did (\w+) give the (\w+) to\?", "to")):
        if m := re.match(pattern, question):
            return last[(key, *m.groups())]
    raise AssertionError(f"unknown question {question!r}")


QUESTION_FORMS = {"qa1": 1, "qa2": 1, "qa3": 1, "qa4": 2, "qa5": 4}


FORM_WORDS = {"what", "where", "who", "is", "was", "the", "of", "before", "gave", "to", "received", "did", "give"}


def form(question: str) -> str:
    """The question with its names, places, objects and directions left out: "What is _ of the _"."""
    return " ".join(w if w.strip("?").lower() in FORM_WORDS else "_" for w in question.split())


@pytest.mark.parametrize("qa", sorted(QA))
def test_answers_follow_from_the_facts(qa):
    forms = set()
    for seed in SEEDS:
        facts, question, answer = QA[qa](random.Random(seed))
        assert solve(qa, facts, question) == answer, (facts, question)
        forms.add(form(question))
    assert len(forms) == QUESTION_FORMS[qa], forms  # every question form of the bAbI pattern occurs


def test_items_hide_the_facts_in_order_within_the_length(tokenizer):
    from datamodules import EvalCorpus

    builder = BabilongBuilder(tokenizer, 1, EvalCorpus(None).texts(2))
    for qa in sorted(QA):
        for item in builder.items(qa, 1024, 3, seed=0):
            assert item.prompt[0] == 1 and 0.9 * 1024 < item.tokens <= 1024
            text = builder.encode.decode(item.prompt)
            positions = [text.index(f) for f in item.meta["facts"]]
            assert positions == sorted(positions)
            assert text.endswith(f"Question: {item.meta['question']} Answer:")
            assert builder.encode.decode(item.answer) == item.references[0]
    assert builder.items("qa1", 1024, 2, seed=4)[1].prompt == builder.items("qa1", 1024, 2, seed=4)[1].prompt
    with pytest.raises(ValueError, match="too short"):
        builder.items("qa3", 64, 1, seed=0)
