"""One variant of the tiny shapes build, scored by the independent detector: what
docs/shapes_world.md's "What the base model knows" table was measured with.

The variant takes the text encoders and the fitted VAE of a finished default build (FROM,
default outputs/tiny_sd3_shapes, which `python -m wfm_jax.tiny --pretrained` writes). It adds a
fresh adaLN-Zero transformer with the named changes, runs SFT with train/pretrain.py's recipe on
the train split, and scores the result. Its defaults are the build before session 46 (width 64,
1500 steps at lr 2e-3, random layout, one size); the default build since then is
`sizes=1 small=0.3 layout=fixed jitter=1 fixed_half=2:0.19,3:0.17 sft_steps=2000 lr=4e-3
head_dim=32`, except that its VAE is fitted on its own drawings. Variants measured before
session 46 took the VAE of a build fitted on the random layout's drawings. Scoring is on the
held-out prompts (8 images each) and the training prompts (2 each), with `shapes_alignment` and
the detector. One JSON line goes to stdout and OUT/NAME/result.json.

    python tools/shapes_build_variant.py NAME [key=value ...] [--from FROM] [--out OUT]

keys:
- transformer: patch_size, num_layers, heads, head_dim, qk_norm, pos_embed_max_size;
- SFT: sft_steps, batch, lr, ema_decay, weighting, logit_mean, count (images), seed;
- scheduler: shift;
- data: empty_captions (fraction of captions made empty, for CFG); half_side, the shapes'
  half-sides by count as fractions of the image side, e.g. `half_side=2:0.17-0.23,3:0.14-0.18`
  (grammar.HALF_SIDE; the drawings of this process only); snap=N, every box's corners and side
  on an N-px lattice (N/2 from the edge; sides rounded to N);
- layout=fixed (with jitter=J px, default 1): every scene of a count drawn at the same places
  (one shape centred; two side by side; three in a triangle), each box moved by up to J px, so
  the model has one layout per count to learn instead of a continuum (an experiment);
  fixed_half=2:0.19,3:0.17 sets its half-sides by count;
- sizes=1: every training image drawn small or large at random (grammar.SIZE_HALF; with
  layout=fixed, at the layout's places), its caption without the size word; the tokenizers know
  the size words, the model is never shown them. Scored also on the held-out scenes with each
  size word ("heldout_sized", 24 prompts), and the sized prompts of the RL scenes (rl_split=1) or
  of the training scenes are written to OUT/NAME/rl_prompts_sized.txt, with
  heldout_sized.txt: RL can teach the size word, SFT did not; sizes=noise: the same, but each
  caption carries a size word drawn independently of the drawing (so the prompts RL sees are
  worded as in SFT, and the word carries no information there); sizes=label: each caption
  carries the drawn size's word (SFT teaches it); sizes=label:P: the drawn size's word on a
  fraction P of the captions, none on the rest; small=P draws the small size with probability
  P (default one half);
- rl_split=1: a third split for RL (`rl_scenes`: each colour with another shape and background
  than its held-out ones, 12 scenes) is left out of the SFT data too, so the base is trained on
  48 scenes; its prompts are written to OUT/NAME/rl_prompts.txt and it is scored as "rl";
- scoring: heldout_per_prompt (default 8); the held-out scores are also given by count;
- sampling: guidance (when scoring);
- boost: the grammar words' token embeddings made orthogonal, at `boost` times the init scale, in
  all three text encoders.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

import numpy as np

from wfm_jax.families import tiny
from wfm_jax.families.sd3.pipeline import SD3Pipeline
from wfm_jax.train import pretrain
from wfm_jax.train.export import step_dir
from wfm_jax.train.pretrain_eval import score_directory, score_pipeline
from wfm_jax.worlds.shapes import grammar
from wfm_jax.worlds.shapes.dataset import build_shapes_dataset, drawn_size, record_of, scene_at

TOKEN_TABLES = (("text_encoder", "tokenizer", "text_model.embeddings.token_embedding.weight"),
                ("text_encoder_2", "tokenizer_2", "text_model.embeddings.token_embedding.weight"),
                ("text_encoder_3", "tokenizer_3", "shared.weight"))


def boost_grammar_words(base: str, boost: float) -> None:
    """The grammar words' rows of each text encoder's token table: orthonormal directions at
    `boost` x the table's init scale (a test of whether the conditioning limits the model)."""
    from safetensors.numpy import load_file, save_file
    from transformers import AutoTokenizer

    for encoder, tokenizer, key in TOKEN_TABLES:
        tok = AutoTokenizer.from_pretrained(os.path.join(base, tokenizer))
        ids = sorted({i for w in pretrain.GRAMMAR_WORDS
                      for i in tok(w, add_special_tokens=False).input_ids})
        folder = os.path.join(base, encoder)
        path = os.path.join(folder, next(f for f in os.listdir(folder) if f.endswith(".safetensors")))
        tensors = load_file(path)
        table = tensors[key].copy()
        n = max(table.shape[1], len(ids))
        q, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(n, n)))
        rows = q[:len(ids), :table.shape[1]]
        rows *= np.sqrt(table.shape[1]) * table.std() * boost / np.linalg.norm(rows, axis=1, keepdims=True)
        table[ids] = rows.astype(table.dtype)
        tensors[key] = table
        save_file(tensors, path, metadata={"format": "pt"})


