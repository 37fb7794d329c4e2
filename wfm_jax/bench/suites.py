"""Benchmark shapes: the real SD3.5-Medium workloads (gpu), a scaled-down copy (cpu), and a
smallest-possible copy for the test (tiny). Every workload of a suite reads its shapes from here.
"""
from __future__ import annotations

import dataclasses

# Optimizer of each train workload (identical in both stacks): AdamW behind global-norm clipping.
# Full fine-tune: torch's AdamW defaults with a fine-tuning rate; LoRA: the SD3.5 NFT recipe.
OPTIM = {"full": dict(lr=1e-5, weight_decay=1e-2, betas=(0.9, 0.999), eps=1e-8, clip=1.0),
         "lora": dict(lr=3e-4, weight_decay=1e-4, betas=(0.9, 0.999), eps=1e-8, clip=1.0)}
# = wfm_jax.config_schema.SD3_LORA_TARGETS (not imported: it needs ml_collections, which GPU
# machines lack; tests/test_bench.py checks the two agree).
LORA_TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out")

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

# Same family (MMDiT-X, qk RMS-norm, dual attention in the first half), small enough for 2 cores.
CPU_TRANSFORMER = dict(SD35_MEDIUM, sample_size=32, num_layers=4, attention_head_dim=64,
                       num_attention_heads=4, joint_attention_dim=256, caption_projection_dim=256,
                       pooled_projection_dim=256, pos_embed_max_size=64,
                       dual_attention_layers=(0, 1))
CPU_VAE = dict(SD3_VAE, down_block_types=("DownEncoderBlock2D",) * 2,
               up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(32, 64),
               layers_per_block=1, norm_num_groups=8, sample_size=64)

TINY_TRANSFORMER = dict(CPU_TRANSFORMER, sample_size=8, num_layers=2, attention_head_dim=8,
                        num_attention_heads=2, joint_attention_dim=16, caption_projection_dim=16,
                        pooled_projection_dim=8, pos_embed_max_size=16, dual_attention_layers=(0,))
TINY_VAE = dict(SD3_VAE, down_block_types=("DownEncoderBlock2D",),
                up_block_types=("UpDecoderBlock2D",), block_out_channels=(8,), layers_per_block=1,
                norm_num_groups=4, sample_size=8)


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    transformer: dict
    vae: dict
    latent_size: int  # latent grid side (image side / 8 for the SD3 VAE)
    text_len: int  # prompt tokens: 77 CLIP + max_prompt_length T5 in the real pipeline
    train_batch: int
    rollout_batch: int
    rollout_steps: int
    reward_shape: tuple  # uint8 image batch (B, H, W, 3)
    lora_rank: int
    lora_alpha: float
    warmup: int  # untimed calls after the first (compiling) call
    repeats: int  # timed calls; the figure is their median
    # XLA backend optimisation level 0 (halves CPU compile time): only for the test's tiny
    # suite, whose figures are never read; recorded in the JSON.
    fast_compile: bool = False

    @property
    def image_size(self) -> int:
        return self.latent_size * 2 ** (len(self.vae["block_out_channels"]) - 1)

    def shapes(self) -> dict:
        """What the JSON records about the workload shapes."""
        t = self.transformer
        return {"transformer": {k: list(v) if isinstance(v, tuple) else v for k, v in t.items()},
                "vae_block_out_channels": list(self.vae["block_out_channels"]),
                "latent": [t["in_channels"], self.latent_size, self.latent_size],
                "image_size": self.image_size, "text_len": self.text_len,
                "train_batch": self.train_batch, "rollout_batch": self.rollout_batch,
                "rollout_steps": self.rollout_steps, "reward_batch": list(self.reward_shape),
                "lora_rank": self.lora_rank, "lora_alpha": self.lora_alpha,
                "fast_compile": self.fast_compile}

    @property
    def compiler_options(self) -> dict | None:
        return {"xla_backend_optimization_level": 0} if self.fast_compile else None


SUITES = {
    # 512x512 images; 77 CLIP + 256 T5 tokens (diffusers' default max_sequence_length);
    # rollout batch 24 = one NFT group (rollout.n_generation). Train batch 4: the torch full
    # fine-tune (36 GB of fp32 weights, grads and AdamW state, bf16 autocast weight copies, no
    # gradient checkpointing) should fit an 80 GB H100; try --train-batch 8 on an H200.
    "gpu": Suite("gpu", SD35_MEDIUM, SD3_VAE, latent_size=64, text_len=333, train_batch=4,
                 rollout_batch=24, rollout_steps=10, reward_shape=(8, 512, 512, 3), lora_rank=32,
                 lora_alpha=64.0, warmup=2, repeats=10),
    "cpu": Suite("cpu", CPU_TRANSFORMER, CPU_VAE, latent_size=32, text_len=64, train_batch=2,
                 rollout_batch=4, rollout_steps=10, reward_shape=(8, 512, 512, 3), lora_rank=32,
                 lora_alpha=64.0, warmup=1, repeats=3),
    "tiny": Suite("tiny", TINY_TRANSFORMER, TINY_VAE, latent_size=8, text_len=8, train_batch=2,
                  rollout_batch=2, rollout_steps=10, reward_shape=(2, 32, 32, 3), lora_rank=4,
                  lora_alpha=8.0, warmup=0, repeats=1, fast_compile=True),
}


def get_suite(name: str, **overrides) -> Suite:
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; choose one of {sorted(SUITES)}")
    suite = SUITES[name]
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(suite, **overrides) if overrides else suite


@dataclasses.dataclass(frozen=True)
class Options:
    """How the stacks run (recorded in the JSON). attention: "auto" = cuDNN flash attention on an
    NVIDIA GPU where it applies, XLA elsewhere (wfm_jax.models.layers.attention.
    resolve_attention_impl; the record's `attention_impl` says which ran), or "xla" / "cudnn". remat: wfm_jax block
    rematerialisation; anything but "none" also turns on diffusers' gradient checkpointing.
    torch_compile: torch.compile the transformer (default eager, as diffusers scripts run).
    profile: a directory; each wfm_jax workload writes a jax.profiler trace of
    `timing.PROFILE_STEPS` steps, taken after the timed steps, under DIR/<workload>."""
    attention: str = "auto"
    remat: str = "none"
    torch_compile: bool = False
    profile: str | None = None  # wfm_jax: a jax.profiler trace of a few steps under this dir

    @property
    def attention_impl(self) -> str:
        return self.attention
