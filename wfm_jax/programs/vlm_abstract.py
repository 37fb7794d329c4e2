"""The vision-language SFT step (programs/vlm_sft.py) on abstract weights, for the planner: the
Qwen3-VL model of a recipe built with nnx.eval_shape (ShapeDtypeStructs carrying the mesh's
shardings, nothing of 2B / 8B size allocated), its train state as the trainer makes it
(train/vlm_sft.py: the trainable filter, LoRA, make_tx, TrainState.create) and a batch of
`rows` conversations of `seq_len` tokens, each with one square image of `image_side` pixels.

The shapes: the model dir's config.json when it is on disk (no weights read), else the released
Qwen3-VL-2B / -8B config (programs/released.py) picked by the model name.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os

from wfm_jax.programs.build import Program
from wfm_jax.programs.released import released_vlm_config
from wfm_jax.programs.setup import SetupError


def vlm_model_config(config) -> tuple[dict, str]:
    """(config.json dict, where it came from): the recipe's model dir's (when policy.vlm.build_tiny_vqa
    and the tiny base is not built yet, its random first stage's, which has the same shapes:
    planning never stands in for the pre-trained base), else the released one."""
    root = str(config.policy.model_name_or_path)
    path = os.path.join(root, "config.json")
    if not os.path.isfile(path) and config.policy.vlm.build_tiny_vqa:  # the tiny recipe's model
        from wfm_jax.worlds.vqa.model import ensure_random_model
        root = ensure_random_model(root, seed=int(config.policy.vlm.vqa_seed))
        path = os.path.join(root, "config.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f), root
    return released_vlm_config(root), "released " + ("Qwen3-VL-8B" if "8b" in root.lower() else "Qwen3-VL-2B")


def with_depth(model_config: dict, text_layers: int | None, vision_depth: int | None) -> dict:
    """`model_config` cut to `text_layers` decoder layers / `vision_depth` vision blocks (the
    planner's few-layer compiles). The DeepStack taps move in proportion to the cut (distinct
    blocks, no more than the decoder layers they feed: the model needs at least one)."""
    out = json.loads(json.dumps(model_config))
    if text_layers:
        out["text_config"]["num_hidden_layers"] = int(text_layers)
    if vision_depth:
        vision = out["vision_config"]
        full = int(vision["depth"])
        vision["depth"] = int(vision_depth)
        taps = sorted({min(vision_depth - 1, i * vision_depth // full)
                       for i in vision.get("deepstack_visual_indexes", [8, 16, 24])})
        vision["deepstack_visual_indexes"] = taps[:out["text_config"]["num_hidden_layers"]]
    return out


def parameter_count(model_config: dict) -> int:
    """Parameters of the whole Qwen3-VL of `model_config` (vision tower, decoder, lm_head when
    untied), counted on its abstract model."""
    import jax
    from flax import nnx

    from wfm_jax.core.abstract import abstract_module
    from wfm_jax.models.qwen3_vl.model import make_model
    model = abstract_module(lambda: make_model(model_config, rngs=nnx.Rngs(0)))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


@dataclasses.dataclass
class AbstractVLMSetup:
    """What the VLM trainer holds, as shapes: state (TrainState), frozen (the untrained
    variables: the vision tower unless train_vision, LoRA's base weights), graphdef, tx."""
    config: object
    mesh: object
    rules: tuple
    model_config: dict
    source: str
    graphdef: object
    state: object
    frozen: object
    tx: object
    parameters: int  # of the whole model


def abstract_vlm_setup(config, mesh, rules, model_config: dict, source: str, remat: str,
                       scan: bool) -> AbstractVLMSetup:
    import jax
    from flax import nnx

    from wfm_jax.core.abstract import abstract_module
    from wfm_jax.models import lora as lora_lib
    from wfm_jax.models.qwen3_vl.model import make_model
    from wfm_jax.programs import abstract as abstract_lib
    from wfm_jax.programs import setup as setup_lib
    from wfm_jax.programs import vlm_sft
    from wfm_jax.programs.state import TrainState
    config = setup_lib.with_stand_in_length(config)  # no data here to resolve max_steps from
    t, p = config.train, config.policy
    dtype, param_dtype = setup_lib.DTYPES[str(t.compute_dtype)], setup_lib.DTYPES[str(t.param_dtype)]
    lora = bool(p.lora.enable)

    def make():
        model = make_model(model_config, dtype=dtype, param_dtype=param_dtype, rngs=nnx.Rngs(0),
                           remat=remat, scan_layers=scan)
        if lora:
            lora_lib.attach_lora(model, list(p.lora.target_modules), int(p.lora.r),
                                 float(p.lora.lora_alpha), seed=int(t.seed),
                                 init=str(p.lora.init_lora_weights))
        return model
    try:
        model = abstract_module(make)
    except ValueError as e:  # a config.json the model cannot take
        raise SetupError(f"{source}: {e}") from None
    wanted = vlm_sft.trainable_filter(lora, bool(p.vlm.train_vision))
    graphdef, _, _ = nnx.split(model, wanted, ...)
    params = abstract_lib.placed(model, mesh, rules, wanted)
    frozen = abstract_lib.placed(model, mesh, rules, nnx.Not(wanted))
    tx, _ = setup_lib.make_tx(config)
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=setup_lib.replicated(mesh))
    shapes = jax.eval_shape(lambda prm, key: TrainState.create(prm, tx, key), params, rng)
    shardings = setup_lib.state_shardings(shapes, jax.tree.map(lambda x: x.sharding, params),
                                          mesh, tx)
    state = setup_lib.with_shardings(shapes, shardings)
    count = sum(math.prod(x.shape) for x in jax.tree.leaves(
        nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))))
    return AbstractVLMSetup(config, mesh, tuple(rules), model_config, source, graphdef, state,
                            frozen, tx, count)


