"""plan() for the vision-language family (Qwen3-VL / Cosmos-Reason2): the VLM SFT step
(programs/vlm_sft.py, what train/vlm_sft.py runs), or GRPO's rollout (prefill and decode), update
micro-batch and log-prob pass (what train/vlm_grpo.py runs), compiled on abstract weights
(programs/vlm_abstract.py) for N CPU devices or a TPU topology, in report.plan's form.

SFT's batch: --batch-per-device conversations per device of --seq-len tokens (default the
recipe's policy.vlm.model_max_length), each with one square --size image (default 512 pixels,
256 visual tokens; 0: text only). GRPO's rows are the recipe's (train_batch_per_replica,
rollout.batch_size, batch_size_per_optimize / train.grad_accum_steps), each a --seq-len-token
prompt (default model_max_length - lm_grpo.max_response_length) with one image, then the
response. --vision-blocks K compiles the step with K and 2K vision
blocks and scales its bytes and FLOPs linearly to the whole tower (compiled.scale_linear, which
report.py's --layers shares): the vision tower is unrolled, so
its blocks are most of a compile's time, while the decoder's scanned layers compile once
whatever their number; the parameter and optimizer bytes are always the full model's.
"""
from __future__ import annotations

DEFAULT_IMAGE_SIDE = 512
SCALE_METHOD = ("two compiles with K and 2K vision blocks (the whole scanned decoder, the DeepStack "
                "taps kept); argument, output, alias and temp bytes, FLOPs, collectives and each "
                "compile's loop-corrected cost-model seconds scaled linearly to the full tower: "
                "full = a + (b - a) x (blocks / K - 1)")


def plan_vlm(args, config, limit: int | None = None) -> dict:
    """limit: per-device bytes; when the train state and the frozen variables alone exceed it,
    the report stops before compiling (report.plan's early refusal)."""

    from wfm_jax.core import mesh as wmesh
    from wfm_jax.plan.args import recipe_rows_per_device, target_fields
    from wfm_jax.plan.compiled import finish, memory_limit, peak, plan_mesh
    from wfm_jax.programs import vlm_abstract
    from wfm_jax.programs.stats import per_device_bytes

    algorithm = str(config.train.train_policy.type)
    if algorithm not in ("sft", "grpo"):
        raise SystemExit(f"wfm_jax.plan: policy.family={config.policy.family!r} plans SFT and GRPO "
                         f"(train.train_policy.type={algorithm!r})")
    grpo = _grpo_config(config) if algorithm == "grpo" else None
    remat = args.remat or config.policy.remat
    scan = bool(config.policy.scan_layers) and not args.no_scan
    mesh, topo = plan_mesh(args, config)
    rules = wmesh.active_rules()
    full, source = vlm_abstract.vlm_model_config(config)
    side = DEFAULT_IMAGE_SIDE if args.size is None else int(args.size)

    def setup_at(model_config):
        try:
            return vlm_abstract.abstract_vlm_setup(config, mesh, rules, model_config, source,
                                                   remat, scan)
        except ValueError as e:  # a weight the mesh cannot split (param_shardings says which)
            raise SystemExit(f"wfm_jax.plan: on mesh {dict(mesh.shape)}: {e}") from e

    whole = setup_at(full)  # the resident bytes: always the full model's
    # GRPO with kl_beta keeps the starting policy's trained params as the reference
    ref = per_device_bytes(whole.state.params) if grpo is not None and grpo.kl_beta else 0
    resident = per_device_bytes(whole.state) + per_device_bytes(whole.frozen) + ref
    head = {"config": args.config, "family": str(config.policy.family), "algorithm": algorithm,
            **target_fields(args, config),
            "devices": int(mesh.devices.size), "parameters": whole.parameters,
            "train_state_bytes": per_device_bytes(whole.state),
            "transformer_frozen_bytes": per_device_bytes(whole.frozen), "encoders_vae_bytes": 0,
            "ref_bytes": ref}
    if limit is not None and resident > limit:  # a lower bound of every program's peak
        return {**head, "programs": {}, "peak_program": None, "total_bytes": resident,
                "fits": False, "failed_programs": [], "resident_exceeds_limit": True}
    if grpo is None:
        per_device = recipe_rows_per_device(args, config, mesh)
        rows = per_device * mesh.devices.size // mesh.shape["context"]
        seq_len = int(args.seq_len or config.policy.vlm.model_max_length)
        shapes: dict = {"batch_per_device": per_device, "global_batch": rows,
                        "sequence_length": seq_len}
        builders = {"step": lambda s: [vlm_abstract.sft_step_program(s, rows, seq_len, side)]}
    else:
        shapes, builders = _grpo_programs(args, config, grpo, full, side)
        seq_len = shapes["sequence_length"]
    on_tpu = topo is not None
    compiled = _compile_all(args, builders, setup_at, whole, full, on_tpu)
    for p in compiled.values():
        peak(p, resident + p["batch_bytes"], on_tpu)
    step = compiled["step" if grpo is None else "update"]
    grid = vlm_abstract.image_grid(full, side) if side else None
    out = {
        **head, "model_configs": source,
        "device_kind": topo["chip"] if topo else args.device_kind,
        "device_memory_bytes": int(memory_limit(args, topo)),
        "mesh": {k: int(v) for k, v in mesh.shape.items()},
        "size": side, "frames": None, **shapes,
        "visual_tokens_per_row": vlm_abstract.visual_tokens(full, grid) if grid else 0,
        "text_layers": int(full["text_config"]["num_hidden_layers"]),
        "vision_blocks": int(full["vision_config"]["depth"]),
        "remat": remat, "scan_layers": scan, "lora": bool(config.policy.lora.enable),
        "train_vision": bool(config.policy.vlm.train_vision),
        "frozen_dtype": str(config.train.param_dtype),
        "params_bytes": per_device_bytes(whole.state.params),
        "optimizer_bytes": per_device_bytes(whole.state.opt_state),
        "ema_bytes": 0, "old_bytes": 0,
        # activations: what the train step (GRPO: the update) holds beyond its arguments
        "activation_bytes": step.get("temp_bytes"),
    }
    return finish(out, compiled, step, topo, config)


