"""The one interface of an RL algorithm on the shared loop: a typed config (a frozen dataclass
per algorithm, defaults as cosmos-rl's) and an `RLAlgorithm` whose methods the loop and
programs.rl call and nothing else. Algorithms are array functions: nothing here imports the
trainer, the planner, the programs or the recipe schema; the recipe reaches them through
`Config.from_recipe(config)`, which only reads attributes."""
from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import jax
import jax.numpy as jnp

from wfm_jax.algorithms.advantages import group_advantages
from wfm_jax.algorithms.media import ItemMedia

Fields = dict[str, Any]
Params = Any


class AlgorithmConfigError(ValueError):
    """A recipe value the algorithm cannot take (one line naming the key)."""


@dataclasses.dataclass(frozen=True)
class MediaConfig:
    """What video2world rollouts and DDRL's data term read of each data item: the run's seed,
    the item size (H, W), frames of a training window, and the range of conditional latent
    frames (0, 0: text2world)."""
    seed: int = 42
    size: tuple[int, int] = (512, 512)
    frames: int = 16
    cond_frames: tuple[int, int] = (0, 0)

    @classmethod
    def from_recipe(cls, config) -> MediaConfig:
        d = config.policy.diffusers
        h, w = (int(v) for v in d.inference_size)
        return cls(seed=int(config.train.seed), size=(h, w),
                   frames=int(d.train_frames),
                   cond_frames=(int(d.min_num_conditional_frames),
                                int(d.max_num_conditional_frames)))


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
    """What every algorithm reads; subclasses add their own fields and defaults."""
    kl_beta: float = 1e-4
    advantage_low: float = -5.0
    advantage_high: float = 5.0
    media: MediaConfig = MediaConfig()

    @classmethod
    def common(cls, config) -> dict:
        """The base fields from a recipe (train.train_policy.*, the media keys)."""
        tp = config.train.train_policy
        return dict(kl_beta=float(tp.kl_beta), advantage_low=float(tp.advantage_low),
                    advantage_high=float(tp.advantage_high),
                    media=MediaConfig.from_recipe(config))

    @classmethod
    def from_recipe(cls, config) -> AlgorithmConfig:
        return cls(**cls.common(config))


@dataclasses.dataclass(frozen=True)
class Velocity:
    """velocity(params, x, timesteps, cond) of the trained model with `params`, and the family's
    CFG form (guide(v_cond, v_uncond, scale); None: the plain combination)."""
    fn: Callable[[Params, jax.Array, jax.Array, Any], jax.Array]
    guide: Callable | None = None

    def __call__(self, params, x, timesteps, cond):
        return self.fn(params, x, timesteps, cond)


def as_velocity(velocity) -> Velocity:
    """A bare function (tests, toy models) as a Velocity without a family guide."""
    return velocity if isinstance(velocity, Velocity) else Velocity(velocity)


class RolloutContext(Protocol):
    """What an algorithm's host-side hooks (prepare, chunk_inputs) read of the run: the rollout
    chunk, the family pipeline (its video_condition), the text encoder, the batch placement and
    the VAE encoder (built on first use)."""
    rollout_chunk: int
    pipe: Any

    def encode(self, prompts, negative: bool = False) -> dict: ...

    def place(self, tree: Any) -> Any: ...

    def visual_encoder(self) -> Callable | None: ...


C = TypeVar("C", bound=AlgorithmConfig)


