"""Benchmark shapes: the real SD3.5-Medium workloads (gpu), a scaled-down copy (cpu), and a
smallest-possible copy for the test (tiny); the same three for Cosmos-Predict2.5-2B (cosmos_gpu,
cosmos_cpu, cosmos_tiny). Every workload of a suite reads its shapes from here; what differs
between model families (inputs, the forward call, the sampler grid, the decode, FLOP counts) is
in bench/families.py, chosen by `Suite.family`.
"""
from __future__ import annotations

import dataclasses

# the LoRA targets and Cosmos' sigma range live with the bench families (which read them);
# the released SD3.5-Medium shapes with the planner's (programs.released)
from wfm_jax.bench.families import (  # noqa: F401 -- the suites' names too
    COSMOS_LORA_TARGETS,
    COSMOS_SIGMAS,
    LORA_TARGETS,
    for_suite,
)
from wfm_jax.models.cosmos.transformer import COSMOS25_PREDICT_2B
from wfm_jax.models.wan.vae import WAN21_LATENTS_MEAN, WAN21_LATENTS_STD
from wfm_jax.programs.released import SD3_VAE, SD35_MEDIUM
from wfm_jax.programs.stats import CPU_COMPILE_ONLY

# Optimizer of each train workload (identical in both stacks): AdamW behind global-norm clipping.
# Full fine-tune: torch's AdamW defaults with a fine-tuning rate; LoRA: the SD3.5 NFT recipe.
OPTIM = {"full": dict(lr=1e-5, weight_decay=1e-2, betas=(0.9, 0.999), eps=1e-8, clip=1.0),
         "lora": dict(lr=3e-4, weight_decay=1e-4, betas=(0.9, 0.999), eps=1e-8, clip=1.0)}
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


# Cosmos-Predict2.5-2B's DiT as released (models/cosmos/transformer.py COSMOS25_PREDICT_2B): 28
# blocks of 16 heads x 128, adaLN-LoRA 256, crossattn_proj from the Reason1 embedding
# (28 x 3584 = 100,352 wide) to 1024. Its VAE: the Wan2.1 AutoencoderKLWan (diffusers defaults:
# base_dim 96, z 16, x4 time, x8 space), decoded in fp32 as the pipeline does.
COSMOS_2B = dict(COSMOS25_PREDICT_2B)
# Lists, not tuples: diffusers' AutoencoderKLWan concatenates them with lists.
WAN21_VAE = dict(base_dim=96, decoder_base_dim=None, z_dim=16, dim_mult=[1, 2, 4, 4],
                 num_res_blocks=2, attn_scales=[], temperal_downsample=[False, True, True],
                 dropout=0.0, latents_mean=list(WAN21_LATENTS_MEAN),
                 latents_std=list(WAN21_LATENTS_STD),
                 is_residual=False, in_channels=3, out_channels=3, patch_size=None,
                 scale_factor_temporal=4, scale_factor_spatial=8)
# Same structure (adaLN-LoRA, crossattn_proj, per-frame timesteps, RoPE), small for 2 cores.
COSMOS_CPU = dict(COSMOS_2B, num_attention_heads=4, attention_head_dim=32, num_layers=4,
                  text_embed_dim=128, encoder_hidden_states_channels=128, adaln_lora_dim=32,
                  crossattn_proj_in_channels=1024, max_size=(32, 64, 64))
COSMOS_CPU_VAE = dict(WAN21_VAE, base_dim=8, num_res_blocks=1)
# The spec's tiny twin (video_models.md §4.1, wfm_jax/tiny_cosmos.py) with the tiny Wan VAE.
COSMOS_TINY = dict(COSMOS_2B, in_channels=5, out_channels=4, num_attention_heads=2,
                   attention_head_dim=12, num_layers=2, mlp_ratio=2.0, text_embed_dim=16,
                   encoder_hidden_states_channels=16, adaln_lora_dim=8, max_size=(8, 32, 32),
                   crossattn_proj_in_channels=64)
COSMOS_TINY_VAE = dict(WAN21_VAE, base_dim=8, z_dim=4, num_res_blocks=1,
                       latents_mean=[-0.25, 0.1, 0.4, -0.05], latents_std=[1.6, 0.7, 1.1, 2.2])


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
    family: str = "sd3"  # a bench/families.py FAMILIES key
    frames: int = 1  # latent frames (video families; the video has 4 (frames - 1) + 1)
    # wfm_jax's blocks as one lax.scan (True) or unrolled (False) unless --scan-layers says;
    # None: the model class's default
    scan_layers: bool | None = None

    @property
    def workload(self):
        """The family's bench pieces (bench/families.py)."""
        return for_suite(self)

    @property
    def image_size(self) -> int:
        return self.workload.image_size(self)

    def shapes(self) -> dict:
        """What the JSON records about the workload shapes."""
        t = self.transformer
        return {"transformer": {k: list(v) if isinstance(v, tuple) else v for k, v in t.items()},
                **self.workload.vae_shape(self),
                "latent": list(self.workload.latent_shape(self, 1)[1:]),
                "image_size": self.image_size, "text_len": self.text_len,
                "train_batch": self.train_batch, "rollout_batch": self.rollout_batch,
                "rollout_steps": self.rollout_steps, "reward_batch": list(self.reward_shape),
                "lora_rank": self.lora_rank, "lora_alpha": self.lora_alpha,
                "fast_compile": self.fast_compile, **self.workload.extra_shapes(self)}

    @property
    def compiler_options(self) -> dict | None:
        return dict(CPU_COMPILE_ONLY) if self.fast_compile else None


