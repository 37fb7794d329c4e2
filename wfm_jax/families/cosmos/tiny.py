"""A complete tiny Cosmos2_5_PredictBasePipeline directory with random weights, built offline
without torch.

    python -m wfm_jax.tiny --family cosmos DIR [--seed S] [--overwrite]

Same recipe as wfm_jax.families.tiny / tiny_wan: configs written as diffusers / transformers
`save_pretrained` write them, weights drawn with numpy in the wfm_jax models' shapes and saved
through their converter tables, all under a temporary sibling renamed into place.

Sizes (spec video_models.md §4.1): the tiny Wan VAE of tiny_wan (4 latent channels, so the DiT's
in_channels is 4 + 1 for the condition mask), a 2-layer DiT of width 24, and the tiny Qwen2.5-VL
of tiny_qwen (2 layers x 32 wide: the Reason1 embedding is 64 wide, the DiT's
crossattn_proj_in_channels). No safety_checker component: diffusers' cosmos_guardrail is not a
model of ours (see README for loading the dir in diffusers without it).
"""
from __future__ import annotations

import json
import os

import numpy as np

from wfm_jax.families import tiny
from wfm_jax.families.cosmos import tiny_qwen
from wfm_jax.families.wan import tiny as tiny_wan

QWEN_HIDDEN, QWEN_LAYERS = 32, 2
TEXT_WIDTH = QWEN_HIDDEN * QWEN_LAYERS  # the Reason1 embedding's width
FRAMES, HEIGHT, WIDTH = 9, 32, 32        # latents (4, 3, 4, 4): 12 tokens

MODELS = {
    "text_encoder": ("transformers", "Qwen2_5_VLForConditionalGeneration", 1),
    "transformer": ("diffusers", "CosmosTransformer3DModel", 2),
    "vae": ("diffusers", "AutoencoderKLWan", 3),
}
OTHERS = {
    "scheduler": ("diffusers", "UniPCMultistepScheduler"),
    "tokenizer": ("transformers", "Qwen2Tokenizer"),
}


def transformer_config(**overrides) -> dict:
    """Every `CosmosTransformer3DModel.__init__` argument (the Predict2.5 structure, tiny)."""
    values = dict(
        in_channels=tiny_wan.LATENT_CHANNELS + 1, out_channels=tiny_wan.LATENT_CHANNELS,
        num_attention_heads=2, attention_head_dim=12, num_layers=2, mlp_ratio=2.0,
        text_embed_dim=16, adaln_lora_dim=8, max_size=[8, 32, 32], patch_size=[1, 2, 2],
        rope_scale=[1.0, 3.0, 3.0], concat_padding_mask=True, extra_pos_embed_type=None,
        use_crossattn_projection=True, crossattn_proj_in_channels=TEXT_WIDTH,
        encoder_hidden_states_channels=16, controlnet_block_every_n=None,
        img_context_dim_in=None, img_context_num_tokens=256, img_context_dim_out=2048)
    return tiny._diffusers_config("CosmosTransformer3DModel", **{**values, **overrides})


def scheduler_config() -> dict:
    """UniPC as the released pipeline ships it (spec §1.1): Karras sigmas in [0.01, 200] mapped
    to flow sigmas, flow prediction, order 2, bh2, final sigma zero."""
    cfg = tiny_wan.scheduler_config()
    cfg.update(use_karras_sigmas=True, use_flow_sigmas=True, sigma_min=0.01, sigma_max=200.0,
               flow_shift=1.0)
    return cfg


def text_encoder_config(tokenizer):
    """transformers Qwen2_5_VLConfig (torch-free) of tiny_qwen, matched to `tokenizer`."""
    import transformers
    cfg = tiny_qwen.qwen_config(len(tokenizer), hidden_size=QWEN_HIDDEN,
                                num_hidden_layers=QWEN_LAYERS)
    # the tiny vocab's own ids (the default Qwen ids lie outside it)
    ids = dict(bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.pad_token_id)
    cfg["text_config"].update(ids)
    config = transformers.Qwen2_5_VLConfig(**ids, **{k: cfg[k] for k in (
        "text_config", "vision_config", "tie_word_embeddings")})
    config.architectures = list(cfg["architectures"])
    return config


def qwen_weights(config: dict, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], str]:
    """(checkpoint key -> fp32 tensor, stem) of the text encoder: the text tower drawn as
    tiny.random_weights draws (through its converter table), the vision tower and lm_head (never
    run by wfm_jax) drawn plainly, norm weights near 1."""
    from flax import nnx

    from converters.loading import all_variables
    from converters.qwen2_5_vl import build_text_table
    from converters.table import convert_to_diffusers
    from wfm_jax.core.abstract import abstract_module
    from wfm_jax.models.text.qwen2_5_vl import make_text_model, passthrough_shapes

    model = abstract_module(lambda: make_text_model(config, rngs=nnx.Rngs(0)))
    shapes = {k: tuple(v.shape) for k, v in all_variables(model).items()}
    table = build_text_table(config, prefix="")
    flat = {r.jax: tiny._draw(r.jax, r.transform, shapes, rng)
            for r in sorted(table, key=lambda r: r.jax)}
    tensors = convert_to_diffusers(table, flat)
    for key, shape in sorted(passthrough_shapes(config).items()):
        noise = rng.standard_normal(shape, dtype=np.float32)
        norm = len(shape) == 1 and ("norm" in key or "ln_q" in key)
        tensors[key] = 1.0 + 0.1 * noise if norm else 0.02 * noise
    return tensors, "model"


def model_index() -> dict:
    entries = {name: [lib, cls] for name, (lib, cls, _) in MODELS.items()}
    entries.update({name: list(v) for name, v in OTHERS.items()})
    entries["safety_checker"] = [None, None]
    return tiny._diffusers_config("Cosmos2_5_PredictBasePipeline", **entries)


def write_pipeline(directory: str, seed: int = 0, *, transformer: dict | None = None) -> None:
    """Write every file of the pipeline into `directory` (non-atomic; see
    tiny.build_tiny_pipeline). transformer: config overrides."""
    from converters.safetensors_io import save_checkpoint

    tok = tiny_qwen.qwen_tokenizer()
    tok.save_pretrained(os.path.join(directory, "tokenizer"))
    text_encoder_config(tok).save_pretrained(os.path.join(directory, "text_encoder"))
    tiny.write_json(transformer_config(**(transformer or {})),
                    os.path.join(directory, "transformer", "config.json"))
    tiny.write_json(tiny_wan.vae_config(), os.path.join(directory, "vae", "config.json"))
    tiny.write_json(scheduler_config(),
                    os.path.join(directory, "scheduler", "scheduler_config.json"))
    for name, (_, _, offset) in MODELS.items():
        with open(os.path.join(directory, name, "config.json")) as f:
            config = json.load(f)
        draw = qwen_weights if name == "text_encoder" else tiny.random_weights
        tensors, stem = draw(config, np.random.default_rng([seed, offset]))
        save_checkpoint(tensors, os.path.join(directory, name), stem=stem)
    tiny.write_json(model_index(), os.path.join(directory, "model_index.json"))
