"""The vision-language side of `python -m wfm_jax.generate`: which kind of model a directory holds,
the question-answering flags, and the run that prints the answers.

    python -m wfm_jax.generate --model QWEN3_VL_DIR --image cat.png --prompt "What is this?" \
        --max-new-tokens 64 [--temperature 0.7 --top-p 0.9 --top-k 50 --seed 0] [--save-array ids.npy]

A diffusers pipeline dir (model_index.json) generates images / videos; a Qwen3-VL dir (config.json
with model_type qwen3_vl) answers: greedy unless --temperature is given. Several --prompt make one
left-padded batch (the image or video goes with each); the answers print one per prompt.
"""
from __future__ import annotations

import os
import sys

import numpy as np

# flags that only one kind of model reads (dest names); the other kind rejects them in one line
VLM_ONLY = ("image", "max_new_tokens", "temperature", "top_p", "top_k")
PIPELINE_ONLY = ("negative_prompt", "steps", "guidance", "sampler", "frames", "max_sequence_length",
                 "latents", "out")


def add_arguments(parser) -> None:
    g = parser.add_argument_group("vision-language models (a Qwen3-VL model dir)")
    g.add_argument("--image", help="image to ask about (the user turn holds it before the text)")
    g.add_argument("--max-new-tokens", type=int, help="longest answer in tokens (default 256)")
    g.add_argument("--temperature", type=float, help="sample at this temperature (default: greedy)")
    g.add_argument("--top-p", type=float, help="nucleus sampling mass (with --temperature)")
    g.add_argument("--top-k", type=int, help="sample from the k most likely tokens (with --temperature)")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def model_kind(directory: str) -> str:
    """"pipeline" (model_index.json) or "vlm" (a Qwen3-VL config.json); one line for anything else."""
    from wfm_jax.families.qwen3_vl.answer import vlm_config

    if not os.path.isdir(directory):
        raise ValueError(f"no such pipeline directory or model directory: {directory}")
    if os.path.isfile(os.path.join(directory, "model_index.json")):
        return "pipeline"
    if vlm_config(directory) is not None:
        return "vlm"
    held = "no model_index.json or config.json"
    if os.path.isfile(os.path.join(directory, "config.json")):
        from converters.loading import read_json
        config = read_json(os.path.join(directory, "config.json"))
        held = (f"a config.json of model_type {config.get('model_type')!r} "
                f"({', '.join(config.get('architectures') or []) or 'no architectures'})")
    raise ValueError(f"{directory} is neither a diffusers pipeline (model_index.json) nor a Qwen3-VL "
                     f"model (config.json with model_type qwen3_vl); it holds {held}")


def check_flags(args, kind: str) -> None:
    """Flags of the other kind of model are an error, not silently ignored."""
    wrong = VLM_ONLY if kind == "pipeline" else PIPELINE_ONLY
    given = [_flag(d) for d in wrong if getattr(args, d, None) is not None]
    if given:
        what = ("a diffusion pipeline, which takes no image or answer settings" if kind == "pipeline"
                else "a Qwen3-VL model, which answers questions and takes no diffusion settings")
        raise ValueError(f"{' '.join(given)}: {args.model} holds {what}")


def sampling_of(args):
    from wfm_jax.models.qwen3_vl.generate import Sampling

    if args.temperature is None:
        if args.top_p is not None or args.top_k is not None:
            raise ValueError("--top-p / --top-k apply when sampling: give --temperature too")
        return Sampling()
    if args.temperature <= 0:
        raise ValueError(f"--temperature must be > 0 (leave it out for greedy), got {args.temperature}")
    return Sampling(temperature=args.temperature, top_k=args.top_k or 0,
                    top_p=1.0 if args.top_p is None else args.top_p)


def save_ids(path: str, ids: np.ndarray) -> None:
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp.npy"
    np.save(tmp, np.asarray(ids, np.int32))
    os.replace(tmp, path)


def run(args, prompts: list[str]) -> int:
    """Answer the prompts with the Qwen3-VL dir in args.model; bad input raises ValueError."""
    from wfm_jax.families.qwen3_vl.answer import (
        VisionLanguageModel,
        load_processor,
        load_video,
        read_image,
    )

    if args.image and args.video:
        raise ValueError("give --image or --video, not both")
    max_new = 256 if args.max_new_tokens is None else args.max_new_tokens
    if max_new < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {max_new}")
    sampling = sampling_of(args)
    image = read_image(args.image) if args.image else None
    video = load_video(args.video) if args.video else None
    processor = load_processor(args.model)
    if image is not None and processor.image_config is None:
        raise ValueError(f"--image: {args.model} has no image processor settings "
                         "(preprocessor_config.json); it answers text only")
    if video is not None and processor.video_config is None:
        raise ValueError(f"--video: {args.model} has no video processor settings; it answers text only")
    vlm = VisionLanguageModel.load(args.model, processor=processor)
    out = vlm.answer(prompts, image=image, video=video, max_new_tokens=max_new, sampling=sampling,
                     seed=args.seed)
    for i, text in enumerate(out.texts):
        print(text if len(out.texts) == 1 else f"[{i}] {text}")
    if args.save_array:
        save_ids(args.save_array, out.token_ids)
        print(f"wrote {args.save_array}", file=sys.stderr)
    return 0
