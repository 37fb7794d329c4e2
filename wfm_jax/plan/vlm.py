"""plan() for the vision-language family (Qwen3-VL / Cosmos-Reason2 SFT): the VLM SFT step
(programs/vlm_sft.py, what train/vlm_sft.py runs) compiled on abstract weights
(programs/vlm_abstract.py) for N CPU devices or a TPU topology, in report.plan's form.

The batch: --batch-per-device conversations per device of --seq-len tokens (default the
recipe's policy.vlm.model_max_length), each with one square --size image (default 512 pixels,
256 visual tokens; 0: text only). --vision-blocks K compiles the step with K and 2K vision
blocks and scales its temporaries linearly to the whole tower: the vision tower is unrolled, so
its blocks are most of a compile's time, while the decoder's scanned layers compile once
whatever their number; the parameter and optimizer bytes are always the full model's.
"""
from __future__ import annotations

DEFAULT_IMAGE_SIDE = 512
SCALE_METHOD = ("two compiles with K and 2K vision blocks (the whole scanned decoder, the DeepStack "
                "taps kept); temp, FLOPs and collectives scaled linearly to the full tower: "
                "full = a + (b - a) x (blocks / K - 1)")


def plan_vlm(args, config, limit: int | None = None) -> dict:
    """limit: per-device bytes; when the train state and the frozen variables alone exceed it,
    the report stops before compiling (report.plan's early refusal)."""

    from wfm_jax.core import mesh as wmesh
    from wfm_jax.plan.compiled import compile_program, finish, memory_limit, peak, plan_mesh
    from wfm_jax.programs import vlm_abstract
    from wfm_jax.programs.stats import per_device_bytes

    if str(config.train.train_policy.type) != "sft":
        raise SystemExit(f"wfm_jax.plan: policy.family={config.policy.family!r} plans SFT only "
                         f"(train.train_policy.type={config.train.train_policy.type!r})")
    remat = args.remat or config.policy.remat
    scan = bool(config.policy.scan_layers) and not args.no_scan
    mesh, topo = plan_mesh(args, config)
    rules = wmesh.active_rules()
    full, source = vlm_abstract.vlm_model_config(config)
    seq_len = int(args.seq_len or config.policy.vlm.model_max_length)
    side = DEFAULT_IMAGE_SIDE if args.size is None else int(args.size)
    rows = args.batch_per_device * mesh.devices.size // mesh.shape["context"]

    def setup_at(model_config):
        try:
            return vlm_abstract.abstract_vlm_setup(config, mesh, rules, model_config, source,
                                                   remat, scan)
        except ValueError as e:  # a weight the mesh cannot split (param_shardings says which)
            raise SystemExit(f"wfm_jax.plan: on mesh {dict(mesh.shape)}: {e}") from e

    whole = setup_at(full)  # the resident bytes: always the full model's
    resident = per_device_bytes(whole.state) + per_device_bytes(whole.frozen)
    if limit is not None and resident > limit:  # a lower bound of the step's peak
        return {"config": args.config, "family": str(config.policy.family), "algorithm": "sft",
                "devices": int(mesh.devices.size), "parameters": whole.parameters,
                "train_state_bytes": per_device_bytes(whole.state),
                "transformer_frozen_bytes": per_device_bytes(whole.frozen), "encoders_vae_bytes": 0,
                "programs": {}, "peak_program": None, "total_bytes": resident, "fits": False,
                "failed_programs": [], "resident_exceeds_limit": True}
    layers = int(full["text_config"]["num_hidden_layers"])
    depth = int(full["vision_config"]["depth"])
    on_tpu = topo is not None
    k = args.vision_blocks
    if k and 2 * k < depth:
        taps = len(full["vision_config"].get("deepstack_visual_indexes", ()))
        if k < taps:
            raise SystemExit(f"wfm_jax.plan: --vision-blocks {k}: at least {taps} (one per DeepStack "
                             f"tap, so both compiles keep them all)")
        measured = [compile_program(vlm_abstract.sft_step_program(
            setup_at(vlm_abstract.with_depth(full, None, v)), rows, seq_len, side), on_tpu)
            for v in (k, 2 * k)]
        step = _scaled(measured, depth / k - 1)
        step["scaled_from"] = [{"vision_blocks": v, **{
            f: m.get(f) for f in ("compiled", "temp_bytes", "flops", "compile_seconds", "error")}}
            for v, m in zip((k, 2 * k), measured)]
        step["scale_method"] = SCALE_METHOD
    else:
        step = compile_program(vlm_abstract.sft_step_program(whole, rows, seq_len, side), on_tpu)
    step["batch_bytes"] = per_device_bytes(
        vlm_abstract.sft_step_program(whole, rows, seq_len, side).abstract_args()[2])
    grid = vlm_abstract.image_grid(full, side) if side else None
    out = {
        "config": args.config, "family": str(config.policy.family), "algorithm": "sft",
        "model_configs": source, "devices": int(mesh.devices.size),
        "device_kind": topo["chip"] if topo else args.device_kind,
        "device_memory_bytes": int(memory_limit(args, topo)),
        "mesh": {k: int(v) for k, v in mesh.shape.items()},
        "size": side, "frames": None, "sequence_length": seq_len,
        "visual_tokens_per_row": vlm_abstract.visual_tokens(full, grid) if grid else 0,
        "parameters": whole.parameters, "text_layers": layers, "vision_blocks": depth,
        "remat": remat, "scan_layers": scan, "lora": bool(config.policy.lora.enable),
        "train_vision": bool(config.policy.vlm.train_vision),
        "frozen_dtype": str(config.train.param_dtype),
        "params_bytes": per_device_bytes(whole.state.params),
        "optimizer_bytes": per_device_bytes(whole.state.opt_state),
        "ema_bytes": 0, "old_bytes": 0, "ref_bytes": 0,
        "train_state_bytes": per_device_bytes(whole.state),
        # the untrained variables (the vision tower when frozen, LoRA's base weights)
        "transformer_frozen_bytes": per_device_bytes(whole.frozen),
        "encoders_vae_bytes": 0,
        "batch_per_device": args.batch_per_device, "global_batch": rows,
    }
    # activations: what the step holds beyond its arguments (XLA's temporaries)
    out["activation_bytes"] = step.get("temp_bytes")
    peak(step, out["train_state_bytes"] + out["transformer_frozen_bytes"] + step["batch_bytes"],
          on_tpu)
    return finish(out, {"step": step}, step, topo, config)


def _scaled(measured: list[dict], extra: float) -> dict:
    """The step at full depth from its compiles at K and 2K layers: byte and FLOP figures
    extrapolated linearly (extra = full / K - 1 steps of K layers past the first compile)."""
    a, b = measured
    if not (a["compiled"] and b["compiled"]):
        return dict(b if not b["compiled"] else a)
    out = dict(b)
    for key in ("temp_bytes", "generated_code_bytes"):
        out[key] = int(a[key] + (b[key] - a[key]) * extra)
    for key in ("flops", "xla_flops_per_device", "optimal_seconds", "xla_bytes_accessed"):
        out[key] = a[key] + (b[key] - a[key]) * extra
    out["collective_bytes"] = {k: int(a["collective_bytes"][k] + (v - a["collective_bytes"][k]) * extra)
                               for k, v in b["collective_bytes"].items()}
    out["compile_seconds"] = round(a["compile_seconds"] + b["compile_seconds"], 1)
    return out
