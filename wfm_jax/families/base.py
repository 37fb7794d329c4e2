"""One model-family interface: what every trainer, sampler, `generate`, export, validation and
the benchmark may ask of a diffusers pipeline, whichever pipeline it is.

A family is a subclass of `PipelineFamily` named in `wfm_jax.families.FAMILIES` under its recipe
name; its `pipeline_class` is the `_class_name` its diffusers `model_index.json` carries (as
cosmos-rl's `supported_model_types()`), so `load_pipeline(dir)` reads that name and builds the
right one. Callers never branch on the family: what differs (prompt encoding, latent geometry,
the transformer's call and timestep convention, the CFG form, the VAE and its latent
normalisation, export, which module trains) is a method or class attribute here.

Jitted code takes modules as arguments (`*_with(module, ...)`), so a trainer can split them into
(graphdef, state) and pass states through `jax.jit`; the family's python configs are static.
`static_key()` is hashable and identifies everything those methods read from `self`, for caching
compiled functions across instances.

Layouts (diffusers'): latents (B, C, h, w) for images, (B, C, T', h, w) for video; pixels are
channels-last in [0, 1] out of `decode_with` ((B, H, W, 3) or (B, T, H, W, 3), as a diffusers
pipeline returns with output_type="np") and in [-1, 1] into `posterior_with`.
"""
from __future__ import annotations

import abc
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from wfm_jax.core.errors import UserError
from wfm_jax.core.registry import resolve
from wfm_jax.families import FAMILIES
from wfm_jax.models.options import ModelOptions


class PipelineError(UserError, ValueError):
    """A pipeline directory that is missing, of an unsupported class, or lacks a component."""


def supported_pipelines() -> list[str]:
    """The model_index.json class names of every registered family (imports them all)."""
    return sorted(cls.pipeline_class for cls in FAMILIES.values())


def families() -> dict[str, str]:
    """recipe family name -> pipeline class, e.g. {"sd3": "StableDiffusion3Pipeline"}."""
    return {name: cls.pipeline_class for name, cls in FAMILIES.items()}


def family_named(name: str) -> type[PipelineFamily]:
    """The class of the recipe family `name` ("sd3", "wan", ...); PipelineError naming the
    nearest and the known ones."""
    if name not in FAMILIES:
        raise PipelineError(FAMILIES.unknown(name))
    return FAMILIES.get(name)


def read_model_index(directory: str) -> dict:
    """model_index.json of a local pipeline dir (PipelineError when there is none)."""
    if not os.path.isdir(directory):
        raise PipelineError(f"no such pipeline directory: {directory}")
    index = os.path.join(directory, "model_index.json")
    if not os.path.isfile(index):
        raise PipelineError(f"{directory} is not a diffusers pipeline (no model_index.json)")
    with open(index) as f:
        return json.load(f)


def family_class(directory: str) -> type[PipelineFamily]:
    """The family serving the pipeline in `directory`; one line naming the supported ones."""
    name = read_model_index(directory).get("_class_name", "<no _class_name>")
    by_class = {cls.pipeline_class: cls for cls in FAMILIES.values()}
    if name not in by_class:
        raise PipelineError(f"{directory} holds a {name!r}, which wfm_jax does not support; "
                            f"supported pipelines: {', '.join(sorted(by_class))}")
    return by_class[name]


def load_pipeline(directory: str, *, family: str | None = None, **options) -> PipelineFamily:
    """Load the pipeline in `directory` with its family's `load(directory, **options)`.
    family: the recipe's family name ("sd3", "wan", ...); a pipeline of another family is one
    line naming its class and the recipe's family."""
    cls = family_class(directory)
    if family is not None and family != cls.family:
        raise PipelineError(f"{directory} holds a {cls.pipeline_class} ({cls.family!r} family) "
                            f"but the recipe is for the {family!r} family "
                            f"({families().get(family, 'unsupported')})")
    return cls.load(directory, **options)


