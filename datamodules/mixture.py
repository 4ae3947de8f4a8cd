"""Weighted train data mixtures: documents drawn from several sources in a seeded order, then packed as one stream.

Config (``TextDataModule(mixture=..., mixture_weights=...)``, docs/training.md "Data mixtures"): ``mixture`` maps
source names to what they read, ``mixture_weights`` maps the same names to their weights::

    mixture:
      corpus: {}                             # the module's own train data (source / train_files)
      retrieval: {synthetic: retrieval}      # datamodules.retrieval_synth
    mixture_weights:
      corpus: rest
      retrieval: 0.1

A source is *data* (the module's own train split unless it gives ``source`` and/or ``train_files``; also
``text_field``, ``hub_split``: local files, a hub id or ``offline``, resolved like the module's own) or *synthetic*
(``synthetic: retrieval`` and that generator's options). A weight is a number >= 0; weights are relative (normalised
to sum to 1). One source may have the weight ``rest`` instead: the other weights are then shares (summing to at most
1) and it takes the rest, so that one option sets a source's share (``--data.init_args.mixture_weights.retrieval=0.05``
on the command line: the weights are a mapping of their own so that such an override keeps the others).

Draws. Each train shard (see ``datamodules.stream``) reads its own shard of every data source, an endless sequence of
passes (pass ``p`` ordered by ``seed`` and ``p``, documents shuffled within ``shuffle_block`` windows exactly as a
single-source stream orders them, so a source's documents come in the order they would alone), and its own synthetic
documents. Document ``i`` of the mixed stream comes from the source drawn by the ``i``-th number of a generator seeded
by (seed, shard): a source of weight ``w`` is drawn with probability ``w``, independently of everything read. So the
stream is a pure function of (data, seed, shard), and the document index in it is the whole resume position: a resumed
worker replays the draws and reads (without tokenising) the documents before its cursor, exactly as a single-source
worker does within its pass. A bad record counts as its source's draw (and as a skip, as always).
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

from . import retrieval_synth
from .stream import record_blocks

OPTION, WEIGHTS = "mixture", "mixture_weights"  # the data module's options, named in every error
DATA_KEYS = ("source", "train_files", "text_field", "hub_split")
SYNTHETIC = {retrieval_synth.GENERATOR: retrieval_synth.OPTIONS}  # generator -> its options and their defaults
REST = "rest"


class MixtureError(ValueError):
    """A mixture option that cannot be used (its message names the option)."""


@dataclass(frozen=True)
class MixtureEntry:
    """One validated source of the mixture options: its name, its probability, and what it reads."""

    name: str
    probability: float
    weight: float | str  # as given (a number or "rest")
    synthetic: str | None = None  # the generator, or None for a data source
    data: tuple = ()  # (key, value) of the data keys given (DATA_KEYS)
    options: tuple = ()  # (key, value) of the synthetic options, defaults filled in


def parse_mixture(spec, weights) -> list[MixtureEntry]:
    """Validate the ``mixture`` and ``mixture_weights`` options; raise ``MixtureError`` naming the offending one."""
    if spec is None or weights is None:
        given, missing = (OPTION, WEIGHTS) if weights is None else (WEIGHTS, OPTION)
        raise MixtureError(f"data option {given} is set but {missing} is not: a mixture needs both, the sources "
                           f"({OPTION}: {{name: {{...}}}}) and their weights ({WEIGHTS}: {{name: weight}})")
    if not isinstance(spec, dict) or not spec:
        raise MixtureError(f"data option {OPTION} must be a mapping of source names to what they read "
                           f"({{name: {{}}}} for the module's own train data), got {spec!r}")
    if not isinstance(weights, dict) or not weights:
        raise MixtureError(f"data option {WEIGHTS} must be a mapping of source names to weights, got {weights!r}")
    for name in spec:
        if not isinstance(name, str) or not name:
            raise MixtureError(f"data option {OPTION}: source names must be non-empty strings, got {name!r}")
    unknown = [name for name in weights if name not in spec]
    if unknown:
        raise MixtureError(f"data option {WEIGHTS} names no source of {OPTION}: {', '.join(map(repr, unknown))} "
                           f"(its sources: {', '.join(spec)})")
    unweighted = [name for name in spec if name not in weights]
    if unweighted:
        raise MixtureError(f"data option {WEIGHTS} has no weight for {', '.join(map(repr, unweighted))}: give "
                           f"{', '.join(f'{WEIGHTS}.{n}' for n in unweighted)} (a number >= 0, or '{REST}')")
    parsed = {name: _weight(weights[name], f"{WEIGHTS}.{name}") for name in spec}
    rest = [name for name, w in parsed.items() if w == REST]
    if len(rest) > 1:
        raise MixtureError(f"data option {WEIGHTS}: only one source may take the rest, not "
                           f"{', '.join(f'{WEIGHTS}.{n}' for n in rest)}")
    if rest:
        shares = sum(w for w in parsed.values() if w != REST)
        if shares > 1 + 1e-9:
            raise MixtureError(
                f"data option {WEIGHTS}: with {WEIGHTS}.{rest[0]}='{REST}' the other weights are shares of the "
                f"documents and must sum to at most 1, got {shares:g}")
        parsed[rest[0]] = max(0.0, 1.0 - shares)
    total = sum(parsed.values())
    if total <= 0:
        raise MixtureError(f"data option {WEIGHTS}: every weight is zero ({weights}); give a source a weight > 0")
    entries = [_entry(name, spec[name], parsed[name] / total, weights[name]) for name in spec]
    data_names = [e.name for e in entries if e.synthetic is None]
    for e in entries:
        filler = dict(e.options).get("filler")
        if e.synthetic is not None and filler is not None and filler not in data_names:
            raise MixtureError(
                f"data option {OPTION}.{e.name}.filler names no data source of the mixture: {filler!r} (its data "
                f"sources: {', '.join(data_names) or 'none'}; leave it out for the module's own train data)")
    return entries


def _weight(value, option: str) -> float | str:
    if value == REST:
        return REST
    if isinstance(value, str):  # a command-line override of a mapping's value arrives as a string
        try:
            value = float(value)
        except ValueError:
            raise MixtureError(f"data option {option} must be a number >= 0 or '{REST}', got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MixtureError(f"data option {option} must be a number >= 0 or '{REST}', got {value!r}")
    if not math.isfinite(value):
        raise MixtureError(f"data option {option} must be a finite number >= 0, got {value!r}")
    if value < 0:
        raise MixtureError(f"data option {option} must be >= 0, got {value!r}")
    return float(value)


def _entry(name: str, entry, probability: float, weight) -> MixtureEntry:
    option = f"{OPTION}.{name}"
    if entry is None:
        entry = {}  # `name:` with nothing after it: the module's own train data
    if not isinstance(entry, dict):
        raise MixtureError(f"data option {option} must be a mapping ({{}} for the module's own train data), got "
                           f"{entry!r}")
    synthetic = entry.get("synthetic")
    if synthetic is None:
        unknown = sorted(set(entry) - set(DATA_KEYS))
        if unknown:
            raise MixtureError(f"data option {option}: unknown key(s) {', '.join(map(str, unknown))} for a data source "
                               f"(its keys: {', '.join(DATA_KEYS)}; its weight goes in {WEIGHTS}.{name}; a synthetic "
                               f"source names its generator in 'synthetic': {', '.join(SYNTHETIC)})")
        data = tuple((k, entry[k]) for k in DATA_KEYS if entry.get(k) is not None)
        return MixtureEntry(name, probability, weight, data=data)
    if synthetic not in SYNTHETIC:
        raise MixtureError(f"data option {option}.synthetic: unknown generator {synthetic!r} (known: "
                           f"{', '.join(SYNTHETIC)})")
    defaults = SYNTHETIC[synthetic]
    unknown = sorted(set(entry) - {"synthetic", *defaults})
    if unknown:
        raise MixtureError(f"data option {option}: unknown key(s) {', '.join(map(str, unknown))} for a "
                           f"'{synthetic}' source (its keys: synthetic, {', '.join(defaults)}; its weight goes in "
                           f"{WEIGHTS}.{name})")
    options = {}
    for key, default in defaults.items():
        value = entry.get(key, default)
        if key not in ("filler", "distance_law") and value is not None:
            value = _count(value, f"{option}.{key}")
        options[key] = value
    if options["distance_law"] not in retrieval_synth.DISTANCE_LAWS:
        raise MixtureError(f"data option {option}.distance_law must be one of "
                           f"{', '.join(retrieval_synth.DISTANCE_LAWS)}, got {options['distance_law']!r}")
    for key in ("min_tokens", "max_distance"):
        if options[key] is not None and options[key] < retrieval_synth.MIN_SPAN:
            raise MixtureError(f"data option {option}.{key} must be >= {retrieval_synth.MIN_SPAN} tokens, got "
                               f"{options[key]}")
    if not 1 <= options["max_facts"] <= retrieval_synth.MAX_FACTS or options["filler_chars"] < 1:
        raise MixtureError(f"data option {option}: max_facts must be 1 to {retrieval_synth.MAX_FACTS} and "
                           f"filler_chars >= 1, got {options['max_facts']} and {options['filler_chars']}")
    if None not in (options["max_tokens"], options["min_tokens"]) and options["max_tokens"] < options["min_tokens"]:
        raise MixtureError(f"data option {option}: max_tokens ({options['max_tokens']}) is below min_tokens "
                           f"({options['min_tokens']})")
    return MixtureEntry(name, probability, weight, synthetic=synthetic, options=tuple(options.items()))


def _count(value, option: str) -> int:
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise MixtureError(f"data option {option} must be a whole number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise MixtureError(f"data option {option} must be a whole number, got {value!r}")
    return value


@dataclass(frozen=True)
class MixturePart:
    """A resolved source of a mixture: its name, probability and what yields its records (a ``stream.SplitSource``
    or a ``retrieval_synth.RetrievalSource``)."""

    name: str
    probability: float
    source: object
    synthetic: bool


class MixtureSource:
    """The train records of a mixture, ``(text, None, name)`` or ``(None, skip reason, name)``, one endless stream per
    shard (module docstring). It orders each data source itself (``shuffle_block``), so the packing stream takes its
    records in the order given (``shuffles_itself``)."""

    shuffles_itself = True

    def __init__(self, parts: list[MixturePart], shuffle_block: int):
        self.parts, self.shuffle_block = list(parts), shuffle_block
        cumulative, total = [], 0.0
        for part in self.parts:
            total += part.probability
            cumulative.append(total)
        last = max(i for i, part in enumerate(self.parts) if part.probability > 0)
        cumulative[last:] = [math.inf] * (len(cumulative) - last)  # (rounding never leaves a draw unassigned)
        self.cumulative = cumulative

    @property
    def names(self) -> list[str]:
        return [part.name for part in self.parts]

    def draws(self, seed: int, shard: int, epoch: int = 0) -> Iterator[int]:
        """The part of each successive document of a shard's stream (an index into ``parts``)."""
        rng = random.Random(f"mixture/{seed}/{epoch}/{shard}")
        while True:
            yield bisect.bisect_right(self.cumulative, rng.random())

    def records(self, num_shards: int, shard: int, seed: int, epoch: int) -> Iterator[tuple]:
        streams: dict[int, Iterator] = {}
        for k in self.draws(seed, shard, epoch):
            if k not in streams:
                streams[k] = self._part_records(self.parts[k], num_shards, shard, seed)
            text, reason = next(streams[k])
            yield text, reason, self.parts[k].name

    def _part_records(self, part: MixturePart, num_shards: int, shard: int, seed: int) -> Iterator:
        if part.synthetic:
            yield from part.source.records(num_shards, shard, seed, 0)
            return
        p = 0
        while True:  # pass after pass, each ordered as a single-source train stream orders it
            usable = 0
            blocks = record_blocks(part.source.records(num_shards, shard, seed, p), self.shuffle_block,
                                   random.Random(f"{seed}/{p}/{shard}"), 0)
            for block in blocks:
                for _, record in block:
                    usable += record[1] is None
                    yield record
            if not usable:
                raise ValueError(f"mixture source {part.name!r} (data option {OPTION}.{part.name}): shard {shard}/"
                                 f"{num_shards} of its train data has no usable document in pass {p}; check its "
                                 f"files and text_field, or use fewer workers/ranks")
            p += 1
