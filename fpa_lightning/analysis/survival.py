"""Head statistics of attention biases (docs/method.md, "Published figures": the paper's observations): which keys
each head keeps alive. Pure tensor maths, shared by the head-survival callback and any evaluation.

Definitions (every backend, from its bias b[t, s]; for FPA b = β·min(0, min_{s<u≤t} φ_u − ψ_s)):

- alive set A_t = {s ≤ t : b[t, s] ≥ threshold} (threshold −1 by default, the paper's "bias ≥ −1").
  b[t, t] = 0, so t ∈ A_t for any threshold ≤ 0 and |A_t| ≥ 1.
- alive fraction of a head: mean over batch rows and queries t ≥ query_start of |A_t| / (t + 1).
- suffix of A_t: the longest run [j, t] ⊆ A_t ending at the query, L_t = t − j + 1 = t − (last dead s ≤ t).
  Non-suffix fraction of a query: (|A_t| − L_t) / |A_t| (alive keys older than the first dead key);
  of a head: its mean over batch rows and queries t ≥ query_start.
- key s dies at query t (t ≥ 1) when s ∈ A_{t−1} and s ∉ A_t. deaths(t) = |A_{t−1} \\ A_t|.
  Death rate = mean of deaths(t) over queries t ≥ 1 (all of them, so that the rare boundaries have samples);
  boundary death rate = the same mean over document boundaries: the EOS that ends a document and the BOS that starts
  the next one (t ≥ 1 with segment_ids[t] ≠ segment_ids[t+1] or segment_ids[t] ≠ segment_ids[t−1]);
  boundary ratio = boundary rate / overall rate (NaN when undefined: no deaths or no boundary).
- FPA walk: the probe exposes φ = W + g and ψ = W + h but not W, so the walk step δ_t = W_t − W_{t−1} is reported
  through the field step φ_t − φ_{t−1} = δ_t + g_t − g_{t−1} and the level step ψ_t − ψ_{t−1} (both equal δ_t
  in the stack form g = h = 0): mean and std per head over batch rows and t ≥ 1.

Biases are consumed as row blocks (LayerProbe.row_blocks: lo, bias rows lo..lo+R−1 over keys 0..lo+R−1), so a long sequence is never
materialised as (T, T); a layer-shared bias (Selective Attention, DCP) has a head dimension of 1.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch


def document_starts(segment_ids: torch.Tensor) -> torch.Tensor:
    """segment_ids (B, T) -> (B, T) bool: True at t ≥ 1 where a new document begins (its BOS)."""
    starts = torch.zeros_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    return starts


def document_boundaries(segment_ids: torch.Tensor) -> torch.Tensor:
    """segment_ids (B, T) -> (B, T) bool: True at t ≥ 1 where a document ends (its EOS, followed by another document)
    or begins (its BOS). Both count: a head may drop the finished document at its EOS or at the next BOS."""
    ends = torch.zeros_like(segment_ids, dtype=torch.bool)
    ends[:, 1:-1] = segment_ids[:, 1:-1] != segment_ids[:, 2:]
    return ends | document_starts(segment_ids)


@dataclass
class LayerSurvival:
    """One layer's per-head statistics, each (H,) float64 (H = 1 for a layer-shared bias)."""

    alive_fraction: torch.Tensor
    nonsuffix_fraction: torch.Tensor
    death_rate: torch.Tensor  # deaths per query, all queries t ≥ 1
    boundary_death_rate: torch.Tensor  # deaths per query at document boundaries, EOS and BOS (NaN without any)
    boundary_ratio: torch.Tensor  # boundary_death_rate / death_rate (NaN where undefined)
    boundary_deaths: torch.Tensor  # totals, kept so model-level ratios pool counts rather than average ratios
    deaths: torch.Tensor
    n_boundaries: int
    n_death_queries: int


