"""The released pipelines' component configs, for planning a recipe whose model dir is not on
disk: config.json values only (no weights), keyed by the recipe's policy.family (the conditioning
shapes are the family's own: PipelineFamily.cond_shapes).

The planner (through programs.abstract) and the benchmark's suites read their released shapes
here; every step they compile goes through the family interface.
"""
from __future__ import annotations

from wfm_jax.programs.setup import SetupError

# stabilityai/stable-diffusion-3.5-medium transformer/config.json (MMDiT-X): 24 blocks of
# 24 heads x 64, dual attention in blocks 0..12, qk RMS-norm, 384x384 position table.
SD35_MEDIUM = dict(sample_size=128, patch_size=2, in_channels=16, num_layers=24,
                   attention_head_dim=64, num_attention_heads=24, joint_attention_dim=4096,
                   caption_projection_dim=1536, pooled_projection_dim=2048, out_channels=16,
                   pos_embed_max_size=384, dual_attention_layers=tuple(range(13)),
                   qk_norm="rms_norm")

# The SD3 / SD3.5 VAE (vae/config.json): 16 latent channels, x8 down-sampling, no quant convs.
SD3_VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
               up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512),
               layers_per_block=2, act_fn="silu", latent_channels=16, norm_num_groups=32,
               sample_size=1024, scaling_factor=1.5305, shift_factor=0.0609,
               use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=True)

# stabilityai/stable-diffusion-3.5-medium text encoders (config.json fields that size them)
CLIP_L = dict(architectures=["CLIPTextModelWithProjection"], hidden_size=768,
              intermediate_size=3072, projection_dim=768, num_hidden_layers=12,
              num_attention_heads=12)
CLIP_G = dict(architectures=["CLIPTextModelWithProjection"], hidden_size=1280,
              intermediate_size=5120, projection_dim=1280, num_hidden_layers=32,
              num_attention_heads=20, hidden_act="gelu")
T5_XXL = dict(architectures=["T5EncoderModel"], d_model=4096, d_kv=64, d_ff=10240, num_layers=24,
              num_heads=64, feed_forward_proj="gated-gelu")
# Wan2.1's umt5-xxl encoder
UMT5_XXL = dict(T5_XXL, architectures=["UMT5EncoderModel"], vocab_size=256384)
# Cosmos-Predict2.5's Qwen2.5-VL-7B (Cosmos-Reason1) text tower; vision tower never run
QWEN25_VL_7B = dict(
    architectures=["Qwen2_5_VLForConditionalGeneration"], model_type="qwen2_5_vl",
    tie_word_embeddings=False,
    text_config=dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                     num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                     max_position_embeddings=128000, rms_norm_eps=1e-6,
                     rope_parameters=dict(rope_type="default", rope_theta=1e6,
                                          mrope_section=[16, 24, 24])),
    vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                       out_hidden_size=3584, patch_size=14, temporal_patch_size=2,
                       spatial_merge_size=2))
# SANA's gemma-2-2b-it
GEMMA2_2B = dict(architectures=["Gemma2Model"], vocab_size=256000, hidden_size=2304,
                 intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
                 num_key_value_heads=4, head_dim=256, max_position_embeddings=8192)
# Wan2.1 VAE (Wan, Cosmos-Predict2.5 and SANA-Video ship it): base 96, 16 latent channels
WAN_VAE = dict(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
               latents_mean=[0.0] * 16, latents_std=[1.0] * 16)
# mit-han-lab dc-ae-f32c32-sana-1.1-diffusers
DCAE_F32C32 = dict(
    latent_channels=32, attention_head_dim=32,
    encoder_block_types=["ResBlock"] * 3 + ["EfficientViTBlock"] * 3,
    decoder_block_types=["ResBlock"] * 3 + ["EfficientViTBlock"] * 3,
    encoder_block_out_channels=[128, 256, 512, 512, 1024, 1024],
    decoder_block_out_channels=[128, 256, 512, 512, 1024, 1024],
    encoder_layers_per_block=[2, 2, 2, 3, 3, 3], decoder_layers_per_block=[3, 3, 3, 3, 3, 3],
    encoder_qkv_multiscales=[[], [], [], [5], [5], [5]],
    decoder_qkv_multiscales=[[], [], [], [5], [5], [5]])

# Qwen3-VL-2B / -8B-Instruct config.json (nvidia/Cosmos-Reason2-2B / -8B post-train them; same
# architecture; specs/reason2.md §1.4). The VLM planner's shapes when the model dir is not on disk.
_QWEN3_VL_COMMON = dict(
    model_type="qwen3_vl", architectures=["Qwen3VLForConditionalGeneration"],
    image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
    vision_end_token_id=151653)