def _grpo_config(config):
    from wfm_jax.programs import vlm_grpo
    try:
        return vlm_grpo.grpo_config(config)
    except ValueError as e:
        raise SystemExit(f"wfm_jax.plan: {e}") from None


def _grpo_programs(args, config, cfg, full: dict, side: int) -> tuple[dict, dict]:
    """The VLM GRPO step's programs as train/vlm_grpo.py runs them: the rollout of one generate
    call (rollout.batch_size prompts x n_generation rows; prefill, decode), the update's
    micro-batch (batch_size_per_optimize rows / train.grad_accum_steps) of prompt +
    max_response_length tokens, and the log-prob pass over such a micro-batch when the recipe
    takes one."""
    from wfm_jax.programs import SetupError, vlm_abstract, vlm_grpo
    try:
        split = vlm_grpo.grpo_rows(config, cfg)
    except ValueError as e:
        raise SetupError(str(e)) from None
    rows, calls, per_optimize, update_rows = split.step, split.per_call, split.per_update, split.micro
    visual = vlm_abstract.visual_tokens(full, vlm_abstract.image_grid(full, side)) if side else 0
    prompt = int(args.seq_len or int(config.policy.vlm.model_max_length) - cfg.max_response_length)
    if prompt < visual + 2:
        raise SetupError(f"a {prompt}-token prompt (--seq-len; default policy.vlm.model_max_length "
                         f"- lm_grpo.max_response_length) cannot hold a {side}x{side} image's "
                         f"{visual} visual tokens: give --seq-len")
    seq_len = prompt + cfg.max_response_length
    builders = {"rollout": lambda s: vlm_abstract.rollout_programs(s, calls, prompt, side, cfg),
                "update": lambda s: [vlm_abstract.grpo_update_program(s, update_rows, seq_len, side, cfg)]}
    if cfg.kl_beta or cfg.mu_iterations > 1 or per_optimize < rows:
        builders["logprobs"] = lambda s: [vlm_abstract.logprobs_program(s, update_rows, seq_len, side, cfg)]
    shapes = {"global_batch": rows, "rollout_rows": calls, "update_rows": update_rows,
              "optimizer_update_rows": per_optimize,
              "prompt_tokens": prompt, "response_tokens": cfg.max_response_length,
              "sequence_length": seq_len, "n_generation": cfg.n_generation,
              "batch_per_device": None}
    return shapes, builders


def _compile_all(args, builders: dict, setup_at, whole, full: dict, on_tpu: bool) -> dict:
    """{program name: compile_program's result}, each at full depth or, with --vision-blocks K,
    scaled from K and 2K vision blocks (the decode loop has no vision tower: one compile)."""
    from wfm_jax.plan.compiled import compile_program, scale_linear
    from wfm_jax.plan.stats_cache import cache_for
    from wfm_jax.programs import vlm_abstract
    from wfm_jax.programs.stats import per_device_bytes
    cache = cache_for(args)
    depth = int(full["vision_config"]["depth"])
    k = args.vision_blocks
    scaled = bool(k) and 2 * k < depth
    if scaled:
        taps = len(full["vision_config"].get("deepstack_visual_indexes", ()))
        if k < taps:
            raise SystemExit(f"wfm_jax.plan: --vision-blocks {k}: at least {taps} (one per DeepStack "
                             f"tap, so both compiles keep them all)")
        cut = [setup_at(vlm_abstract.with_depth(full, None, v)) for v in (k, 2 * k)]
    out = {}
    for build in builders.values():
        for i, program in enumerate(build(whole)):
            if not scaled or program.name == "rollout_decode":
                p = compile_program(program, on_tpu, cache=cache)
            else:
                measured = [compile_program(build(s)[i], on_tpu, cache=cache) for s in cut]
                p = scale_linear(measured, (k, 2 * k), depth, "vision_blocks", SCALE_METHOD)
            # what it holds beyond the resident state: its own inputs (batch, prompts, cache);
            # the train steps take (state, frozen, batch, ...), the others (params, frozen, ...)
            inputs = program.abstract_args()
            p["batch_bytes"] = per_device_bytes(inputs[2:3] if program.name in ("step", "update") else inputs[2:])
            out[program.name] = p
    return out