def layer_survival(
    blocks: Iterable[tuple[int, torch.Tensor]],
    segment_ids: torch.Tensor,
    query_start: int,
    threshold: float = -1.0,
) -> LayerSurvival:
    """Survival statistics of one layer from its bias row blocks (in order, starting at row 0) and segment_ids (B, T)."""
    if threshold > 0:
        raise ValueError(f"threshold must be ≤ 0 (b[t, t] = 0 must count as alive), got {threshold}")
    boundary = document_boundaries(segment_ids)  # (B, T)
    alive_sum = nonsuffix_sum = deaths_sum = boundary_sum = None
    n_late = 0
    prev = None  # (B, H, prev_hi): alive row of the previous query, carried across blocks
    for lo, bias in blocks:  # bias (B, H, R, hi)
        alive = bias >= threshold  # −inf (s > t) is never alive
        R = bias.shape[-2]
        rows = torch.arange(lo, lo + R, device=bias.device)  # (R,) absolute query index t
        size = alive.sum(-1)  # (B, H, R): |A_t|
        if alive_sum is None:
            alive_sum, nonsuffix_sum, deaths_sum, boundary_sum = torch.zeros(
                4, bias.shape[1], dtype=torch.float64, device=bias.device)

        late = rows >= query_start  # (R,)
        n_late += int(late.sum()) * bias.shape[0]
        suffix = rows - _last_dead_key(alive, rows)  # (B, H, R): L_t
        alive_sum += (size / (rows + 1))[..., late].double().sum((0, 2))
        nonsuffix_sum += ((size - suffix) / size)[..., late].double().sum((0, 2))

        died = _deaths(alive, prev)  # (B, H, R)
        deaths_sum += died.sum((0, 2))
        at_start = boundary[:, lo : lo + R].to(died.device)  # (B, R)
        boundary_sum += (died * at_start[:, None, :]).sum((0, 2))
        prev = alive[..., -1, :]

    if alive_sum is None:
        raise ValueError("layer_survival needs at least one bias block")
    if n_late == 0:
        raise ValueError(f"no query at or past query_start={query_start} (sequence length {segment_ids.shape[1]})")
    alive_sum, nonsuffix_sum, deaths_sum, boundary_sum = (x.cpu() for x in (alive_sum, nonsuffix_sum, deaths_sum,
                                                                             boundary_sum))
    n_death_queries = segment_ids.shape[0] * (segment_ids.shape[1] - 1)
    n_boundaries = int(boundary.sum())
    rate = deaths_sum / max(n_death_queries, 1)
    boundary_rate = boundary_sum / n_boundaries if n_boundaries else torch.full_like(rate, float("nan"))
    return LayerSurvival(
        alive_fraction=alive_sum / n_late,
        nonsuffix_fraction=nonsuffix_sum / n_late,
        death_rate=rate,
        boundary_death_rate=boundary_rate,
        boundary_ratio=_ratio(boundary_rate, rate),
        boundary_deaths=boundary_sum,
        deaths=deaths_sum,
        n_boundaries=n_boundaries,
        n_death_queries=n_death_queries,
    )


def _last_dead_key(alive: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """alive (B, H, R, hi), rows (R,) -> (B, H, R): the largest dead key s ≤ t, −1 when every s ≤ t is alive."""
    keys = torch.arange(alive.shape[-1], device=alive.device)
    dead_causal = ~alive & (keys[None, :] <= rows[:, None])  # (B, H, R, hi)
    return torch.where(dead_causal, keys.int(), -1).amax(-1)  # int32: this (B, H, R, hi) tensor is the largest here


def _deaths(alive: torch.Tensor, prev: torch.Tensor | None) -> torch.Tensor:
    """deaths(t) = |A_{t−1} \\ A_t| for the block's rows: alive (B, H, R, hi); prev (B, H, w ≤ hi), the alive row of
    the query before the block (None for the first block: query 0 has no predecessor, deaths(0) = 0)."""
    if prev is None:
        prev = torch.zeros_like(alive[..., 0, :])
    # keys the earlier row did not cover (s ≥ w) were not alive for it
    prev = torch.nn.functional.pad(prev, (0, alive.shape[-1] - prev.shape[-1]), value=False)
    before = torch.cat([prev[..., None, :], alive[..., :-1, :]], dim=-2)  # (B, H, R, hi): A_{t−1} per row t
    return (before & ~alive).sum(-1).double()


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(num, float("nan")))


