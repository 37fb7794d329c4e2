"""`--layers K` for the DiT families (SD3/3.5, Wan2.1, Cosmos-Predict2.5, SANA, SANA-Video): the
transformer configs of two cut models, with K and 2K blocks, whose compiles report.py scales
linearly to the model's depth (compiled.scale_linear), as vlm.py's --vision-blocks does for the
vision tower. Unrolled blocks are compiled one by one, so a cut model compiles faster (SD3.5-M's
unrolled step on the TPU compiler: 67 s + 82 s at 2 and 4 blocks, 273 s at 24); a scanned run is
compiled once whatever its length, so there the cut models save less (SD3.5-M's scanned step:
135 s + 128 s at 5 and 10 blocks, 221 s at 24; Wan2.1's scanned update: 49 s + 55 s at 2 and 4,
149 s at 30), and where they do not keep the scans their figures are rough
(docs/sharding_and_memory.md).

Blocks of a kind (`PipelineFamily.block_kinds`: SD3.5's dual-attention "joint+dual", plain
"joint" and context_pre_only "last" blocks; one "block" kind elsewhere) are alike, so a
measurement is linear in the count of each kind. A kind the model has once (SD3's last block) is
kept once in both cut models; the others are chosen so that the cut models scan as the model does
(scan_layers: two or more of each repeated kind) where K allows, then so that the extrapolated
counts come as near the model's as whole blocks allow, then in proportion. Where they cannot match (SD3.5-M at K=2:
12 dual + 11 plain for its 13 + 10), `layer_scaling` says what was extrapolated.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

SCALE_METHOD = ("two compiles with K and 2K transformer blocks (each kind of block in proportion, a "
                "block the model has once kept once: layer_scaling); argument, output, alias and "
                "temp bytes, FLOPs, collectives and each compile's loop-corrected cost-model "
                "seconds scaled linearly to the model's depth: full = a + (b - a) x (layers - K) / "
                "K; the resident state (params, optimizer, EMA, RL copies, frozen) is the full "
                "abstract model's, not scaled")

JOIN_METHOD = ("the VAE decode that ends the sampler and the rollout compiled once and joined to "
               "each cut model's program up to it (plan.compiled.join_tail: bytes, FLOPs and "
               "seconds summed, temporaries the larger)")


@dataclasses.dataclass(frozen=True)
class Cut:
    """Two cut models of a transformer: `configs` (transformer config dicts) at `depths`
    (K, 2K) blocks; `kinds`, their blocks; `full`, the model's depth; `info`, the report's
    layer_scaling entry."""
    depths: tuple[int, int]
    full: int
    configs: tuple[dict, dict]
    kinds: tuple[list[str], list[str]]
    info: dict


def _compositions(total: int, parts: int):
    """Every tuple of `parts` non-negative ints summing to `total`."""
    for cuts in itertools.combinations(range(total + parts - 1), parts - 1):
        edges = (-1, *cuts, total + parts - 1)
        yield tuple(edges[i + 1] - edges[i] - 1 for i in range(parts))


def choose_blocks(kinds: list[str], k: int,
                  scan: bool = False) -> tuple[list[str], list[str], dict[str, float]]:
    """The blocks of the K- and 2K-block models for a model whose blocks are `kinds`, and the
    block counts per kind the extrapolation stands for. Kinds keep the order of their first
    appearance; a kind the model has once is kept once in both. scan: the model runs each
    repeated kind as one lax.scan, so a cut model should hold two or more of each too (a run
    of one is unrolled, and a scan's temporaries grow by another amount per block than
    unrolled blocks'): first the fewest runs of one or none, then the nearest extrapolated
    mix, then the mix nearest the model's proportions."""
    n = len(kinds)
    if k < 1 or 2 * k > n:
        raise ValueError(f"--layers {k}: K must be at least 1 and 2K at most the model's {n} blocks")
    counts = Counter(kinds)
    order = list(dict.fromkeys(kinds))
    single = [kind for kind in order if counts[kind] == 1]
    many = [kind for kind in order if counts[kind] > 1]
    if k < len(single) or not many:
        raise ValueError(f"--layers {k}: at least {len(single)} (blocks {single} occur once and are "
                         f"kept in both models)")
    x = (n - k) / k
    n1, n2 = k - len(single), 2 * k - len(single)
    share = {kind: counts[kind] / (n - len(single)) for kind in many}

    def cost(pair):
        c1, c2 = pair
        unscanned = sum(c < 2 for c in (*c1, *c2)) if scan else 0
        miss = sum(abs(a + (b - a) * x - counts[kind]) for kind, a, b in zip(many, c1, c2))
        skew = sum(abs(a / max(n1, 1) - share[kind]) + abs(b / n2 - share[kind])
                   for kind, a, b in zip(many, c1, c2))
        return (unscanned, round(miss, 9), skew)
    c1, c2 = min(itertools.product(_compositions(n1, len(many)), _compositions(n2, len(many))),
                 key=cost)

    def blocks(c):
        got = dict(zip(many, c), **dict.fromkeys(single, 1))
        return [kind for kind in order for _ in range(got[kind])]
    extrapolated = dict.fromkeys(single, 1.0)
    extrapolated.update({kind: a + (b - a) * x for kind, a, b in zip(many, c1, c2)})
    return blocks(c1), blocks(c2), {kind: extrapolated[kind] for kind in order}


def cut(family, t_cfg: dict, k: int, scan: bool = False) -> Cut:
    """The K- and 2K-block models of transformer config `t_cfg` of `family` (a PipelineFamily
    class); scan: the recipe scans repeated blocks (choose_blocks); ValueError for a K the
    model cannot take."""
    kinds = family.block_kinds(t_cfg)
    small, large, extrapolated = choose_blocks(kinds, k, scan)
    counts = Counter(kinds)
    info = {"model_blocks": len(kinds), "model_kinds": dict(counts),
            "compiled": [{"layers": len(b), "kinds": dict(Counter(b)), "blocks": b}
                         for b in (small, large)],
            "extrapolated_kinds": {kind: round(v, 3) for kind, v in extrapolated.items()},
            "exact_mix": all(abs(v - counts[kind]) < 1e-9 for kind, v in extrapolated.items()),
            # scanned like the model: every repeated kind two or more times in both cut models
            "scan_kept": _scans_kept(kinds, small, large) if scan else None,
            # the smallest K whose cut models scan as the model does
            "scan_kept_from_k": (next((j for j in range(1, len(kinds) // 2 + 1)
                                       if _scans_kept(kinds, *choose_blocks(kinds, j, True)[:2])),
                                      None) if scan else None)}
    return Cut((k, 2 * k), len(kinds), (family.with_blocks(t_cfg, small),
                                        family.with_blocks(t_cfg, large)), (small, large), info)


def _scans_kept(kinds: list[str], *cut_models: list[str]) -> bool:
    counts = Counter(kinds)
    return all(Counter(b)[kind] >= 2 for b in cut_models for kind in counts if counts[kind] > 1)


def describe(info: dict) -> str:
    """One line: the model's blocks, the cut models' and what the extrapolation stands for."""
    def mix(c: dict) -> str:
        return " + ".join(f"{v:g} {kind}" for kind, v in c.items())
    compiled = "; ".join(f"{c['layers']}: {mix(c['kinds'])}" for c in info["compiled"])
    line = (f"layers: compiled {compiled}; extrapolated to {mix(info['extrapolated_kinds'])}, "
            f"the model's {info['model_blocks']}: {mix(info['model_kinds'])}")
    if not info["exact_mix"]:
        line += " (the nearest mix whole blocks allow)"
    if info.get("scan_kept") is False:
        line += ("; a cut model runs a repeated kind unscanned (fewer than 2 of it), the model "
                 "scans it: bytes and FLOPs are approximate (docs/sharding_and_memory.md: up to "
                 "30% on SD3.5's temporaries)"
                 + (f"; K >= {info['scan_kept_from_k']} keeps the scans"
                    if info.get("scan_kept_from_k") else ""))
    return line
