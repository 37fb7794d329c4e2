"""A complete tiny WanPipeline directory with random weights, built offline without torch.

    python -m wfm_jax.tiny --family wan DIR [--seed S] [--overwrite]

The Wan counterpart of wfm_jax.families.tiny (same recipe: configs written as the JSON diffusers /
transformers `save_pretrained` write, every weight drawn with numpy in the wfm_jax model's shape
and saved in the checkpoint layout its converter table gives, the tokenizer built from a small
unigram vocab, all of it under a temporary sibling renamed into place).

Sizes follow spec video_models.md §4.2, widened a little: 9 frames of 32x32 pixels encode to
latents (4, 3, 4, 4) and patch (1, 2, 2) into 12 tokens of width 32, so one train step on 2 CPU
cores is quick. head_dim 16 gives RoPE widths t/h/w = 8/4/4 (every axis rotates).
"""
from __future__ import annotations

import json
import os

import numpy as np

from wfm_jax.families import tiny

UMT5_WIDTH = 16      # = the transformer's text_dim
LATENT_CHANNELS = 4  # VAE z_dim = the transformer's in/out channels
# Per-channel latent statistics, not the identity, so the (z - mean) / std path is exercised
# (the released VAE carries 16 such values).
LATENTS_MEAN = [-0.25, 0.1, 0.4, -0.05]
LATENTS_STD = [1.6, 0.7, 1.1, 2.2]
FLOW_SHIFT = 3.0     # Wan2.1 T2V's UniPC flow_shift (spec §1.2: diffusers' Wan docs, maxdiffusion)
FRAMES, HEIGHT, WIDTH = 9, 32, 32  # what the tests and the tiny recipes run at (4k + 1 frames)

# component -> (library, class) as the released Wan2.1-T2V-1.3B-Diffusers model_index.json names
# them; the offset seeds its weights
MODELS = {
    "text_encoder": ("transformers", "UMT5EncoderModel", 1),
    "transformer": ("diffusers", "WanTransformer3DModel", 2),
    "vae": ("diffusers", "AutoencoderKLWan", 3),
}
OTHERS = {
    "scheduler": ("diffusers", "UniPCMultistepScheduler"),
    # transformers 5's T5TokenizerFast is T5Tokenizer; the release names the fast class
    "tokenizer": ("transformers", "T5TokenizerFast"),
}


def transformer_config(**overrides) -> dict:
    """Every `WanTransformer3DModel.__init__` argument, as diffusers' save_pretrained lists them."""
    values = dict(
        patch_size=[1, 2, 2], num_attention_heads=2, attention_head_dim=16,
        in_channels=LATENT_CHANNELS, out_channels=LATENT_CHANNELS, text_dim=UMT5_WIDTH,
        freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None,
        rope_max_seq_len=32, pos_embed_seq_len=None)
    return tiny._diffusers_config("WanTransformer3DModel", **{**values, **overrides})


def vae_config(**overrides) -> dict:
    """Every `AutoencoderKLWan.__init__` argument: the Wan2.1 structure (x4 time, x8 space,
    causal chunks) at base_dim 8, one residual block per level."""
    values = dict(
        base_dim=8, decoder_base_dim=None, z_dim=LATENT_CHANNELS, dim_mult=[1, 2, 4, 4],
        num_res_blocks=1, attn_scales=[], temperal_downsample=[False, True, True], dropout=0.0,
        latents_mean=LATENTS_MEAN, latents_std=LATENTS_STD, is_residual=False, in_channels=3,
        out_channels=3, patch_size=None, scale_factor_temporal=4, scale_factor_spatial=8)
    return tiny._diffusers_config("AutoencoderKLWan", **{**values, **overrides})


def scheduler_config() -> dict:
    """Every `UniPCMultistepScheduler.__init__` argument, set as Wan2.1 T2V ships it (spec §1.2,
    §2.7): flow prediction on flow sigmas shifted by 3, order 2, bh2, final sigma zero."""
    return tiny._diffusers_config(
        "UniPCMultistepScheduler", num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02,
        beta_schedule="linear", trained_betas=None, solver_order=2,
        prediction_type="flow_prediction", thresholding=False, dynamic_thresholding_ratio=0.995,
        sample_max_value=1.0, predict_x0=True, solver_type="bh2", lower_order_final=True,
        disable_corrector=[], solver_p=None, use_karras_sigmas=False,
        use_exponential_sigmas=False, use_beta_sigmas=False, use_flow_sigmas=True,
        flow_shift=FLOW_SHIFT, timestep_spacing="linspace", steps_offset=0,
        final_sigmas_type="zero", rescale_betas_zero_snr=False, use_dynamic_shifting=False,
        time_shift_type="exponential", sigma_min=None, sigma_max=None, shift_terminal=None)


def text_encoder_config(tokenizer):
    """transformers UMT5Config (torch-free) matched to `tokenizer`: two layers, each with its own
    relative-position bias (what distinguishes UMT5 from T5), gated GELU as umt5-xxl."""
    import transformers

    return transformers.UMT5Config(
        vocab_size=len(tokenizer), d_model=UMT5_WIDTH, d_kv=8, d_ff=32, num_layers=2,
        num_heads=2, relative_attention_num_buckets=8, relative_attention_max_distance=16,
        feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id, architectures=["UMT5EncoderModel"],
        dtype="float32")


def model_index() -> dict:
    """As diffusers 0.42 saves a WanPipeline: the optional second expert absent, no boundary."""
    entries = {name: [lib, cls] for name, (lib, cls, _) in MODELS.items()}
    entries.update({name: list(v) for name, v in OTHERS.items()})
    entries.update(transformer_2=[None, None], boundary_ratio=None, expand_timesteps=False)
    return tiny._diffusers_config("WanPipeline", **entries)


def write_pipeline(directory: str, seed: int = 0, *, transformer: dict | None = None,
                   vae: dict | None = None, words=()) -> None:
    """Write every file of the pipeline into `directory` (non-atomic; see build_tiny_pipeline).
    transformer / vae: config overrides; words: kept whole by the tokenizer."""
    from converters.safetensors_io import save_checkpoint

    tok = tiny.t5_tokenizer(words)
    tok.save_pretrained(os.path.join(directory, "tokenizer"))
    text_encoder_config(tok).save_pretrained(os.path.join(directory, "text_encoder"))
    tiny.write_json(transformer_config(**(transformer or {})),
                    os.path.join(directory, "transformer", "config.json"))
    tiny.write_json(vae_config(**(vae or {})), os.path.join(directory, "vae", "config.json"))
    tiny.write_json(scheduler_config(),
                    os.path.join(directory, "scheduler", "scheduler_config.json"))
    for name, (_, _, offset) in MODELS.items():
        with open(os.path.join(directory, name, "config.json")) as f:
            config = json.load(f)  # as written: exactly what every loader will see
        tensors, stem = tiny.random_weights(config, np.random.default_rng([seed, offset]))
        save_checkpoint(tensors, os.path.join(directory, name), stem=stem)
    tiny.write_json(model_index(), os.path.join(directory, "model_index.json"))
