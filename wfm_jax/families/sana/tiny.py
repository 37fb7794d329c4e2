"""Complete tiny SanaPipeline and SanaVideoPipeline directories with random weights, built
offline without torch.

    python -m wfm_jax.tiny --family sana DIR [--seed S] [--overwrite]
    python -m wfm_jax.tiny --family sana_video DIR

The SANA counterparts of wfm_jax.families.tiny / tiny_wan (same recipe: configs written as the JSON
diffusers / transformers `save_pretrained` write, weights drawn with numpy in the wfm_jax model's
shape and saved in the checkpoint layout its converter table gives, all under a temporary sibling
renamed into place). Sizes are spec video_models.md §4.3's. The Gemma tokenizer is byte-fallback
BPE over single characters plus whole-word merges for the words of both pipelines' complex human
instructions, so the default instruction costs ~240 tokens, not ~1100 (it stays on, as in the
released pipelines); the tiny Gemma2 allows 1024 positions, enough for it plus 300 prompt tokens.
"""
from __future__ import annotations

import json
import os
import re

import numpy as np

from wfm_jax.families import tiny
from wfm_jax.families.wan import tiny as tiny_wan

GEMMA_WIDTH = 16      # = the transformers' caption_channels
GEMMA_POSITIONS = 1024
LATENT_CHANNELS = 4
DCAE_SCALING_FACTOR = 0.41407  # SANA1.5's DC-AE f32c32 value
IMAGE_SHIFT, VIDEO_SHIFT = 3.0, 8.0  # the released schedulers' flow_shift (spec §1.3, §1.4)
HEIGHT = WIDTH = 32   # the smallest size both pipelines take (multiples of 32)
FRAMES = 9            # SANA-Video: 4k + 1 frames -> 3 latent frames
_CHARS = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
          "▁.,:;'\"-!?()>\n")

IMAGE_MODELS = {
    "text_encoder": ("transformers", "Gemma2Model", 1),
    "transformer": ("diffusers", "SanaTransformer2DModel", 2),
    "vae": ("diffusers", "AutoencoderDC", 3),
}
VIDEO_MODELS = {
    "text_encoder": ("transformers", "Gemma2Model", 1),
    "transformer": ("diffusers", "SanaVideoTransformer3DModel", 2),
    "vae": ("diffusers", "AutoencoderKLWan", 3),
}
# the released model_index.json names the fast class (one class in transformers 5)
OTHERS = {"scheduler": ("diffusers", "DPMSolverMultistepScheduler"),
          "tokenizer": ("transformers", "GemmaTokenizerFast")}


def _instruction_words() -> list[str]:
    from wfm_jax.families.sana.pipeline import IMAGE_INSTRUCTION
    from wfm_jax.families.sana.video_pipeline import VIDEO_INSTRUCTION
    text = "\n".join(IMAGE_INSTRUCTION + VIDEO_INSTRUCTION).lower()
    return sorted(set(re.findall(r"[a-z]+", text)))


def gemma_tokenizer(words=()):
    """Gemma's specials and byte fallback, single characters, and merges spelling "▁word" for
    each instruction word and each of `words` (longest chains first, as tiny.word_merges)."""
    from transformers import GemmaTokenizer

    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    vocab.update({f"<0x{i:02X}>": 4 + i for i in range(256)})
    for ch in _CHARS:
        vocab.setdefault(ch, len(vocab))
    merges = []
    for word in sorted(set(_instruction_words()) | set(words), key=lambda w: (-len(w), w)):
        left = "▁"
        for right in word:
            if (left, right) not in merges:
                merges.append((left, right))
            left += right
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    # right padding as SANA's encode_prompt sets it (saved, so a plain load agrees)
    return GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True, add_eos_token=False,
                          padding_side="right")


def text_encoder_config(tokenizer):
    """transformers Gemma2Config (torch-free): spec §4.3's two layers, GQA 2/1, head_dim 8."""
    import transformers

    return transformers.Gemma2Config(
        vocab_size=len(tokenizer), hidden_size=GEMMA_WIDTH, intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        max_position_embeddings=GEMMA_POSITIONS, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        architectures=["Gemma2Model"], dtype="float32")


def transformer_config(**overrides) -> dict:
    """Every `SanaTransformer2DModel.__init__` argument (spec §4.3's tiny SANA)."""
    values = dict(
        in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS, num_attention_heads=2,
        attention_head_dim=8, num_layers=2, num_cross_attention_heads=2,
        cross_attention_head_dim=8, cross_attention_dim=16, caption_channels=GEMMA_WIDTH,
        mlp_ratio=2.5, dropout=0.0, attention_bias=False, sample_size=8, patch_size=1,
        norm_elementwise_affine=False, norm_eps=1e-6, interpolation_scale=None,
        guidance_embeds=False, guidance_embeds_scale=0.1, qk_norm="rms_norm_across_heads",
        timestep_scale=1.0)
    return tiny._diffusers_config("SanaTransformer2DModel", **{**values, **overrides})