def snapped_box(snap: int):
    """grammar._box with the box's corners and side on a `snap`-px lattice: the same few
    positions and sizes relative to the transformer's 4-px patches (an experiment)."""
    def box(half, size, rng):
        side = max(snap, snap * round(2 * half / snap))
        x0, y0 = snap // 2 + snap * rng.integers(0, (size - snap - side) // snap + 1, size=2)
        return (float(x0), float(y0), float(x0 + side), float(y0 + side))
    return box


# (centre x, centre y, half-side) per box, as fractions of the image side, by count
# the fixed layout's half-sides of an unsized scene, by count (grammar.FIXED_LAYOUTS holds the
# places): the first try's, 0.28 / 0.17 / 0.14; fixed_half=2:0.19,3:0.17 gives the default
# build's (grammar.SIZE_HALF's large sizes)
FIXED_HALF = {1: 0.28, 2: 0.17, 3: 0.14}


def fixed_layout(jitter: float):
    """grammar._layout drawing grammar's fixed layout, each box shifted by up to `jitter` px,
    at FIXED_HALF unless the scene is sized."""
    def layout(count, size, rng, max_tries, half=None):
        return grammar._fixed_layout(count, size, rng, FIXED_HALF[count] if half is None else half,
                                     jitter)
    return layout


def rl_scenes() -> list:
    """12 scenes neither held out nor trained on (rl_split=1): colour i with shape i+1 and
    background i+1 (mod their counts), every count; disjoint from grammar.heldout_scenes()."""
    out = []
    for i, colour in enumerate(grammar.COLOURS):
        shape = grammar.SHAPES[(i + 1) % len(grammar.SHAPES)]
        background = list(grammar.BACKGROUNDS)[(i + 1) % len(grammar.BACKGROUNDS)]
        out += [grammar.Scene(colour, shape, n, background) for n in grammar.COUNT_WORDS]
    assert not set(out) & set(grammar.heldout_scenes())
    return out


def sized_sample(index: int, seed: int, size: int, scenes: list, layout: str = "random",
                 small: float | None = None, *, caption: str = "none", p_small: float | None = None):
    """dataset.sample with the scene drawn small or large (its own generator; small with
    probability `p_small`, default one half), captioned without the size word ("none"), with one
    drawn independently of the drawing ("noise"), or with the drawn one ("label")."""
    scene = scene_at(index, seed, scenes)
    rng = np.random.default_rng([seed, index, 7])
    which, said = (grammar.SIZES[int(i)] for i in rng.integers(2, size=2))
    # `layout` and `small` are dataset.sample's (the library's own ways): this tool sets the
    # layout through grammar._layout and the small fraction through p_small
    if p_small is not None:
        which = drawn_size(index, seed, p_small)
    image, boxes = grammar.draw_scene(scene.sized(which), size, np.random.default_rng([seed, index]))
    kind, _, fraction = caption.partition(":")
    if kind == "label" and fraction and rng.random() >= float(fraction):
        kind = "none"
    word = {"none": None, "noise": said, "label": which}[kind]
    return image, {**record_of(scene.sized(which), boxes), "prompt": scene.sized(word).prompt}