SUITES = {
    # 512x512 images; 77 CLIP + 256 T5 tokens (diffusers' default max_sequence_length);
    # rollout batch 24 = one NFT group (rollout.n_generation). Train batch 4: the torch full
    # fine-tune (36 GB of fp32 weights, grads and AdamW state, bf16 autocast weight copies, no
    # gradient checkpointing) should fit an 80 GB H100; try --train-batch 8 on an H200.
    "gpu": Suite("gpu", SD35_MEDIUM, SD3_VAE, latent_size=64, text_len=333, train_batch=4,
                 rollout_batch=24, rollout_steps=10, reward_shape=(8, 512, 512, 3), lora_rank=32,
                 lora_alpha=64.0, warmup=2, repeats=10,
                 # unrolled, as configs/sd35_sft.py trains: on an H200 at batch 8, 186 ms and
                 # 50 GiB a step against 243 ms and 62 GiB scanned (docs/bench_notes.md)
                 scan_layers=False),
    "cpu": Suite("cpu", CPU_TRANSFORMER, CPU_VAE, latent_size=32, text_len=64, train_batch=2,
                 rollout_batch=4, rollout_steps=10, reward_shape=(8, 512, 512, 3), lora_rank=32,
                 lora_alpha=64.0, warmup=1, repeats=3),
    "tiny": Suite("tiny", TINY_TRANSFORMER, TINY_VAE, latent_size=8, text_len=8, train_batch=2,
                  rollout_batch=2, rollout_steps=10, reward_shape=(2, 32, 32, 3), lora_rank=4,
                  lora_alpha=8.0, warmup=0, repeats=1, fast_compile=True),
    # Cosmos-Predict2.5-2B, the NFT recipe's shape (configs/cosmos25_2b_nft.py): 93 frames at
    # 512^2 -> latent 16 x 24 x 64 x 64 -> 24 x 32 x 32 = 24,576 tokens; the Reason1 embedding
    # of 512 tokens; train batch 1 (per device); LoRA r 32, alpha 64 on the recipe's targets;
    # rollout: 10 deterministic DPM-Solver++(2M) steps on Cosmos' Karras flow sigmas, no CFG,
    # batch 4 (the recipe's mini_batch: one chunk per device), then the fp32 Wan VAE decode.
    "cosmos_gpu": Suite("cosmos_gpu", COSMOS_2B, WAN21_VAE, latent_size=64, text_len=512,
                        train_batch=1, rollout_batch=4, rollout_steps=10,
                        reward_shape=(8, 512, 512, 3), lora_rank=32, lora_alpha=64.0, warmup=1,
                        repeats=5, family="cosmos", frames=24),
    # 17 frames at 128^2 -> latent 16 x 5 x 16 x 16 -> 320 tokens; 64 text tokens, 1024 wide
    "cosmos_cpu": Suite("cosmos_cpu", COSMOS_CPU, COSMOS_CPU_VAE, latent_size=16, text_len=64,
                        train_batch=1, rollout_batch=1, rollout_steps=10,
                        reward_shape=(8, 128, 128, 3), lora_rank=32, lora_alpha=64.0, warmup=1,
                        repeats=3, family="cosmos", frames=5),
    # 9 frames at 32^2 -> latent 4 x 3 x 4 x 4 -> 12 tokens (the spec's tiny pipeline shape)
    "cosmos_tiny": Suite("cosmos_tiny", COSMOS_TINY, COSMOS_TINY_VAE, latent_size=4, text_len=8,
                         train_batch=2, rollout_batch=2, rollout_steps=4,
                         reward_shape=(2, 32, 32, 3), lora_rank=4, lora_alpha=8.0, warmup=0,
                         repeats=1, fast_compile=True, family="cosmos", frames=3),
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
    `timing.PROFILE_STEPS` steps, taken after the timed steps, under DIR/<workload>.
    scan_layers: wfm_jax's transformer blocks as one lax.scan (True) or unrolled (False); None
    keeps the suite's choice (Suite.scan_layers), else the model class's default (SD3: scanned,
    Cosmos: unrolled)."""
    attention: str = "auto"
    remat: str = "everything_saveable"
    torch_compile: bool = False
    profile: str | None = None  # wfm_jax: a jax.profiler trace of a few steps under this dir
    scan_layers: bool | None = None

    @property
    def attention_impl(self) -> str:
        return self.attention

    def scan_layers_for(self, suite: Suite) -> bool | None:
        """The scan choice a run of `suite` makes: this option's, else the suite's (None: the
        model class's default)."""
        return suite.scan_layers if self.scan_layers is None else self.scan_layers
