"""How much a tiny VQA model gains if it always reasons in the "look" style: held-out accuracy of
its greedy answers, and of greedy answers after a forced think prefix, per question type.

    python tools/vqa_think_styles.py MODEL_DIR HELDOUT_DIR

- forced "fixed": the answer follows "<think>\\nI look at the image.\\n</think>\\n\\n<answer>";
- forced "look": the think starts with the question's subject (the cell's name or "background"),
  and the model writes the rest.

The "all-look gain" (forced look minus greedy) bounds what a reward that prefers the look style can
add to greedy accuracy without better reading: GRPO on the mixed-reasoning world moved greedy
answers to the look style and gained at most that (docs/reason2_post_training.md, session 35).
"""
from __future__ import annotations

import sys

import jax.numpy as jnp
import numpy as np

from converters.loading import load_model
from wfm_jax.families.qwen3_vl.answer import load_processor
from wfm_jax.train.vlm_eval import answers, read_images
from wfm_jax.worlds.vqa.dataset import load_records
from wfm_jax.worlds.vqa.scenes import CELL_NAMES, THINK
from wfm_jax.worlds.vqa.score import accuracy

BATCH = 48


def subject(question: str) -> str:
    """The look think's first word for a colour, shape or background question."""
    words = question.replace("?", "").split()
    if "background" in words:
        return "background"
    found = [c for c in CELL_NAMES if c in words]
    if not found:
        raise ValueError(f"no look subject in {question!r} (count and most-frequent questions have none here)")
    return found[0]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    model_dir, heldout = argv
    records = load_records(heldout)
    images = read_images(records, heldout)
    model = load_model(model_dir, dtype=jnp.float32, param_dtype=jnp.float32)[0]
    processor = load_processor(model_dir)
    questions = [r["conversations"][0]["value"].split("\n")[1] for r in records]
    styles = {"greedy": [""] * len(records),
              "fixed": [f"<think>\n{THINK}\n</think>\n\n<answer>"] * len(records),
              "look": [f"<think>\n{subject(q)}" for q in questions]}
    right = {}
    for name, prefixes in styles.items():
        texts = answers(model, processor, records, images, max_new_tokens=24, batch_size=BATCH, prefixes=prefixes)
        right[name] = np.array([accuracy([r], [t])["accuracy"] for r, t in zip(records, texts)])
        if name == "greedy":
            greedy_fixed = np.array([THINK in t for t in texts])
    g, f, look = right["greedy"], right["fixed"], right["look"]
    print(f"greedy {g.mean():.3f} ({greedy_fixed.sum()} of {len(g)} think the fixed sentence) | forced fixed "
          f"{f.mean():.3f} | forced look {look.mean():.3f} | all-look gain {look.mean() - g.mean():+.3f}")
    for kind in sorted({r["question_type"] for r in records}):
        m = np.array([r["question_type"] == kind for r in records])
        print(f"  {kind}: greedy {g[m].mean():.3f} ({(greedy_fixed & m).sum()} of {m.sum()} fixed) | forced fixed "
              f"{f[m].mean():.3f} | forced look {look[m].mean():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
