"""Every attention backend and FPA variant as (id, attention options): the variants the generation and
transformers tests run their tiny models over."""

VARIANTS = [
    ("sdpa", {"backend": "sdpa"}),
    ("nope", {"backend": "nope"}),
    ("alibi", {"backend": "alibi"}),
    ("fox", {"backend": "fox"}),
    ("fpa", {"backend": "fpa"}),
    ("fpa-stack", {"backend": "fpa", "fpa_form": "stack"}),
    ("fpa-level-none", {"backend": "fpa", "fpa_level": "none"}),
    ("fpa-level-query", {"backend": "fpa", "fpa_level": "query"}),
    ("fpa-dipsum", {"backend": "fpa", "fpa_reduction": "dipsum"}),
    ("fpa-alibi", {"backend": "fpa", "positional": "alibi"}),
    ("fpa-rope-layer1", {"backend": "fpa", "positional": "rope", "bias_layers": [1]}),
    ("selective", {"backend": "selective"}),
    ("dcp", {"backend": "dcp"}),
]