def component_present(info: Mapping, directory: str, name: str) -> bool:
    entry = info.get(name)
    return bool(entry) and entry[0] is not None and os.path.isdir(os.path.join(directory, name))


def hashable(value):
    """Nested dicts/lists of a JSON config -> a hashable tuple (for jit caches)."""
    if isinstance(value, dict):
        return tuple(sorted((k, hashable(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(hashable(v) for v in value)
    return value


class PipelineFamily(abc.ABC):
    """A loaded diffusers pipeline in JAX. Subclasses set the class attributes, hold the NNX
    modules (`transformer`, `vae`, `text_encoders`) and python configs, and implement the
    abstract methods. They know nothing of training."""

    pipeline_class: ClassVar[str]     # model_index.json "_class_name"
    family: ClassVar[str]             # the recipes' name for it: "sd3", "wan", ...
    is_video: ClassVar[bool] = False
    display_name: ClassVar[str | None] = None  # for messages ("SD3", "Wan"); None: `family`
    lora_prefix: ClassVar[str] = "transformer"  # key prefix of exported LoRA weights
    # The components the trainer may update (attribute names on the loaded pipeline); today's
    # trainers update one, `trainable_module()`. A language-model family names its LM here.
    trainable: ClassVar[tuple[str, ...]] = ("transformer",)
    # The module paths a recipe's policy.lora.target_modules defaults to for this family
    # (diffusers names; the recipes and the benchmark read them from here).
    lora_targets: ClassVar[tuple[str, ...]] = ()
    # "module:function" writing the tiny twin, write(directory, seed); loaded on use, since the
    # writer reads this module's constants
    tiny_writer: ClassVar[str | None] = None
    # what `generate` uses when the user names none (diffusers' pipeline defaults)
    default_solver: ClassVar[str] = "euler"  # sampling.samplers method; see sampler_schedule
    default_steps: ClassVar[int] = 28
    default_guidance: ClassVar[float] = 4.5
    default_max_sequence_length: ClassVar[int] = 256
    default_frames: ClassVar[int | None] = None  # video families: generate's --frames default
    default_fps: ClassVar[float] = 16.0          # video families: the mp4's frame rate
    default_negative_prompt: ClassVar[str] = ""  # generate's --negative-prompt default
    # Optional capability: conditioning on frames of a video (Cosmos video2world). A family with
    # it overrides `condition_from_video(vae, frames, num_conditional_frames, latents)`, which
    # returns extra cond-dict entries (batch-first arrays, the same for cond and uncond) that its
    # `velocity_with` reads; callers merge them into both dicts and never branch on the family.
    # Families without it ignore such entries.
    supports_video_condition: ClassVar[bool] = False

    directory: str
    transformer: Any
    vae: Any
    text_encoders: tuple
    transformer_config: dict
    vae_config: dict
    scheduler_config: dict

    # ------------------------------------------------------------------ construction
    @classmethod
    @abc.abstractmethod
    def load(cls, directory: str, *, dtype=None, param_dtype=jnp.float32, mesh=None, rules=None,
             text_dtype=None, frozen_param_dtype=None,
             options: ModelOptions | None = None) -> PipelineFamily:
        """Every component of a local pipeline dir straight onto `mesh` (models.loading).
        frozen_param_dtype: weights of the VAE and text encoders, which training never updates."""

    @classmethod
    def write_tiny(cls, directory: str, seed: int = 0) -> None:
        """Write the family's tiny twin (random weights, the real layout and configs) into the
        existing empty `directory`; families.tiny.build_tiny_pipeline calls it atomically.
        Default: the function `tiny_writer` names."""
        if cls.tiny_writer is None:
            raise PipelineError(f"the {cls.family!r} family has no tiny twin")
        resolve(cls.tiny_writer)(directory, seed)

    def trainable_module(self) -> Any:
        """The module the trainer updates (the family's single `trainable` component). Callers
        use this, never `pipe.transformer`, so a family may train another component."""
        if len(self.trainable) != 1:
            raise PipelineError(f"the {self.family!r} family trains {list(self.trainable)}; "
                                f"trainable_module() serves families that train one module")
        return getattr(self, self.trainable[0])

    def set_trainable_module(self, module: Any) -> None:
        """Put `module` (e.g. None once a trainer has split it into its state) where
        `trainable_module()` finds it."""
        setattr(self, self.trainable[0], module)

    def static_key(self) -> tuple:
        """Hashable identity of everything the *_with methods read from self."""
        return (type(self).__name__, hashable(self.transformer_config),
                hashable(self.vae_config), hashable(self.scheduler_config))

    def shell(self) -> PipelineFamily:
        """A copy without the NNX modules, for closures of compiled functions: the *_with
        methods read only configs (and tokenizers) from self, and a cached jit must not keep
        a model's weights alive."""
        import copy
        out = copy.copy(self)
        out.vae, out.text_encoders = None, ()
        for name in out.trainable:
            setattr(out, name, None)
        return out

    @classmethod
    def weightless(cls, configs: Mapping[str, Any], directory: str | None = None,
                   vae: Any = None) -> PipelineFamily:
        """An instance holding `configs` and no weights, for the planner and the benchmark
        (their *_with calls read only configs): configs has "transformer", "vae", "scheduler"
        dicts and optionally "text_encoders" (a list of dicts); vae: an abstract VAE to keep.
        Tokenizers are absent, so `tokenize` is unavailable. A family with more per-instance
        state sets it in an override."""
        pipe = object.__new__(cls)
        pipe.directory = directory
        for name in cls.trainable:
            setattr(pipe, name, None)
        pipe.vae, pipe.text_encoders = vae, ()
        pipe.transformer_config, pipe.vae_config = dict(configs["transformer"]), dict(configs["vae"])
        pipe.scheduler_config = dict(configs["scheduler"])
        pipe.text_config = dict((configs.get("text_encoders") or [{}])[0])
        pipe.tokenizer = pipe.tokenizers = None
        return pipe

    @classmethod
    def make_component(cls, config: Mapping[str, Any], *, dtype=None, param_dtype=jnp.float32,
                       rngs=None, **options) -> Any:
        """A freshly initialised module of any component (the trained one, the VAE, a text
        encoder) from its config dict; the planner builds them under nnx.eval_shape. Default:
        the converters' ModelSpec of the config's class (the shipped diffusers families)."""
        from converters.registry import spec_for
        return spec_for(dict(config)).make_model(dict(config), dtype=dtype, param_dtype=param_dtype,
                                                 rngs=rngs, **options)

    # ------------------------------------------------------------------ depth
    @classmethod
    def block_kinds(cls, config: Mapping[str, Any]) -> list[str]:
        """The kind of each block of the trained module `config` builds, in order; blocks of
        one kind have the same parameters and do the same work. The planner's `--layers K`
        compiles models of fewer blocks (`with_blocks`) and extrapolates to these. Default:
        `num_layers` identical blocks (the DiT families)."""
        if "num_layers" not in config:
            raise PipelineError(f"the {cls.family!r} family's {cls.trainable[0]} config has no "
                                f"num_layers")
        return ["block"] * int(config["num_layers"])

    @classmethod
    def with_blocks(cls, config: Mapping[str, Any], kinds: Sequence[str]) -> dict:
        """`config` changed so that it builds a module whose blocks are `kinds` (names
        `block_kinds` gives), everything else as it was."""
        if set(kinds) - {"block"}:
            raise PipelineError(f"the {cls.family!r} family's blocks are all alike, not "
                                f"{sorted(set(kinds))}")
        return {**config, "num_layers": len(kinds)}

    # ------------------------------------------------------------------ geometry
    @property
    def shift(self) -> float:
        """The flow-matching scheduler's timestep shift."""
        return float(self.scheduler_config.get("shift", self.scheduler_config.get("flow_shift",
                                                                                  1.0)))

    def sampler_schedule(self, num_steps: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(sigmas (N+1,), timesteps (N,) or None = 1000 sigma) of `default_solver` as the
        family's diffusers scheduler sets them; here FlowMatchEulerDiscreteScheduler's."""
        from wfm_jax.sampling.schedule import flow_sigmas
        return flow_sigmas(num_steps, self.shift)[0], None

    def flow_schedule(self, num_steps: int, solver: str) -> tuple[np.ndarray, np.ndarray | None]:
        """(sigmas (N+1,) ending in 0, timesteps (N,) or None = 1000 sigma) that a flow sampler
        `solver` of sampling.samplers steps on for this model (rollouts, validation): the
        flow-matching schedulers' at the family's shift; a family trained on another sigma range
        overrides (Cosmos: its Karras flow sigmas)."""
        from wfm_jax.sampling.schedule import default_flow_schedule
        return default_flow_schedule(num_steps, self.shift, solver)

    def train_sigma_table(self, shift: float) -> tuple[np.ndarray, np.ndarray]:
        """(timesteps, sigmas), float32 (1000,) each: the table SFT indexes with
        floor(u * 1000), u from the recipe's density (weighting_scheme). Default: the untouched
        flow-matching scheduler's at `shift` (SD3, Wan, SANA); a family trained on another
        sigma range overrides (Cosmos). timesteps are 1000 sigma, as velocity_with takes."""
        from wfm_jax.sampling.schedule import training_table
        return training_table(shift)

    @abc.abstractmethod
    def latent_shape(self, batch: int, height: int, width: int,
                     frames: int | None = None) -> tuple[int, ...]:
        """Diffusers-layout latent shape; ValueError (one line, the numbers) for sizes or frame
        counts the VAE and patching cannot take. frames is ignored by image families."""

    # ------------------------------------------------------------------ text
    @abc.abstractmethod
    def tokenize(self, prompts: Sequence[str], max_sequence_length: int) -> dict[str, np.ndarray]:
        """Host int arrays (ids, masks) per text encoder, padded as diffusers pads."""

    def tokenize_negative(self, prompts: Sequence[str],
                          max_sequence_length: int) -> dict[str, np.ndarray]:
        """Ids of negative (unconditional) prompts, as the family's diffusers pipeline tokenises
        them (SANA: without its instruction prefix). Default: as `tokenize`."""
        return self.tokenize(prompts, max_sequence_length)

    @abc.abstractmethod
    def encode_text_with(self, text_encoders, ids: Mapping[str, Any],
                         max_sequence_length: int) -> dict[str, jax.Array]:
        """The conditioning dict (float32 leaves, batch first) exactly as diffusers'
        encode_prompt computes it; the keys are what `velocity_with` reads."""

    def encode_prompt(self, prompts: Sequence[str], max_sequence_length: int) -> dict:
        return self.encode_text_with(self.text_encoders,
                                     self.tokenize(prompts, max_sequence_length),
                                     max_sequence_length)

    def cond_shapes(self, batch: int, text_len: int) -> dict[str, tuple[int, ...]]:
        """{key: shape} of the float32 conditioning dict `velocity_with` reads for `batch` rows
        of `text_len` tokens, from the configs alone (what the planner compiles on)."""
        raise PipelineError(f"the {self.family!r} family declares no conditioning shapes "
                            f"(PipelineFamily.cond_shapes)")

    def cond_storage_dtypes(self, compute_dtype) -> dict[str, Any]:
        """{conditioning key: the dtype it may be stored in between an RL rollout and its update}
        for keys the transformer casts to its compute dtype before any other use, so storing
        them cast changes no bit of the model's output (RL keeps each prompt's conditioning
        for the update: programs/rl_encode.py). Keys not listed are stored as encoded (float32).
        Default: none."""
        del compute_dtype
        return {}

    @abc.abstractmethod
    def cond_from_embedding(self, embedding) -> dict[str, np.ndarray]:
        """A dataset's precomputed text embedding (array or dict of arrays, batch first) -> the
        conditioning dict; DataError-worthy ValueError naming the missing keys."""

    # ------------------------------------------------------------------ denoiser
    @abc.abstractmethod
    def velocity_with(self, transformer, latents, timesteps, cond: Mapping) -> jax.Array:
        """The transformer's prediction for diffusers-layout latents; timesteps (B,) are
        1000 * sigma (the flow-matching schedulers' convention); a family whose transformer
        takes another convention converts here."""

    def velocity(self, latents, timesteps, cond: Mapping) -> jax.Array:
        return self.velocity_with(self.trainable_module(), latents, timesteps, cond)

    def guide(self, v_cond: jax.Array, v_uncond: jax.Array, scale) -> jax.Array:
        """Classifier-free guidance: diffusers' v_u + w (v_c - v_u); Cosmos overrides."""
        return v_uncond + jnp.asarray(scale, jnp.float32) * (v_cond - v_uncond)

    # ------------------------------------------------------------------ VAE
    @abc.abstractmethod
    def posterior_with(self, vae, pixels) -> tuple[jax.Array, jax.Array]:
        """Channels-last pixels in [-1, 1] ((B, H, W, 3) or (B, T, H, W, 3)) -> the VAE
        posterior's (mean, std) in latent layout, before normalisation."""

    @abc.abstractmethod
    def normalize_latents(self, z: jax.Array) -> jax.Array:
        """Raw VAE latents -> what the transformer sees (SD3: shift/scale; Wan: mean/std)."""

    @abc.abstractmethod
    def decode_with(self, vae, latents) -> jax.Array:
        """Normalised latents -> channels-last pixels in [0, 1], as output_type="np"."""

    def decode(self, latents) -> jax.Array:
        return self.decode_with(self.vae, latents)

    def condition_from_video(self, vae, frames, num_conditional_frames: int, latents) -> dict:
        """Families with `supports_video_condition`: cond-dict entries conditioning the initial
        `latents` on the last frames of `frames` ((1 or B, T, H, W, 3) in [0, 1])."""
        raise ValueError(f"a {self.pipeline_class} cannot condition on a video")

    def video_condition(self, video_latents, counts) -> dict:
        """Families with `supports_video_condition`, for training on clips: cond-dict entries
        conditioning row i on the first counts[i] latent frames of `video_latents` ((B, C, T',
        h, w) normalised latents; counts (B,) ints, 0 = unconditioned); jittable. The
        prediction on conditioned frames is the flow velocity through them, so a sample keeps
        them and a flow-matching loss there is zero."""
        raise ValueError(f"a {self.pipeline_class} cannot condition on a video")

    def encode_visual(self, pixels, key: jax.Array | None = None) -> jax.Array:
        """Channels-last pixels in [-1, 1] -> normalised latents (the mode, or a sample)."""
        mean, std = self.posterior_with(self.vae, pixels)
        z = mean if key is None else mean + std * jax.random.normal(key, mean.shape, mean.dtype)
        return self.normalize_latents(z.astype(jnp.float32))

    # ------------------------------------------------------------------ export
    @classmethod
    def export_components(cls) -> tuple[str, ...]:
        """The components a full fine-tune rewrites (the rest are copied unchanged)."""
        return cls.trainable

    def export_trainable(self, module: Any, directory: str) -> None:
        """Write the trained `module` (of `trainable_module()`'s structure, any dtype) as its
        component folder `directory` of a diffusers pipeline; every process calls it (the
        gather is collective), process 0 writes. Default: a diffusers model of
        `transformer_config` through the converters' table."""
        from converters.loading import export_diffusers
        export_diffusers(module, self.transformer_config, directory)
