"""What a benchmark workload needs from its model family, in one place per family.

A workload is (family, transformer config, latent shape incl. frames, text shape, batches,
rollout steps, LoRA targets): the `Suite` holds the numbers, a `BenchFamily` here turns them into
inputs, the forward call of each stack, the sampler's sigma grid, the decode and the analytic
FLOP counts. The trainers, samplers and runners of wfm_jax.bench call only these methods; no
other bench module branches on the family. The wfm_jax side goes through the model family's own
code where it has one (Cosmos: `CosmosPipeline.velocity_with` / `decode_with`, its Karras sigmas),
the torch side through the diffusers classes named here.
"""
from __future__ import annotations

import numpy as np

# = wfm_jax.config.schema.SD3_LORA_TARGETS (not imported: it needs ml_collections, which GPU
# machines lack; tests/bench/test_bench.py checks the two agree).
LORA_TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out")
# = wfm_jax.config.schema.COSMOS_LORA_TARGETS (configs/cosmos25_2b_nft.py: attn1 and attn2, the
# MLP; crossattn_proj frozen).
COSMOS_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2")

# Cosmos' scheduler (Cosmos2_5_PredictBasePipeline's UniPC on Karras sigmas, flow-mapped).
COSMOS_SIGMAS = dict(sigma_min=0.01, sigma_max=200.0)


class BenchFamily:
    name: str
    transformer_class: str  # diffusers class of the transformer (bench/weights.py builds both)
    vae_class: str
    lora_targets: tuple
    vae_fp32: bool = False  # decode in fp32 (the pipeline's choice) rather than bf16
    sampler_name: str

    # ---------------------------------------------------------------- shapes and inputs
    def latent_shape(self, suite, batch: int) -> tuple:
        raise NotImplementedError

    def text_inputs(self, suite, batch: int, rng) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def image_size(self, suite) -> int:
        raise NotImplementedError

    def vae_shape(self, suite) -> dict:
        raise NotImplementedError

    def extra_shapes(self, suite) -> dict:
        return {}

    def tokens(self, suite) -> int:
        """Length of the longest attention the transformer runs (picks the "auto" kernel)."""
        raise NotImplementedError

    def attention_module(self, transformer):
        """An attention layer of the model (its attention_impl / head_dim)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- each stack
    def jax_velocity(self, suite, model, x_t, batch):
        """wfm_jax forward of a train step: batch holds train_batch's arrays (timesteps are
        1000 sigma)."""
        raise NotImplementedError

    def rollout_sigmas(self, suite) -> np.ndarray:
        """(steps + 1,) flow sigmas ending in 0 that both stacks' rollouts step on."""
        raise NotImplementedError

    def scheduler_config(self, suite) -> dict:
        """The family scheduler's config (its shift, sigma range)."""
        raise NotImplementedError

    def pipeline(self, suite):
        """A weightless pipeline of the model family (programs.abstract.family_shell): its
        *_with methods read only configs; the train step is the family's own SFT step."""
        from wfm_jax.families.base import family_named
        return family_named(self.name).weightless({
            "transformer": dict(suite.transformer, _class_name=self.transformer_class),
            "vae": dict(suite.vae, _class_name=self.vae_class),
            "scheduler": self.scheduler_config(suite)})

    def train_sigma_table(self, suite) -> tuple[np.ndarray, np.ndarray]:
        """(timesteps, sigmas) the train step's sigmas are drawn from, as the model family's
        own SFT draws them (PipelineFamily.train_sigma_table: SD3's shifted table, Cosmos' own
        range)."""
        pipe = self.pipeline(suite)
        return pipe.train_sigma_table(pipe.shift)

    def jax_rollout_velocity(self, transformer, suite):
        """velocity(x, timesteps, cond) for sampling.samplers.sample."""
        raise NotImplementedError

    def jax_decode(self, vae, suite, latents):
        raise NotImplementedError

    def torch_freeze(self, model) -> None:
        """Mark what a full fine-tune does not train (as wfm_jax's TRAINABLE_FULL)."""
        raise NotImplementedError

    def torch_velocity(self, model, x_t, b, sigmas, timesteps):
        """The diffusers forward as the family's pipeline calls it."""
        raise NotImplementedError

    def torch_decode(self, vae, suite, latents):
        """Latents -> pixels in [0, 1], laid out as jax_decode returns them."""
        raise NotImplementedError

    # ---------------------------------------------------------------- analytic FLOPs
    def forward_flops(self, suite) -> dict:
        raise NotImplementedError

    def train_flops(self, suite, lora: bool, remat: str = "everything_saveable") -> dict:
        raise NotImplementedError

    def rollout_flops(self, suite) -> dict:
        raise NotImplementedError


