"""`build(setup, algorithm)`: the one place a run's compiled programs come from. The trainer
calls them, the planner compiles them on an abstract setup (programs.abstract) and reads their
CompileStats, the benchmark times them: what is planned and benchmarked is what trains."""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from wfm_jax.algorithms.base import RLAlgorithm
from wfm_jax.programs import setup as setup_lib
from wfm_jax.programs.rl import RLLayout, rl_layout, rl_programs
from wfm_jax.programs.sample import decode_program, sample_program
from wfm_jax.programs.sft import sft_step
from wfm_jax.programs.stats import CompileStats, Lowering, compile_stats, lower_program


class Program:
    """A mesh_jit'ed function with fixed in/out shardings, and the ShapeDtypeStructs of the
    arguments it takes on the recipe's shapes (the planner compiles on those)."""

    def __init__(self, name: str, fn, abstract_args: Callable[[], tuple]):
        self.name, self.fn, self._abstract_args = name, fn, abstract_args

    def __call__(self, *args):
        return self.fn(*args)

    @property
    def mesh(self):
        return self.fn.mesh

    @property
    def rules(self):
        return self.fn.rules

    @property
    def jitted(self):
        return self.fn.jitted

    def compiles(self) -> int:
        return self.fn.compiles()

    def abstract_args(self) -> tuple:
        return self._abstract_args()

    def lower(self, *args) -> jax.stages.Lowered:
        return self.fn.lower(*(args or self.abstract_args()))

    def lowering(self, *args) -> Lowering:
        """Traced and lowered on `args` (default: abstract_args()), for compile_lowered."""
        return lower_program(self.fn, *(args or self.abstract_args()))

    def stats(self, *args, analyze_hlo=None) -> CompileStats:
        """Compile on `args` (default: abstract_args()) and read XLA's analysis (analyze_hlo:
        compile_stats')."""
        return compile_stats(self.fn, *(args or self.abstract_args()), analyze_hlo=analyze_hlo)


@dataclasses.dataclass
class Programs:
    """A run's programs; None where the run has no such step (SFT: no rollout / update; RL:
    no sft_step). `evaluate` is RL's name for `sample` (validation). layout: the RL batch
    layout. shared: the algorithm's prepare() arrays as shapes (what update / rollout take)."""
    sft_step: Program | None = None
    rollout: Program | None = None
    update: Program | None = None
    evaluate: Program | None = None
    sample: Program | None = None
    layout: RLLayout | None = None
    # name -> (the program up to its VAE decode, the decode alone): the planner compiles cut
    # models of the first and the second once (plan.compiled.join_tail), as it does not depend
    # on the transformer's depth
    split: dict[str, tuple[Program, Program]] = dataclasses.field(default_factory=dict)

    def abstract_args(self, name: str) -> tuple:
        program = {"sft_step": self.sft_step, "rollout": self.rollout, "update": self.update,
                   "evaluate": self.evaluate, "sample": self.sample}[name]
        if program is None:
            raise setup_lib.SetupError(f"this run has no {name} program")
        return program.abstract_args()


class AbstractContext:
    """algorithms.base.RolloutContext on shapes: what prepare() / abstract_chunk_inputs() see
    when the programs are compiled without data (text conditioning as ShapeDtypeStructs; no VAE
    encoder is built)."""

    def __init__(self, setup: setup_lib.Setup, rollout_chunk: int):
        self.setup, self.pipe, self.rollout_chunk = setup, setup.pipe, rollout_chunk

    def encode(self, prompts, negative: bool = False) -> dict:
        return rows(self.setup, text_shapes(self.setup, len(prompts)))

    def place(self, tree: Any) -> Any:
        return tree

    def visual_encoder(self):
        return None


def abstract(tree):
    """Arrays (or ShapeDtypeStructs) -> ShapeDtypeStructs carrying their shardings."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                       sharding=getattr(x, "sharding", None)),
                        tree)


def rows(setup: setup_lib.Setup, shapes: dict, dtype=None) -> dict:
    """{name: ShapeDtypeStruct of `shape`} split over the batch axes (float32 by default)."""
    sharding = setup.batch_sharding()
    return {k: jax.ShapeDtypeStruct(v, dtype or jnp.float32, sharding=sharding)
            for k, v in shapes.items()}


def text_shapes(setup: setup_lib.Setup, batch: int) -> dict:
    """{key: shape} of the conditioning the family's velocity_with reads for `batch` rows."""
    return setup.pipe.cond_shapes(batch, int(setup.config.policy.diffusers.max_prompt_length))


def latent_shape(pipe, batch: int, size, frames: int) -> tuple:
    """The family's latent shape; its one-line error (SetupError) for sizes / frames it cannot
    take."""
    try:
        return tuple(pipe.latent_shape(batch, int(size[0]), int(size[1]), frames=frames))
    except ValueError as e:
        raise setup_lib.SetupError(str(e)) from e


def prompt_table(setup: setup_lib.Setup, text: dict, layout: RLLayout) -> dict:
    """{"prompt_cond", "cond_index"} as programs.rl_encode.rollout_conditions makes them, for the
    per-row text conditioning shapes `text`: layout.cond_slots rows per batch shard, each key in
    the family's storage dtype."""
    dtypes = setup.pipe.cond_storage_dtypes(setup.config.train.compute_dtype)
    n_table = layout.row_shards * layout.cond_slots
    n = next(iter(text.values())).shape[0] if text else 0
    table = {k: jax.ShapeDtypeStruct((n_table,) + tuple(v.shape[1:]), dtypes.get(k, v.dtype),
                                     sharding=setup.batch_sharding()) for k, v in text.items()}
    return {"prompt_cond": table, "cond_index": rows(setup, {"i": (n,)}, jnp.int32)["i"]}