def video_transformer_config(**overrides) -> dict:
    """Every `SanaVideoTransformer3DModel.__init__` argument (spec §4.3's tiny SANA-Video)."""
    values = dict(
        in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS, num_attention_heads=2,
        attention_head_dim=12, num_layers=2, num_cross_attention_heads=2,
        cross_attention_head_dim=12, cross_attention_dim=24, caption_channels=GEMMA_WIDTH,
        mlp_ratio=3.0, dropout=0.0, attention_bias=False, sample_size=4, patch_size=[1, 2, 2],
        norm_elementwise_affine=False, norm_eps=1e-6, interpolation_scale=None,
        guidance_embeds=False, guidance_embeds_scale=0.1, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32)
    return tiny._diffusers_config("SanaVideoTransformer3DModel", **{**values, **overrides})


def vae_config(**overrides) -> dict:
    """Every `AutoencoderDC.__init__` argument (spec §4.3: spatial factor 2, one ResBlock and
    one EfficientViT level, SANA's Conv down / interpolate up)."""
    values = dict(
        in_channels=3, latent_channels=LATENT_CHANNELS, attention_head_dim=2,
        encoder_block_types=["ResBlock", "EfficientViTBlock"],
        decoder_block_types=["ResBlock", "EfficientViTBlock"],
        encoder_block_out_channels=[8, 8], decoder_block_out_channels=[8, 8],
        encoder_layers_per_block=[1, 1], decoder_layers_per_block=[1, 1],
        encoder_qkv_multiscales=[[], [5]], decoder_qkv_multiscales=[[], [5]],
        upsample_block_type="interpolate", downsample_block_type="Conv",
        decoder_norm_types="rms_norm", decoder_act_fns="silu", encoder_out_shortcut=True,
        decoder_in_shortcut=True, decoder_conv_act_fn="relu",
        scaling_factor=DCAE_SCALING_FACTOR)
    return tiny._diffusers_config("AutoencoderDC", **{**values, **overrides})


def scheduler_config(flow_shift: float) -> dict:
    """Every `DPMSolverMultistepScheduler.__init__` argument as the SANA releases ship it
    (spec §1.3): DPM-Solver++ 2M midpoint, flow prediction on flow sigmas, final sigma zero."""
    return tiny._diffusers_config(
        "DPMSolverMultistepScheduler", num_train_timesteps=1000, beta_start=0.0001,
        beta_end=0.02, beta_schedule="linear", trained_betas=None, solver_order=2,
        prediction_type="flow_prediction", thresholding=False, dynamic_thresholding_ratio=0.995,
        sample_max_value=1.0, algorithm_type="dpmsolver++", solver_type="midpoint",
        lower_order_final=True, euler_at_final=False, use_karras_sigmas=False,
        use_exponential_sigmas=False, use_beta_sigmas=False, use_lu_lambdas=False,
        use_flow_sigmas=True, flow_shift=flow_shift, final_sigmas_type="zero",
        lambda_min_clipped=-float("inf"), variance_type=None, timestep_spacing="linspace",
        steps_offset=0, rescale_betas_zero_snr=False, use_dynamic_shifting=False,
        time_shift_type="exponential")


def model_index(video: bool) -> dict:
    models = VIDEO_MODELS if video else IMAGE_MODELS
    entries = {name: [lib, cls] for name, (lib, cls, _) in models.items()}
    entries.update({name: list(v) for name, v in OTHERS.items()})
    return tiny._diffusers_config("SanaVideoPipeline" if video else "SanaPipeline", **entries)


def write_pipeline(directory: str, seed: int = 0, *, video: bool = False,
                   transformer: dict | None = None, vae: dict | None = None, words=()) -> None:
    """Write every file of the pipeline into `directory` (non-atomic; see
    tiny.build_tiny_pipeline). transformer / vae: config overrides; words: one token each."""
    from converters.safetensors_io import save_checkpoint

    tok = gemma_tokenizer(words)
    tok.save_pretrained(os.path.join(directory, "tokenizer"))
    text_encoder_config(tok).save_pretrained(os.path.join(directory, "text_encoder"))
    if video:
        t_cfg = video_transformer_config(**(transformer or {}))
        v_cfg = tiny_wan.vae_config(**(vae or {}))
    else:
        t_cfg, v_cfg = transformer_config(**(transformer or {})), vae_config(**(vae or {}))
    tiny.write_json(t_cfg, os.path.join(directory, "transformer", "config.json"))
    tiny.write_json(v_cfg, os.path.join(directory, "vae", "config.json"))
    tiny.write_json(scheduler_config(VIDEO_SHIFT if video else IMAGE_SHIFT),
                    os.path.join(directory, "scheduler", "scheduler_config.json"))
    for name, (_, _, offset) in (VIDEO_MODELS if video else IMAGE_MODELS).items():
        with open(os.path.join(directory, name, "config.json")) as f:
            config = json.load(f)  # as written: exactly what every loader will see
        tensors, stem = tiny.random_weights(config, np.random.default_rng([seed, offset]))
        save_checkpoint(tensors, os.path.join(directory, name), stem=stem)
    tiny.write_json(model_index(video), os.path.join(directory, "model_index.json"))


def write_video_pipeline(directory: str, seed: int = 0, **kw) -> None:
    write_pipeline(directory, seed, video=True, **kw)
