"""How well a tiny shapes pipeline follows prompts: sample each prompt a few times and score
the images with `shapes_alignment` (mean and per attribute) and with the independent detector
(worlds/shapes/detector.py: per-attribute accuracy against chance). Used by the pretraining to record
its figure, by tests, and by README numbers.

    python -m wfm_jax.tiny_eval DIR [--split heldout] [--per-prompt 4] [--steps 10]
"""
from __future__ import annotations

import numpy as np

from wfm_jax.worlds.shapes.grammar import SPLIT_SCENES


def score_pipeline(pipe, prompts, *, per_prompt: int = 4, steps: int = 10, size: int = 32,
                   seed: int = 0, guidance: float = 1.0, batch: int = 48) -> dict:
    """{"shapes_alignment": mean, "<attribute>": mean, "chance": mean score against every
    prompt of the list, "n": images, "detected": the independent detector's per-attribute
    accuracy and chance (worlds/shapes/detector.py)} over `per_prompt` images of each prompt
    (Euler ODE, CFG-free unless `guidance` > 1)."""
    from reward_client.catalog import score_local
    from wfm_jax.programs.sample import generate
    from wfm_jax.worlds.shapes.detector import accuracy

    todo = [p for p in prompts for _ in range(per_prompt)]
    scores: dict[str, list] = {}
    every: list[np.ndarray] = []
    for start in range(0, len(todo), batch):
        chunk = todo[start:start + batch]
        images = generate(pipe, chunk, steps=steps, guidance=guidance, height=size, width=size,
                          seed=seed + start, max_sequence_length=16)
        pixels = (np.clip(images, 0.0, 1.0) * 255).round().astype(np.uint8)
        every.append(pixels)
        for key, values in score_local("shapes_alignment", pixels, chunk).items():
            scores.setdefault(key, []).extend(values.tolist())
        # chance: the same images scored against every prompt of the list, averaged: what a
        # model that ignored its prompt would score
        against_all = [score_local("shapes_alignment", pixels, [p] * len(chunk))["shapes_alignment"]
                       for p in prompts]
        scores.setdefault("chance", []).extend(np.mean(against_all, axis=0).tolist())
    detected = accuracy(np.concatenate(every), todo, chance_prompts=list(prompts))
    # nanmean: `size` is NaN for a prompt without a size word
    return {**{k: float(np.nanmean(v)) for k, v in scores.items()}, "n": len(todo),
            "detected": {k: round(v, 4) for k, v in detected.items() if k != "n"}}


def score_directory(directory: str, split: str = "heldout", **kwargs) -> dict:
    from wfm_jax.families.sd3.pipeline import SD3Pipeline

    prompts = [s.prompt for s in SPLIT_SCENES[split]()]
    return score_pipeline(SD3Pipeline.load(directory), prompts, **kwargs)
