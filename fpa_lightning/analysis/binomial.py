"""Exact binomial tail probabilities, shared by the probes' sign test (``fpa_lightning.probes.stats``) and the
evaluation's intervals and paired tests (``fpa_lightning.evaluation.stats``). No SciPy: exact sums in float64."""
from __future__ import annotations

import math


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X ≤ k) for X ~ Binomial(n, p), summed exactly in log space."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
             for i in range(k + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def binomial_at_least(k: int, n: int, p: float) -> float:
    """P(X ≥ k) for X ~ Binomial(n, p), as P(n − X ≤ n − k) so tiny tails keep their precision."""
    return binomial_cdf(n - k, n, 1.0 - p)