class RLAlgorithm(abc.ABC, Generic[C]):
    """An RL algorithm for the shared loop. `train_fields`: the rollout fields the update reads;
    `keeps_old`: grads takes old= / first= (per-row values of the first inner epoch, kept across
    the later ones) and returns them third; `reads_data`: rollouts read data items (the loop
    passes their media through chunk_inputs)."""
    name: ClassVar[str]
    Config: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    train_fields: tuple[str, ...] = ()
    keeps_old: ClassVar[bool] = False
    reads_data: bool = False

    def __init__(self, config: C, schedule: Any) -> None:
        """schedule: the model family (its flow_schedule) or a bare flow shift."""
        self.config = config
        self.media = ItemMedia(config.media)  # video2world: rollouts on frames of the data

    @classmethod
    def from_recipe(cls, config, schedule: Any) -> RLAlgorithm:
        """The algorithm with its Config read from a recipe."""
        typed: Any = cls.Config.from_recipe(config)  # this class's own Config: a C
        return cls(typed, schedule)

    # -- the train state --
    @classmethod
    def init_aux(cls, params) -> dict:
        """Copies of the trained parameters the state keeps (e.g. NFT's old policy)."""
        return {}

    @classmethod
    def moves_reference(cls, config: C) -> bool:
        """The KL reference follows the policy: kept in the state even under LoRA."""
        return False

    @classmethod
    def aux_fn(cls, config: C, lora: bool) -> Callable[[Params], dict]:
        """params -> TrainState.aux: init_aux plus the KL reference ("ref") when one is kept:
        for a full fine-tune the starting weights (checkpointed, so a resumed run still has
        them); under LoRA the reference is the base model (adapters zeroed in the update)
        unless it moves with the policy."""
        keep_ref = config.kl_beta > 0 and (not lora or cls.moves_reference(config))
        return lambda params: dict(cls.init_aux(params), **({"ref": params} if keep_ref else {}))

    # -- data --
    @classmethod
    def records(cls, config: C, recipe) -> tuple[list, list]:
        """(train, validation) records of the recipe's data: prompt files, or data items with
        media (video2world). A classmethod: read before the model is loaded."""
        from wfm_jax.data.prompts import prompt_splits_from_config
        from wfm_jax.data.records import media_records
        if config.media.cond_frames[1] > 0:
            return media_records(recipe)
        return prompt_splits_from_config(recipe)

    def prepare(self, ctx: RolloutContext) -> dict[str, jax.Array]:
        """Once per run: arrays every rollout and update gets as keywords."""
        if self.media.conditions:
            self.media.prepare(ctx)
        return {}

    def chunk_inputs(self, ctx: RolloutContext, batch: dict, lo: int, hi: int) -> dict:
        """Per-row rollout inputs of rows lo:hi: {"cond": the video condition} (video2world;
        it joins the text's cond, is stored with it and reaches the update), or nothing."""
        if not self.media.conditions:
            return {}
        return self.media.inputs(ctx, batch, lo, hi, keep_latents=False)

    def abstract_chunk_inputs(self, ctx: RolloutContext, latents) -> dict:
        """What chunk_inputs gives for a chunk of `latents`, as ShapeDtypeStructs (programs
        compiled without data: the planner)."""
        if not self.media.conditions:
            return {}
        counts = jax.ShapeDtypeStruct((latents.shape[0],), jnp.int32, sharding=latents.sharding)
        return {"cond": jax.eval_shape(ctx.pipe.video_condition, latents, counts)}

    def advantages(self, rewards, groups, *, global_std: bool = True, ddof: int = 0):
        """Group-relative advantages (per-prompt mean; global or per-prompt std)."""
        return group_advantages(rewards, groups, global_std=global_std, ddof=ddof)

    # -- on the device --
    @abc.abstractmethod
    def rollout(self, velocity: Velocity, state, latents, cond, key, **inputs) -> Fields:
        """The fields of one rollout chunk (train_fields and what final_latents reads)."""

    @abc.abstractmethod
    def final_latents(self, fields: Fields) -> jax.Array:
        """The rollout's clean latents (decoded for the rewards)."""

    @abc.abstractmethod
    def grads(self, velocity: Velocity, state, ref_params, batch: dict, key, *, old=None,
              first: bool = True, **shared):
        """(grads, metrics) of one micro-batch; keeps_old: (grads, metrics, old)."""

    def post_update_decay(self, step: int) -> float:
        """eta handed to post_update after loop step `step`."""
        return 0.0

    def post_update(self, state, eta):
        """The state after the optimizer steps of a loop step (e.g. NFT's old-policy move)."""
        return state