_QWEN3_VL_TEXT = dict(vocab_size=151936, head_dim=128, num_key_value_heads=8, hidden_act="silu",
                      rms_norm_eps=1e-6, max_position_embeddings=262144, attention_bias=False,
                      rope_parameters=dict(rope_type="default", rope_theta=5e6,
                                           mrope_section=[24, 20, 20], mrope_interleaved=True),
                      bos_token_id=151643, eos_token_id=151645)
_QWEN3_VL_VISION = dict(patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                        num_position_embeddings=2304, num_heads=16, in_channels=3,
                        hidden_act="gelu_pytorch_tanh")
QWEN3_VL_2B = dict(
    _QWEN3_VL_COMMON, tie_word_embeddings=True,
    text_config=dict(_QWEN3_VL_TEXT, num_hidden_layers=28, hidden_size=2048, intermediate_size=6144,
                     num_attention_heads=16),
    vision_config=dict(_QWEN3_VL_VISION, depth=24, hidden_size=1024, intermediate_size=4096,
                       out_hidden_size=2048, deepstack_visual_indexes=[5, 11, 17]))
QWEN3_VL_8B = dict(
    _QWEN3_VL_COMMON, tie_word_embeddings=False,
    text_config=dict(_QWEN3_VL_TEXT, num_hidden_layers=36, hidden_size=4096,
                     intermediate_size=12288, num_attention_heads=32),
    vision_config=dict(_QWEN3_VL_VISION, depth=27, hidden_size=1152, intermediate_size=4304,
                       out_hidden_size=4096, deepstack_visual_indexes=[8, 16, 24]))


def _sd3():
    from wfm_jax.families import tiny
    return dict(transformer=tiny.transformer_config(**SD35_MEDIUM),
                vae=tiny.vae_config(**SD3_VAE), scheduler=tiny.scheduler_config(),
                text_encoders=[CLIP_L, CLIP_G, T5_XXL])


def _wan():
    from wfm_jax.families.wan import tiny as tiny_wan
    from wfm_jax.models.wan.transformer import WAN21_T2V_1_3B
    return dict(transformer=tiny_wan.transformer_config(**WAN21_T2V_1_3B),
                vae=tiny_wan.vae_config(**WAN_VAE), scheduler=tiny_wan.scheduler_config(),
                text_encoders=[UMT5_XXL])


def _cosmos(name: str):
    from wfm_jax.families.cosmos import tiny as tiny_cosmos
    from wfm_jax.families.wan import tiny as tiny_wan
    from wfm_jax.models.cosmos import transformer as t
    shape = t.COSMOS25_PREDICT_14B if "14B" in name else t.COSMOS25_PREDICT_2B
    return dict(transformer=tiny_cosmos.transformer_config(**shape),
                vae=tiny_wan.vae_config(**WAN_VAE), scheduler=tiny_cosmos.scheduler_config(),
                text_encoders=[QWEN25_VL_7B])


def _sana():
    from wfm_jax.families.sana import tiny as tiny_sana
    from wfm_jax.models.sana.transformer import SANA15_1600M
    return dict(transformer=tiny_sana.transformer_config(**SANA15_1600M),
                vae=tiny_sana.vae_config(**DCAE_F32C32),
                scheduler=tiny_sana.scheduler_config(tiny_sana.IMAGE_SHIFT),
                text_encoders=[GEMMA2_2B])


def _sana_video():
    from wfm_jax.families.sana import tiny as tiny_sana
    from wfm_jax.families.wan import tiny as tiny_wan
    from wfm_jax.models.sana.video import SANA_VIDEO_2B
    return dict(transformer=tiny_sana.video_transformer_config(**SANA_VIDEO_2B),
                vae=tiny_wan.vae_config(**WAN_VAE),
                scheduler=tiny_sana.scheduler_config(tiny_sana.VIDEO_SHIFT),
                text_encoders=[GEMMA2_2B])


_RELEASED = {"sd3": lambda name: _sd3(), "wan": lambda name: _wan(), "cosmos": _cosmos,
             "sana": lambda name: _sana(), "sana_video": lambda name: _sana_video()}


def released_configs(family: str, model_name: str) -> dict:
    """{transformer, vae, scheduler: config dicts; text_encoders: [config dicts]} of the family's
    released pipeline (model_name picks among sizes: Cosmos 2B / 14B)."""
    if family not in _RELEASED:
        raise SetupError(f"no released shape for policy.family={family!r}; "
                         f"put the model dir on disk (its config.json files are enough)")
    return _RELEASED[family](str(model_name))


def released_vlm_config(model_name: str) -> dict:
    """The released Qwen3-VL config.json a VLM recipe names: 8B when its model name says 8B,
    else 2B (Cosmos-Reason2 comes in those two sizes)."""
    return dict(QWEN3_VL_8B if "8b" in str(model_name).lower() else QWEN3_VL_2B)