def pooled_boundary_ratio(layers: Iterable[LayerSurvival]) -> float:
    """Model-level boundary ratio: all heads' boundary deaths per boundary ÷ all heads' deaths per query (NaN if undefined).

    Pooled counts rather than a mean of per-head ratios, which heads with almost no deaths would dominate.
    """
    layers = list(layers)
    boundary = sum(float(s.boundary_deaths.sum()) for s in layers)
    deaths = sum(float(s.deaths.sum()) for s in layers)
    starts = sum(s.n_boundaries * s.deaths.numel() for s in layers)
    queries = sum(s.n_death_queries * s.deaths.numel() for s in layers)
    if deaths == 0 or starts == 0:
        return float("nan")
    return (boundary / starts) / (deaths / queries)


def count_nonsuffix_heads(nonsuffix_fractions: torch.Tensor, at_least: float = 0.10) -> int:
    """How many heads have a non-suffix fraction ≥ at_least (the paper: "≥10% of their alive set not a suffix")."""
    return int((nonsuffix_fractions >= at_least).sum())


def walk_steps(phi: torch.Tensor, psi: torch.Tensor) -> dict[str, torch.Tensor]:
    """FPA field/level steps: phi, psi (B, T, H) -> mean and std over (B, t ≥ 1) per head, each (H,) float64."""
    out = {}
    for name, series in (("field", phi), ("level", psi)):
        step = series.diff(dim=1).double().flatten(0, 1)  # (B·(T−1), H)
        out[f"{name}_step_mean"] = step.mean(0)
        out[f"{name}_step_std"] = step.std(0, correction=0)
    return out


@dataclass
class HeadReport:
    """What one measurement found, per layer with a bias (per-head tensors are (n_head,))."""

    query_start: int
    layers: dict[int, LayerSurvival]
    beta: dict[int, torch.Tensor] = field(default_factory=dict)  # FPA layers only
    walk: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)  # FPA layers only
    nonsuffix_at_least: float = 0.10

    def alive_fractions(self) -> torch.Tensor:
        """(n_layers_with_bias, n_head) alive fractions."""
        return torch.stack([s.alive_fraction for s in self.layers.values()])

    def nonsuffix_fractions(self) -> torch.Tensor:
        return torch.stack([s.nonsuffix_fraction for s in self.layers.values()])

    def summary(self) -> dict[str, float]:
        alive = self.alive_fractions()
        return {
            "median_alive_fraction": float(alive.flatten().quantile(0.5)),
            "nonsuffix_heads": count_nonsuffix_heads(self.nonsuffix_fractions(), self.nonsuffix_at_least),
            "heads_with_bias": alive.numel(),
            "boundary_ratio": pooled_boundary_ratio(self.layers.values()),
        }


def effective_query_start(query_start: int, seq_len: int) -> int:
    """query_start, or seq_len // 2 when the probe sequence does not reach past it (short-context runs)."""
    return query_start if query_start < seq_len else seq_len // 2


@torch.no_grad()
def measure_heads(
    model,
    input_ids: torch.Tensor,
    segment_ids: torch.Tensor,
    query_start: int = 1024,
    threshold: float = -1.0,
    nonsuffix_at_least: float = 0.10,
    block_size: int = 256,
) -> HeadReport:
    """Head statistics of `model` (a Decoder) on input_ids, segment_ids (B, T); query_start must be < T."""
    n_head = model.cfg.n_head
    report = HeadReport(query_start, {}, nonsuffix_at_least=nonsuffix_at_least)
    with torch.autocast(input_ids.device.type, enabled=False):  # bias math in float32 under mixed precision
        for layer, probe in enumerate(model.probe(input_ids, segment_ids)):
            if probe.backend == "none":
                continue
            stats = layer_survival(probe.row_blocks(block_size), segment_ids, query_start, threshold)
            report.layers[layer] = _per_head(stats, n_head)
            if probe.backend == "fpa":
                report.beta[layer] = probe.ingredients["beta"].double().cpu()
                walk = walk_steps(probe.ingredients["phi"], probe.ingredients["psi"])
                report.walk[layer] = {k: v.cpu() for k, v in walk.items()}
    if not report.layers:
        raise ValueError("the model has no attention layer with a bias; there is nothing to measure")
    return report


def _per_head(stats: LayerSurvival, n_head: int) -> LayerSurvival:
    """A layer-shared bias (1 head) applies to every head: repeat its per-head tensors to n_head."""
    if stats.alive_fraction.numel() == n_head:
        return stats
    fields = {k: (v.expand(n_head).clone() if isinstance(v, torch.Tensor) else v) for k, v in vars(stats).items()}
    return LayerSurvival(**fields)