def image_grid(model_config: dict, image_side: int) -> tuple[int, int, int]:
    """(t, h, w) in patches of one square image of `image_side` pixels (a multiple of
    patch x merge: the processor's resize target)."""
    v = model_config["vision_config"]
    factor = int(v.get("patch_size", 16)) * int(v.get("spatial_merge_size", 2))
    if image_side % factor:
        raise SetupError(f"image side {image_side} is not a multiple of {factor} (patch x merge: "
                         f"the processor resizes to such sizes)")
    side = image_side // int(v.get("patch_size", 16))
    return (1, side, side)


def visual_tokens(model_config: dict, grid: tuple[int, int, int]) -> int:
    merge = int(model_config["vision_config"].get("spatial_merge_size", 2))
    return grid[0] * grid[1] * grid[2] // merge ** 2


def _model_inputs(setup: AbstractVLMSetup, rows: int, seq_len: int, image_side: int) -> tuple[dict, tuple | None]:
    """({name: (shape, dtype)} of `rows` model-input rows of `seq_len` tokens, each with one
    `image_side` image (0: text only), the image grids or None)."""
    import jax.numpy as jnp
    cfg = setup.model_config
    grid = image_grid(cfg, image_side) if image_side else None
    if grid is not None and visual_tokens(cfg, grid) + 2 > seq_len:
        raise SetupError(f"a {image_side}x{image_side} image is {visual_tokens(cfg, grid)} visual "
                         f"tokens: more than a {seq_len}-token sequence holds")
    v = cfg["vision_config"]
    patch_dim = (int(v.get("in_channels", 3)) * int(v.get("temporal_patch_size", 2))
                 * int(v.get("patch_size", 16)) ** 2)
    shapes = {"input_ids": ((rows, seq_len), jnp.int32),
              "attention_mask": ((rows, seq_len), jnp.int32),
              "position_ids": ((4, rows, seq_len), jnp.int32)}
    if grid is not None:
        shapes["pixel_values"] = ((rows * grid[0] * grid[1] * grid[2], patch_dim), jnp.float32)
    return shapes, None if grid is None else (grid,) * rows


def _abstract(setup: AbstractVLMSetup, shapes: dict) -> dict:
    """ShapeDtypeStructs of a batch, rows split over data x fsdp as the trainers place them."""
    import jax

    from wfm_jax.programs import vlm_sft
    shardings = vlm_sft.batch_shardings(shapes, setup.mesh, setup.rules)
    return {k: jax.ShapeDtypeStruct(s, d, sharding=shardings[k]) for k, (s, d) in shapes.items()}


def sft_step_program(setup: AbstractVLMSetup, rows: int, seq_len: int, image_side: int) -> Program:
    """The VLM SFT step (vlm_sft.VLMSFTStep's program for this grid) on a batch of `rows`
    conversations of `seq_len` tokens, each with one `image_side` image (0: text only)."""
    import jax.numpy as jnp

    from wfm_jax.programs import vlm_sft
    shapes, grids = _model_inputs(setup, rows, seq_len, image_side)
    batch = _abstract(setup, {**shapes, "loss_mask": ((rows, seq_len), jnp.bool_)})
    fn = vlm_sft.VLMSFTStep(setup.graphdef, setup.tx, setup.mesh, setup.rules).program(grids)
    return Program("step", fn, lambda: (setup.state, setup.frozen, batch))


def grpo_update_batch(setup: AbstractVLMSetup, rows: int, seq_len: int, image_side: int,
                      kl: bool) -> tuple[dict, tuple | None]:
    """The VLM GRPO update's batch (train/vlm_grpo.update_batch) as shapes: prompt + completion
    rows, their completion mask, advantages, the old (and with kl the reference) log-probs."""
    import jax.numpy as jnp
    shapes, grids = _model_inputs(setup, rows, seq_len, image_side)
    shapes.update({"completion_mask": ((rows, seq_len), jnp.int32), "advantages": ((rows,), jnp.float32),
                   "old_logp": ((rows, seq_len - 1), jnp.float32)})
    if kl:
        shapes["ref_logp"] = ((rows, seq_len - 1), jnp.float32)
    return _abstract(setup, shapes), grids