def empty_captions(data: str, out: str, fraction: float, seed: int) -> str:
    """A copy of the paired dataset `data` with `fraction` of its captions emptied."""
    shutil.copytree(data, out)
    rng = np.random.default_rng(seed)
    for name in sorted(os.listdir(out)):
        if name.endswith(".json") and rng.random() < fraction:
            path = os.path.join(out, name)
            with open(path) as f:
                record = json.load(f)
            record["prompt"] = ""
            with open(path, "w") as f:
                json.dump(record, f)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("name")
    p.add_argument("changes", nargs="*", help="key=value")
    p.add_argument("--from", dest="source", default="outputs/tiny_sd3_shapes")
    p.add_argument("--out", default="outputs/shapes_variants")
    args = p.parse_args(argv)
    kv = dict(c.split("=", 1) for c in args.changes)
    if not pretrain.read_marker(args.source):
        print(f"error: {args.source} is not a complete pretrained build "
              "(python -m wfm_jax.tiny --pretrained DIR)", file=sys.stderr)
        return 2

    def num(key, default):
        return type(default)(kv.get(key, default))

    s = pretrain.PretrainSettings(sft_steps=num("sft_steps", 1500), batch=num("batch", 16),
                                  num_layers=num("num_layers", 4), heads=num("heads", 4),
                                  head_dim=num("head_dim", 16), dataset_count=num("count", 1200),
                                  seed=num("seed", 0), lr=num("lr", 2e-3), layout="random",
                                  small=None)
    root = os.path.abspath(os.path.join(args.out, args.name))
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    configs = pretrain.base_configs(s)
    # the tokenizers know the size words only in a sizes= build (as before the library's build
    # took them up), so the figures of the unsized variants stay reproducible
    configs["words"] = tuple(w for w in configs["words"] if w not in grammar.SIZES)
    if "sizes" in kv:
        configs["words"] = (*configs["words"], *grammar.SIZES)
    for key in ("patch_size", "qk_norm", "pos_embed_max_size"):
        if key in kv:
            configs["transformer"][key] = kv[key] if key == "qk_norm" else int(kv[key])
    base = os.path.join(root, "base")
    tiny.write_pipeline(base, s.seed, **configs)
    pretrain.zero_init_transformer(base)
    shutil.rmtree(os.path.join(base, "vae"))
    shutil.copytree(os.path.join(args.source, "vae"), os.path.join(base, "vae"))
    if "half_side" in kv:
        for part in kv["half_side"].split(","):
            count, span = part.split(":")
            lo, hi = span.split("-")
            grammar.HALF_SIDE[int(count)] = (float(lo), float(hi))
    if "snap" in kv:
        grammar._box = snapped_box(int(kv["snap"]))
    if "fixed_half" in kv:  # e.g. 2:0.19,3:0.17: the fixed layout's half-sides by count
        for part in kv["fixed_half"].split(","):
            count, half = part.split(":")
            FIXED_HALF[int(count)] = float(half)
    if kv.get("layout") == "fixed":
        grammar._layout = fixed_layout(float(kv.get("jitter", 1.0)))
    if "boost" in kv:
        boost_grammar_words(base, float(kv["boost"]))
    if "shift" in kv:
        path = os.path.join(base, "scheduler", "scheduler_config.json")
        with open(path) as f:
            scheduler = json.load(f)
        scheduler["shift"] = float(kv["shift"])
        with open(path, "w") as f:
            json.dump(scheduler, f)
    if kv.get("rl_split") == "1":
        rl = rl_scenes()
        left_out = set(rl)
        trained = [sc for sc in grammar.train_scenes() if sc not in left_out]
        grammar.SPLIT_SCENES["train"] = lambda: trained
        grammar.SPLIT_SCENES["rl"] = lambda: rl
        with open(os.path.join(root, "rl_prompts.txt"), "w") as f:
            f.write("".join(sc.prompt + "\n" for sc in rl))
    if "sizes" in kv:
        import functools

        from wfm_jax.worlds.shapes import dataset as shapes_dataset
        shapes_dataset.sample = functools.partial(
            sized_sample, caption={"1": "none"}.get(kv["sizes"], kv["sizes"]),
            p_small=float(kv["small"]) if "small" in kv else None)
        held = grammar.sized(grammar.heldout_scenes())
        rl_sized = grammar.sized(grammar.SPLIT_SCENES["rl" if "rl" in grammar.SPLIT_SCENES else "train"]())
        for name, scenes in (("heldout_sized.txt", held), ("rl_prompts_sized.txt", rl_sized)):
            with open(os.path.join(root, name), "w") as f:
                f.write("".join(sc.prompt + "\n" for sc in scenes))
    data = build_shapes_dataset(os.path.join(root, "data"), count=s.dataset_count, size=s.size,
                                seed=s.seed, split="train")
    if "empty_captions" in kv:
        data = empty_captions(data, os.path.join(root, "data_empty"), float(kv["empty_captions"]),
                              s.seed)
    out = os.path.join(root, "sft")
    c = pretrain._sft_config(s, base, data, out)
    if "lr" in kv:
        c.train.optm_lr = float(kv["lr"])
    if "ema_decay" in kv:
        c.train.ema_decay = float(kv["ema_decay"])
    if "weighting" in kv:
        c.policy.diffusers.weighting_scheme = kv["weighting"]
    if "logit_mean" in kv:
        c.policy.diffusers.logit_mean = float(kv["logit_mean"])
    start = time.perf_counter()
    from wfm_jax.train import sft
    sft.run(c)
    result = {"name": args.name, "changes": kv, "sft_seconds": round(time.perf_counter() - start),
              "final_loss": pretrain._final_loss(out)}
    exported = step_dir(out, s.sft_steps)
    guidance = float(kv.get("guidance", 1.0))
    heldout = int(kv.get("heldout_per_prompt", 8))
    splits = (("heldout", heldout), ("train", 2)) + tuple(
        (name, heldout) for name in ("rl", "heldout_sized") if name in grammar.SPLIT_SCENES)
    for split, per_prompt in splits:
        result[split] = score_directory(exported, split, per_prompt=per_prompt, size=s.size,
                                        guidance=guidance)
    pipe = SD3Pipeline.load(exported)
    result["heldout_by_count"] = {
        n: score_pipeline(pipe, [sc.prompt for sc in grammar.heldout_scenes() if sc.count == n],
                          per_prompt=heldout, size=s.size, guidance=guidance)["detected"]
        for n in grammar.COUNT_WORDS}
    line = json.dumps(result)
    print(line)
    with open(os.path.join(root, "result.json"), "w") as f:
        f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