def _key(setup):
    return jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=setup.state.rng.sharding)


def build(setup: setup_lib.Setup, algorithm: RLAlgorithm | None = None, *,
          batch: int | None = None, size: tuple[int, int] | None = None,
          frames: int | None = None) -> Programs:
    """The programs of `setup`'s run: SFT's step (algorithm None) or the algorithm's rollout
    chunk and update, and the sampler. batch / size / frames: the shapes abstract_args() gives
    (default the recipe's: train_batch_per_replica, inference_size, train_frames)."""
    d = setup.config.policy.diffusers
    size = tuple(int(v) for v in (size or d.inference_size))
    frames = int(frames or d.train_frames)
    batch = int(batch or setup.config.train.train_batch_per_replica)
    # a setup without a VAE (the benchmark's train steps) has no sampler
    sampler = sample_program(setup) if setup.pipe.vae is not None else None

    def sample_args(n: int):
        latents = rows(setup, {"x": latent_shape(setup.pipe, n, size, frames)})["x"]
        cond = rows(setup, text_shapes(setup, n))
        uncond = cond if float(d.sample.guidance_scale) > 1.0 else None
        return (abstract(setup.state), abstract(setup.frozen), abstract(setup.vae_state()),
                latents, cond, uncond)

    def sampler_split(name: str, n: int) -> dict:
        if sampler is None:
            return {}
        return {name: (Program(f"{name}_body", sample_program(setup, decode=False),
                               lambda: sample_args(n)),
                       Program("decode_uint8", decode_program(setup, to_uint8=True), lambda: (
                           abstract(setup.vae_state()), sample_args(n)[3])))}

    if algorithm is None:
        def sft_args():
            x = rows(setup, {"x": latent_shape(setup.pipe, batch, size, frames)})["x"]
            ids = rows(setup, {"ids": (batch,)}, jnp.int32)["ids"]
            return (abstract(setup.state), abstract(setup.frozen), x,
                    rows(setup, text_shapes(setup, batch)), ids)
        return Programs(sft_step=Program("sft_step", sft_step(setup), sft_args),
                        sample=sampler and Program("sample", sampler, lambda: sample_args(batch)),
                        split=sampler_split("sample", batch))

    layout = rl_layout(setup.config, setup)
    fns = rl_programs(setup, algorithm, layout)
    cache: dict = {}

    def rollout_args():
        if "rollout" not in cache:
            algo = copy.copy(algorithm)  # prepare may keep context state: not the trainer's
            ctx = AbstractContext(setup, layout.rollout_chunk)
            shared = algo.prepare(ctx)
            latents = rows(setup, {"x": latent_shape(setup.pipe, layout.rollout_chunk, size,
                                                     frames)})["x"]
            cond = rows(setup, text_shapes(setup, layout.rollout_chunk))
            extra = algo.abstract_chunk_inputs(ctx, latents)
            # an algorithm's per-row conditioning (video2world frames) joins the text's
            row_cond = {k: jax.ShapeDtypeStruct((layout.rollout_chunk,) + v.shape[1:],
                                                jnp.float32, sharding=setup.batch_sharding())
                        for k, v in extra.pop("cond", {}).items()}
            cache["text_keys"] = tuple(cond)
            cond = {**cond, **row_cond}
            cache["rollout"] = (abstract(setup.state), abstract(setup.frozen),
                                abstract(setup.vae_state()), latents, cond, _key(setup),
                                dict(shared, **extra))
            cache["shared"] = shared
        return cache["rollout"]

    def update_args():
        if "update" not in cache:
            cache["update"] = _update_args()
        return cache["update"]

    def _update_args():
        state, frozen, vae_state, latents, cond, key, inputs = rollout_args()
        fields = rollout_fields()
        n = int(setup.config.train.train_batch_per_replica)
        sharding = setup.batch_sharding()

        def whole(x):  # the update takes every chunk's rows
            return jax.ShapeDtypeStruct((n,) + tuple(x.shape[1:]), x.dtype, sharding=sharding)
        data = {name: whole(fields[name]) for name in algorithm.train_fields}
        data["cond"] = {k: whole(v) for k, v in cond.items()}
        if layout.cond_slots:  # the prompts' conditioning once per device (train/rl.py)
            data.update(prompt_table(setup, {k: data["cond"].pop(k) for k in cache["text_keys"]},
                                     layout))
        data["advantage"] = rows(setup, {"a": (n,)})["a"]
        return (state, frozen, data, key, jax.ShapeDtypeStruct((), jnp.float32),
                cache["shared"])

    def rollout_fields():  # the rollout's fields as shapes (a trace of the rollout: once)
        if "fields" not in cache:
            cache["fields"] = jax.eval_shape(fns["rollout_body"].jitted, *rollout_args())
        return cache["fields"]

    def final_latents():  # what the rollout decodes (the algorithm's last latents of a row)
        shape = jax.eval_shape(algorithm.final_latents, rollout_fields()).shape
        return abstract(setup.vae_state()), rows(setup, {"x": shape})["x"]

    evaluate = sampler and Program("evaluate", sampler, lambda: sample_args(layout.rollout_chunk))
    split = {"rollout": (Program("rollout_body", fns["rollout_body"], rollout_args),
                         Program("decode_uint8", decode_program(setup, to_uint8=True),
                                 final_latents)),
             **sampler_split("evaluate", layout.rollout_chunk)}
    return Programs(rollout=Program("rollout", fns["rollout"], rollout_args),
                    update=Program("update", fns["update"], update_args),
                    evaluate=evaluate, sample=evaluate, layout=layout, split=split)