def grpo_update_program(setup: AbstractVLMSetup, rows: int, seq_len: int, image_side: int, cfg) -> Program:
    """vlm_grpo.VLMGRPOStep's program (one optimizer update, the use_old flag traced) on `rows`
    rows of `seq_len` prompt + completion tokens; cfg: the recipe's lm_grpo.LMGRPOConfig."""
    import jax
    import jax.numpy as jnp

    from wfm_jax.programs import vlm_grpo
    batch, grids = grpo_update_batch(setup, rows, seq_len, image_side, cfg.kl_beta != 0.0)
    fn = vlm_grpo.VLMGRPOStep(setup.graphdef, setup.tx, setup.mesh, cfg, setup.rules).program(grids)
    flag = jax.ShapeDtypeStruct((), jnp.bool_, sharding=_replicated(setup))
    scale = jax.ShapeDtypeStruct((), jnp.float32, sharding=_replicated(setup))
    return Program("update", fn, lambda: (setup.state, setup.frozen, batch, flag, scale))


def logprobs_program(setup: AbstractVLMSetup, rows: int, seq_len: int, image_side: int, cfg) -> Program:
    """vlm_grpo.VLMLogprobs's program: the old policy's or the reference's log-probs of an update
    batch (the trainer runs it when mu_iterations > 1, the batch is optimised in chunks, or kl_beta > 0)."""
    from wfm_jax.programs import vlm_grpo
    shapes, grids = _model_inputs(setup, rows, seq_len, image_side)
    batch = _abstract(setup, shapes)
    fn = vlm_grpo.VLMLogprobs(setup.graphdef, setup.mesh, cfg.temperature, setup.rules).program(grids)
    return Program("logprobs", fn, lambda: (setup.state.params, setup.frozen, batch))


def rollout_programs(setup: AbstractVLMSetup, rows: int, prompt_len: int, image_side: int,
                     cfg) -> list[Program]:
    """The rollout as models/qwen3_vl/generate.py runs it with a mesh (train/vlm_grpo.rollout):
    "prefill" over `rows` prompts of `prompt_len` tokens (each with one image) filling a cache of
    prompt_len + cfg.max_response_length positions, then "decode", the token loop of
    max_response_length steps on that cache (donated); the rows split over data x fsdp."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from wfm_jax.core.mesh import logical_to_spec, mesh_jit
    from wfm_jax.models.qwen3_vl import generate as gen
    from wfm_jax.programs import setup as setup_lib
    new = int(cfg.max_response_length)
    total = prompt_len + new
    text = setup.model_config["text_config"]
    sampling = gen.Sampling(cfg.rollout_temperature, max(cfg.top_k, 0), cfg.top_p)
    cache_dtype = setup_lib.DTYPES[str(setup.config.train.compute_dtype)]
    eos = tuple(int(e) for e in np.atleast_1d(text.get("eos_token_id", 0)))
    graphdef, mesh, rules = setup.graphdef, setup.mesh, setup.rules
    shapes, grids = _model_inputs(setup, rows, prompt_len, image_side)
    prompt = _abstract(setup, shapes)
    kv_mask = _abstract(setup, {"kv_mask": ((rows, total), jnp.int32)})["kv_mask"]
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=_replicated(setup))

    def prefill(params, frozen, ids, mask, pos, pixels, key):
        return gen.prefill(nnx.merge(graphdef, params, frozen), ids, mask, pos, pixels, None, key,
                           image_grid=grids, video_grid=None, cache_len=total, cache_dtype=cache_dtype,
                           sampling=sampling)

    def decode(params, frozen, cache, first, first_logits, mask, last_pos, key):
        return gen.decode(nnx.merge(graphdef, params, frozen), cache, first, first_logits, mask, last_pos,
                          key, max_new=new, eos=eos, pad=int(text.get("pad_token_id") or eos[0]),
                          sampling=sampling, keep_logits=False)

    batch_spec = logical_to_spec(("act_batch",), rules)

    def sharded(shape, dtype, axis=0):  # rows (dimension `axis`) over data x fsdp
        return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec(*([None] * axis), *batch_spec)))

    cache_shape = (int(text["num_hidden_layers"]), rows, total, int(text["num_key_value_heads"]),
                   int(text.get("head_dim") or int(text["hidden_size"]) // int(text["num_attention_heads"])))
    cache = {k: sharded(cache_shape, cache_dtype, 1) for k in ("k", "v")}
    first, logits = sharded((rows,), jnp.int32), sharded((rows, int(text["vocab_size"])), jnp.float32)
    last_pos = sharded((4, rows), jnp.int32, 1)
    return [
        Program("rollout_prefill", mesh_jit(prefill, mesh=mesh, rules=rules), lambda: (
            setup.state.params, setup.frozen, prompt["input_ids"], kv_mask, prompt["position_ids"],
            prompt.get("pixel_values"), key)),
        Program("rollout_decode", mesh_jit(decode, mesh=mesh, rules=rules, donate_argnums=2), lambda: (
            setup.state.params, setup.frozen, cache, first, logits, kv_mask, last_pos, key)),
    ]


def _replicated(setup: AbstractVLMSetup):
    from wfm_jax.programs import setup as setup_lib
    return setup_lib.replicated(setup.mesh)
