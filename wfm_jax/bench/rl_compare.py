"""The rl suite over several seeds: per-step mean and spread of the reward over seeds, the
samples each algorithm needs to reach fixed reward levels, and a PNG of reward against samples
seen (PIL only: no plotting library is a dependency).
"""
from __future__ import annotations

import math

COLOURS = {"NFT": (31, 119, 180), "GRPO": (214, 39, 40), "DDRL": (44, 160, 44)}
SMOOTH = 3  # steps in the running mean a level must be reached by (one step's batch is noisy)


def seed_curves(per_seed: dict, batch: int) -> dict:
    """{name: {"steps", "samples", "mean", "std", "seeds"}}: at each step every seed logged,
    the mean and population std over seeds of train/reward_mean."""
    out = {}
    for name, runs in per_seed.items():
        by_step: dict[int, list] = {}
        for metrics in runs.values():
            for m in metrics:
                r = m.get("reward_mean")
                if isinstance(r, (int, float)) and math.isfinite(r):
                    by_step.setdefault(m["step"], []).append(r)
        steps = sorted(s for s, v in by_step.items() if len(v) == len(runs))
        means = [sum(by_step[s]) / len(by_step[s]) for s in steps]
        stds = [math.sqrt(sum((x - mu) ** 2 for x in by_step[s]) / len(by_step[s]))
                for s, mu in zip(steps, means)]
        out[name] = {"steps": steps, "samples": [s * batch for s in steps], "mean": means,
                     "std": stds, "seeds": len(runs)}
    return out


def running_mean(values: list, k: int = SMOOTH) -> list:
    return [sum(values[max(0, i - k + 1):i + 1]) / len(values[max(0, i - k + 1):i + 1])
            for i in range(len(values))]


def default_levels(curves: dict, rises=(0.02, 0.04, 0.06, 0.08)) -> list:
    """Levels above the algorithms' common start (the mean first-step reward over all)."""
    firsts = [c["mean"][0] for c in curves.values() if c["mean"]]
    if not firsts:
        return []
    start = sum(firsts) / len(firsts)
    return [round(start + r, 4) for r in rises]


def samples_to_reach(curves: dict, levels: list) -> dict:
    """{name: {level: samples seen when the seed-mean curve's running mean first reaches the
    level, or None}}."""
    out = {}
    for name, c in curves.items():
        smooth = running_mean(c["mean"])
        out[name] = {str(level): next((n for n, r in zip(c["samples"], smooth) if r >= level),
                                      None) for level in levels}
    return out


def reach_markdown(reach: dict, levels: list) -> str:
    names = list(reach)
    lines = [f"Samples seen until the seed-mean reward ({SMOOTH}-step running mean) first "
             "reaches each level (- : not within the budget):", "",
             "| reward level | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for level in levels:
        cells = [reach[n][str(level)] for n in names]
        lines.append(f"| {level:.3f} | " + " | ".join("-" if v is None else str(v) for v in cells)
                     + " |")
    return "\n".join(lines) + "\n"


def plot_png(curves: dict, path: str, title: str, size=(720, 440)) -> str:
    """Reward (mean over seeds, band: +-1 std) against samples seen, one colour per algorithm."""
    from PIL import Image, ImageDraw

    w, h = size
    left, right, top, bottom = 70, 20, 40, 50
    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    pts = [(n, r) for c in curves.values() for n, r, s in zip(c["samples"], c["mean"], c["std"])
           for r in (r - s, r + s)]
    if not pts:
        img.save(path)
        return path
    x_max = max(n for n, _ in pts)
    y_lo, y_hi = min(r for _, r in pts), max(r for _, r in pts)
    y_lo, y_hi = (y_lo - 0.01, y_hi + 0.01) if y_hi - y_lo < 0.02 else (y_lo, y_hi)

    def xy(n, r):
        return (left + (w - left - right) * n / max(x_max, 1),
                top + (h - top - bottom) * (1 - (r - y_lo) / (y_hi - y_lo)))

    d.rectangle([left, top, w - right, h - bottom], outline="black")
    for i in range(5):
        r = y_lo + (y_hi - y_lo) * i / 4
        x, y = xy(0, r)
        d.line([(left - 4, y), (left, y)], fill="black")
        d.text((4, y - 6), f"{r:.3f}", fill="black")
        n = x_max * i / 4
        x, y = xy(n, y_lo)
        d.line([(x, h - bottom), (x, h - bottom + 4)], fill="black")
        d.text((x - 10, h - bottom + 8), f"{n:.0f}", fill="black")
    d.text((w // 2 - 40, h - 20), "samples seen", fill="black")
    d.text((left, 10), title, fill="black")
    for i, (name, c) in enumerate(curves.items()):
        colour = COLOURS.get(name, (100, 100, 100))
        band = [xy(n, m + s) for n, m, s in zip(c["samples"], c["mean"], c["std"])]
        band += [xy(n, m - s) for n, m, s in reversed(list(zip(c["samples"], c["mean"], c["std"])))]
        if len(band) >= 3:
            overlay = Image.new("RGBA", size, (0, 0, 0, 0))
            ImageDraw.Draw(overlay).polygon(band, fill=(*colour, 50))
            img.paste(overlay, (0, 0), overlay)
            d = ImageDraw.Draw(img)
        line = [xy(n, m) for n, m in zip(c["samples"], c["mean"])]
        if len(line) >= 2:
            d.line(line, fill=colour, width=2)
        d.text((w - right - 170, top + 8 + 14 * i), f"{name} ({c['seeds']} seeds)", fill=colour)
    img.save(path)
    return path
