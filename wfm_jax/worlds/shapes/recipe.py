"""What the tiny RL recipes share: the pretrained tiny shapes pipeline (built once, cached), the
shapes prompts, the `shapes_alignment` reward with its per-attribute keys, and the 32x32 size
the model knows.

The prompts ask a size ("a small red circle ..."): RL trains on the 60 scenes SFT saw, each asked
small and large (120 prompts), and validation shows the 12 scenes it never saw, asked both ways
(24). Pretraining drew both sizes and never said which, so the size word is what RL can teach
(docs/shapes_world.md, session 46); the unsized prompt files stay for runs that want them."""
from __future__ import annotations

import os

PRETRAINED_DIR = "./outputs/tiny_sd3_shapes"
# package data, so an installed wfm_jax finds them without a checkout
PROMPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts")
TRAIN_PROMPTS = os.path.join(PROMPTS, "shapes_train_sized.txt")
HELDOUT_PROMPTS = os.path.join(PROMPTS, "shapes_heldout_sized.txt")
UNSIZED_TRAIN_PROMPTS = os.path.join(PROMPTS, "shapes_train.txt")
UNSIZED_HELDOUT_PROMPTS = os.path.join(PROMPTS, "shapes_heldout.txt")


def use_shapes_world(c, *, prompts: bool = True):
    """Point recipe `c` at the pretrained shapes pipeline and reward (in place; returns c).
    prompts=False leaves the training data alone (DDRL trains on the paired images)."""
    c.policy.model_name_or_path = PRETRAINED_DIR
    c.policy.build_tiny = False
    c.policy.build_tiny_pretrained = True
    tp = c.train.train_policy
    if prompts:
        tp.dataset.local_dir = TRAIN_PROMPTS
    tp.use_remote_reward = False
    tp.remote_reward.reward_fns = [{"name": "shapes_alignment", "weight": 1.0, "score_key": ""}]
    d = c.policy.diffusers
    d.inference_size = (32, 32)
    d.max_prompt_length = 16
    c.validation.enable = True
    c.validation.val_before_train = True  # the grid before RL, to compare with the later ones
    c.validation.dataset.local_dir = HELDOUT_PROMPTS
    c.validation.dataset.holdout_fraction = 0.0
    c.validation.batch_size = 12  # the grid: the first 12 held-out prompts (6 scenes x 2 sizes)
    return c