class SD3(BenchFamily):
    """SD3 / SD3.5 MMDiT + AutoencoderKL; the SD3 flow grid at shift 3."""
    name = "sd3"
    transformer_class, vae_class = "SD3Transformer2DModel", "AutoencoderKL"
    lora_targets = LORA_TARGETS
    sampler_name = "DPM-Solver++(2M) on the SD3 flow grid (shift 3)"

    def latent_shape(self, suite, batch):
        s = suite.latent_size
        return (batch, suite.transformer["in_channels"], s, s)

    def text_inputs(self, suite, batch, rng):
        cfg = suite.transformer
        return {"prompt_embeds": rng.standard_normal(
                    (batch, suite.text_len, cfg["joint_attention_dim"]), dtype=np.float32),
                "pooled_projections": rng.standard_normal(
                    (batch, cfg["pooled_projection_dim"]), dtype=np.float32)}

    def image_size(self, suite):
        return suite.latent_size * 2 ** (len(suite.vae["block_out_channels"]) - 1)

    def vae_shape(self, suite):
        return {"vae_block_out_channels": list(suite.vae["block_out_channels"])}

    def tokens(self, suite):
        p = suite.transformer["patch_size"]
        return (suite.latent_size // p) ** 2 + suite.text_len

    def attention_module(self, transformer):
        return transformer.transformer_blocks[0].attn

    # ---------------------------------------------------------------- wfm_jax
    def scheduler_config(self, suite) -> dict:
        from wfm_jax.families.tiny import scheduler_config
        return scheduler_config()  # FlowMatchEulerDiscreteScheduler at shift 3 (inputs.SHIFT)

    def jax_velocity(self, suite, model, x_t, batch):
        return model(x_t, batch["prompt_embeds"], batch["pooled_projections"], batch["timesteps"])

    def rollout_sigmas(self, suite) -> np.ndarray:
        from wfm_jax.bench.inputs import SHIFT
        from wfm_jax.sampling.schedule import flow_sigmas
        return flow_sigmas(suite.rollout_steps, SHIFT)[0]

    def jax_rollout_velocity(self, transformer, suite):
        def velocity(x, timesteps, cond):
            return transformer(x, cond["prompt_embeds"], cond["pooled_projections"], timesteps)
        return velocity

    def jax_decode(self, vae, suite, latents):
        from wfm_jax.families.sd3.pipeline import decode_latents
        return decode_latents(vae, suite.vae, latents)

    # ---------------------------------------------------------------- torch
    def torch_freeze(self, model) -> None:
        model.pos_embed.pos_embed.requires_grad_(False)  # a buffer already; kept explicit

    def torch_velocity(self, model, x_t, b, sigmas, timesteps):
        return model(hidden_states=x_t, encoder_hidden_states=b["prompt_embeds"],
                     pooled_projections=b["pooled_projections"], timestep=timesteps,
                     return_dict=False)[0]

    def torch_decode(self, vae, suite, latents):
        import torch
        scale, shift = suite.vae["scaling_factor"], suite.vae["shift_factor"]
        image = vae.decode((latents / scale + shift).to(torch.bfloat16), return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)

    # ---------------------------------------------------------------- FLOPs
    def forward_flops(self, suite) -> dict:
        from wfm_jax.bench import flops
        s = suite.latent_size
        return flops.mmdit_forward(suite.transformer, s, s, suite.text_len)

    def train_flops(self, suite, lora: bool, remat: str = "everything_saveable") -> dict:
        from wfm_jax.bench import flops
        s = suite.latent_size
        return flops.train_step(suite.transformer, suite.train_batch, s, s, suite.text_len,
                                lora_targets_=self.lora_targets if lora else None,
                                lora_rank=suite.lora_rank, remat=remat)

    def rollout_flops(self, suite) -> dict:
        from wfm_jax.bench import flops
        s = suite.latent_size
        return flops.rollout(suite.transformer, suite.vae, suite.rollout_batch,
                             suite.rollout_steps, s, s, suite.text_len)


class Cosmos(BenchFamily):
    """Cosmos-Predict2.5 DiT + Wan2.1 VAE, text2world (zero condition mask), through
    wfm_jax's CosmosPipeline family: 1000 sigma in, sigma per latent frame to the DiT."""
    name = "cosmos"
    transformer_class, vae_class = "CosmosTransformer3DModel", "AutoencoderKLWan"
    lora_targets = COSMOS_LORA_TARGETS
    vae_fp32 = True  # Cosmos2_5_PredictBasePipeline keeps the VAE in fp32
    sampler_name = "DPM-Solver++(2M) on Cosmos' Karras flow sigmas"

    def _cfg(self, suite):
        from wfm_jax.models.cosmos.transformer import cosmos_config
        return cosmos_config(suite.transformer)

    def latent_shape(self, suite, batch):
        s = suite.latent_size
        return (batch, suite.transformer["out_channels"], suite.frames, s, s)

    def text_width(self, suite) -> int:
        cfg = self._cfg(suite)
        return int(cfg["crossattn_proj_in_channels"] if cfg["use_crossattn_projection"]
                   else cfg["text_embed_dim"])

    def text_inputs(self, suite, batch, rng):
        return {"encoder_hidden_states": rng.standard_normal(
            (batch, suite.text_len, self.text_width(suite)), dtype=np.float32)}

    def image_size(self, suite):
        return suite.latent_size * suite.vae.get("scale_factor_spatial", 8)

    def video_frames(self, suite) -> int:
        return suite.vae.get("scale_factor_temporal", 4) * (suite.frames - 1) + 1

    def vae_shape(self, suite):
        return {"vae_base_dim": suite.vae["base_dim"], "vae_dim_mult": list(suite.vae["dim_mult"])}

    def extra_shapes(self, suite):
        return {"family": self.name, "video_frames": self.video_frames(suite),
                "latent_frames": suite.frames, "tokens": self.tokens(suite),
                "text_width": self.text_width(suite), "lora_targets": list(self.lora_targets)}

    def tokens(self, suite):
        pt, ph, pw = self._cfg(suite)["patch_size"]
        s = suite.latent_size
        return (suite.frames // pt) * (s // ph) * (s // pw)

    def attention_module(self, transformer):
        return transformer.transformer_blocks[0].attn1

    # ---------------------------------------------------------------- wfm_jax
    def scheduler_config(self, suite) -> dict:
        return dict(COSMOS_SIGMAS, use_karras_sigmas=True, use_flow_sigmas=True,
                    final_sigmas_type="zero")

    def jax_velocity(self, suite, model, x_t, batch):
        cond = {"encoder_hidden_states": batch["encoder_hidden_states"]}
        return self.pipeline(suite).velocity_with(model, x_t, batch["timesteps"], cond)

    def rollout_sigmas(self, suite) -> np.ndarray:
        """The family's own sampler grid (the NFT recipe's rollouts step on it)."""
        return self.pipeline(suite).flow_schedule(suite.rollout_steps, "dpm2")[0]

    def jax_rollout_velocity(self, transformer, suite):
        pipe = self.pipeline(suite)

        def velocity(x, timesteps, cond):
            return pipe.velocity_with(transformer, x, timesteps, cond)
        return velocity

    def jax_decode(self, vae, suite, latents):
        return self.pipeline(suite).decode_with(vae, latents)

    # ---------------------------------------------------------------- torch
    def torch_freeze(self, model) -> None:
        pass  # every CosmosTransformer3DModel parameter trains in a full fine-tune

    def torch_velocity(self, model, x_t, b, sigmas, timesteps):
        """diffusers' call as Cosmos2_5_PredictBasePipeline makes it in text2world: sigma per
        latent frame, a zero condition mask, a zero padding mask."""
        import torch
        _torchvision_shim()
        n, _, t, h, w = x_t.shape
        frame_t = sigmas.reshape(n, 1, 1, 1, 1).expand(n, 1, t, 1, 1).to(x_t.dtype)
        mask = torch.zeros((n, 1, t, h, w), dtype=x_t.dtype, device=x_t.device)
        pad = torch.zeros((1, 1, h, w), dtype=x_t.dtype, device=x_t.device)
        return model(hidden_states=x_t, timestep=frame_t,
                     encoder_hidden_states=b["encoder_hidden_states"], condition_mask=mask,
                     padding_mask=pad, return_dict=False)[0]

    def torch_decode(self, vae, suite, latents):
        import torch
        c = latents.shape[1]
        mean = torch.tensor(suite.vae["latents_mean"], dtype=torch.float32,
                            device=latents.device).view(1, c, 1, 1, 1)
        std = torch.tensor(suite.vae["latents_std"], dtype=torch.float32,
                           device=latents.device).view(1, c, 1, 1, 1)
        video = vae.decode(latents.float() * std + mean, return_dict=False)[0]
        # (B, 3, F, H, W) -> (B, F, H, W, 3) in [0, 1], as the wfm_jax decode returns it
        return (video.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 4, 1)

    # ---------------------------------------------------------------- FLOPs
    def forward_flops(self, suite) -> dict:
        from wfm_jax.bench import flops
        s = suite.latent_size
        return flops.cosmos_forward(suite.transformer, suite.frames, s, s, suite.text_len)

    def train_flops(self, suite, lora: bool, remat: str = "everything_saveable") -> dict:
        from wfm_jax.bench import flops
        s = suite.latent_size
        fwd = self.forward_flops(suite)
        adapters = (flops.cosmos_lora_forward(suite.transformer, suite.frames, s, s,
                                              suite.text_len, self.lora_targets, suite.lora_rank)
                    if lora else None)
        return flops.train_step_from(fwd, adapters, fwd["outside_blocks"], suite.train_batch,
                                     remat)

    def rollout_flops(self, suite) -> dict:
        fwd = self.forward_flops(suite)["total"]
        dec = wan_decode_flops(suite.vae, suite.frames, suite.latent_size)
        b, n = suite.rollout_batch, suite.rollout_steps
        return {"model": b * (n * fwd + dec), "transformer": b * n * fwd, "vae_decode": b * dec}


def _torchvision_shim() -> None:
    """diffusers' Cosmos forward resizes the padding mask with torchvision, which this project
    does not install (it pulls CUDA wheels): the same nearest resize through torch alone, only
    where torchvision is absent (the mask is zeros here, so any resize gives the same)."""
    from diffusers.models.transformers import transformer_cosmos
    if hasattr(transformer_cosmos, "transforms"):
        return
    from types import SimpleNamespace

    import torch.nn.functional as F
    transformer_cosmos.transforms = SimpleNamespace(
        functional=SimpleNamespace(resize=lambda img, size, interpolation=None:
                                   F.interpolate(img, size=size, mode="nearest")),
        InterpolationMode=SimpleNamespace(NEAREST="nearest"))


def wan_decode_flops(vae_config: dict, frames: int, latent_size: int) -> float:
    """Per-sample matmul + convolution FLOPs of the wfm_jax Wan VAE decode, counted from its
    traced jaxpr (abstract weights: nothing runs); the chunked causal decode is a lax.scan, whose
    body the count multiplies by its length."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from wfm_jax.bench.flops import count_jaxpr_flops
    from wfm_jax.core.abstract import abstract_module
    from wfm_jax.models.wan.vae import AutoencoderKLWan
    graph, state = nnx.split(abstract_module(lambda: AutoencoderKLWan(vae_config, rngs=nnx.Rngs(0))))
    z = jax.ShapeDtypeStruct((1, vae_config["z_dim"], frames, latent_size, latent_size),
                             jnp.float32)
    return count_jaxpr_flops(jax.make_jaxpr(lambda s, z: nnx.merge(graph, s).decode(z))(state, z))


FAMILIES = {"sd3": SD3(), "cosmos": Cosmos()}


def for_suite(suite) -> BenchFamily:
    if suite.family not in FAMILIES:
        raise ValueError(f"suite {suite.name!r}: unknown family {suite.family!r}; "
                         f"the bench knows {sorted(FAMILIES)}")
    return FAMILIES[suite.family]
