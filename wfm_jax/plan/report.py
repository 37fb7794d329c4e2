"""plan(): a recipe's per-device bytes, FLOPs and collectives from its compiled programs (SFT:
the train step; RL: the rollout chunk and the update), and whether the peak fits; describe()
and check_fits() (main's refusal before any weight is read)."""
from __future__ import annotations

import os

from wfm_jax.plan import layers as layers_lib
from wfm_jax.plan.args import GiB, parse_args, recipe_rows_per_device, target_fields
from wfm_jax.plan.compiled import compile_program, finish, join_tail, memory_limit, peak, plan_mesh, scale_linear
from wfm_jax.plan.stats_cache import cache_for

# a VLM step is planned with every row at policy.vlm.model_max_length, the longest batch the
# trainer can make (it pads each batch to its longest row): a run that passes cannot run out of
# memory later on a longer batch
VLM_ROWS = ", a shorter policy.vlm.model_max_length (rows are planned at that length)"
MEMORY_ENV = "WFM_JAX_DEVICE_MEMORY_BYTES"  # per-device limit main checks against (any backend)


def plan(args, config=None, limit: int | None = None) -> dict:
    """The report of the recipe's programs (programs.build on programs.abstract_setup).
    limit: per-device bytes; when what stays on a device (train state, frozen weights) already
    exceeds it, the report stops there, before any program is compiled (check_fits: a refusal
    from abstract shapes in seconds rather than a compile of minutes)."""
    from wfm_jax.config.recipe import load_config
    from wfm_jax.programs import SetupError

    if config is None:
        config = load_config(args.config, [tuple(kv.split("=", 1)) for kv in args.set])
    from wfm_jax.config.schema import VLM_FAMILIES
    vlm = str(config.policy.family) in VLM_FAMILIES
    if vlm and getattr(args, "layers", None) is not None:
        raise SystemExit("wfm_jax.plan: --layers is the DiT families' (transformer blocks); a VLM "
                         "scales its vision tower with --vision-blocks K")
    if not vlm and getattr(args, "vision_blocks", None) is not None:
        raise SystemExit("wfm_jax.plan: --vision-blocks is the VLM families'; a DiT recipe scales "
                         "its transformer blocks with --layers K")
    try:
        if vlm:  # Qwen3-VL: its own SFT step
            from wfm_jax.plan.vlm import plan_vlm
            return plan_vlm(args, config, limit)
        return _plan(args, config, limit)
    except SetupError as e:  # a layout, shape or model dir the run cannot have: one line
        raise SystemExit(f"wfm_jax.plan: {e}") from None


def _plan(args, config, limit) -> dict:
    import jax.numpy as jnp

    from wfm_jax.algorithms.base import AlgorithmConfigError
    from wfm_jax.algorithms.registry import ALGORITHMS, algorithm_named
    from wfm_jax.core import mesh as wmesh
    from wfm_jax.programs import abstract, abstract_setup, build
    from wfm_jax.programs import setup as setup_lib
    from wfm_jax.programs.build import latent_shape
    from wfm_jax.programs.stats import per_device_bytes

    t, d = config.train, config.policy.diffusers
    kind = str(t.train_policy.type)
    rl = kind != "sft"
    algo_cls = algo_config = None
    if rl:
        try:
            algo_cls = algorithm_named(kind)
            algo_config = algo_cls.Config.from_recipe(config)
        except AlgorithmConfigError as e:
            if kind not in ALGORITHMS:
                raise SystemExit(f"wfm_jax.plan: train.train_policy.type={kind!r} has no "
                                 f"trainer; planned: sft, {', '.join(sorted(ALGORITHMS))}") from None
            raise SystemExit(f"wfm_jax.plan: {e}") from None
    family = str(config.policy.family)
    remat = args.remat or config.policy.remat
    scan = bool(config.policy.scan_layers) and not args.no_scan
    mesh, topo = plan_mesh(args, config)
    rules = wmesh.active_rules()
    setup_lib.ensure_tiny_assets(config)  # a tiny recipe's dir: its config.json files
    size = (args.size, args.size) if args.size else tuple(int(v) for v in d.inference_size)
    frames = args.frames or int(d.train_frames)
    configs, _ = abstract.pipeline_configs(config)  # bad sizes / frames: before any tracing
    latent_shape(abstract.family_shell(config, configs, None), 1, size, frames)
    aux_fn = algo_cls.aux_fn(algo_config, bool(config.policy.lora.enable)) if rl else None

    def setup_at(configs=None):
        try:
            return abstract_setup(config, mesh, rules, remat, scan, aux_fn=aux_fn, configs=configs)
        except ValueError as e:  # a weight the mesh cannot split (mesh.param_shardings says which)
            raise SystemExit(f"wfm_jax.plan: on mesh {dict(mesh.shape)}: {e}") from e
    setup = setup_at()  # the resident bytes: always the full model's (no compile)
    configs, source = setup.configs, setup.source
    k, layers_source = layers_k(args, type(setup.pipe), configs, topo is not None)
    cut = _cut(k, type(setup.pipe), configs, scan)  # K and 2K blocks, scaled to the depth
    state = setup.state
    frozen_dtype = setup_lib.DTYPES[args.frozen_dtype or t.compute_dtype]
    aux = state.aux or {}
    out = {
        "config": args.config, "family": family, "algorithm": kind, "model_configs": source,
        **target_fields(args, config),
        "devices": int(mesh.devices.size),
        "device_kind": topo["chip"] if topo else args.device_kind,
        "device_memory_bytes": int(memory_limit(args, topo)),
        "mesh": {k: int(v) for k, v in mesh.shape.items()},
        "size": size[0] if size[0] == size[1] else list(size),
        "frames": frames if setup.pipe.is_video else None, "remat": remat, "scan_layers": scan,
        "lora": bool(config.policy.lora.enable), "frozen_dtype": jnp.dtype(frozen_dtype).name,
        "params_bytes": per_device_bytes(state.params),
        "optimizer_bytes": per_device_bytes(state.opt_state),
        "ema_bytes": per_device_bytes(state.ema) if state.ema is not None else 0,
        # copies the RL algorithm keeps in the state (NFT's old policy, the KL reference)
        "old_bytes": per_device_bytes(aux.get("old")),
        "ref_bytes": per_device_bytes(aux.get("ref")),
        "train_state_bytes": per_device_bytes(state),
        "transformer_frozen_bytes": per_device_bytes(setup.frozen),
        "encoders_vae_bytes": abstract.frozen_component_bytes(
            configs["text_encoders"] + [configs["vae"]], mesh, rules, frozen_dtype,
            type(setup.pipe)),
    }
    resident = (out["train_state_bytes"] + out["transformer_frozen_bytes"]
                + out["encoders_vae_bytes"])
    if limit is not None and resident > limit:  # a lower bound of every program's peak
        out.update({"programs": {}, "peak_program": None, "total_bytes": resident,
                    "fits": False, "failed_programs": [], "resident_exceeds_limit": True})
        return out
    out["layers"] = cut.full if cut else _depth(type(setup.pipe), configs["transformer"])
    out["layer_scaling"] = cut and cut.info
    out["layers_source"] = layers_source if cut else "full depth"
    on_tpu = topo is not None
    if not rl:
        context = mesh.shape["context"]
        out["batch_per_device"] = per_device = recipe_rows_per_device(args, config, mesh)
        out["global_batch"] = batch = per_device * mesh.devices.size // context

    def programs_at(s):
        if not rl:
            return build(s, batch=batch, size=size, frames=frames)
        return build(s, algo_cls(algo_config, s.pipe.shell()), size=size, frames=frames)
    # the batch, cache and sampler inputs are the same at any depth: read them off the first
    # cut model's programs when scaling (no trace of the full model)
    cut_programs = ([programs_at(setup_at(dict(configs, transformer=c))) for c in cut.configs]
                    if cut else None)
    programs = cut_programs[0] if cut_programs else programs_at(setup)

    decodes: dict[str, dict] = {}
    cache = cache_for(args)

    def joined(bodies, split, progress):
        """Each body joined to the split's decode, compiled once per run of the planner (the
        rollout's and the evaluation's decode are one program), and what the decode was."""
        key = program_signature(split[1])
        reused = key in decodes
        if not reused:
            decodes[key] = compile_program(split[1], progress, args.hlo_dir, cache)
        decode = decodes[key]
        handoff = per_device_bytes(split[1].abstract_args()[1])
        seconds = round(sum(b["compile_seconds"] for b in bodies)
                        + (0 if reused else decode["compile_seconds"]), 1)
        about = {k: decode.get(k) for k in ("compiled", "compile_seconds", "temp_bytes",
                                            "argument_bytes", "output_bytes", "optimal_seconds",
                                            "flops", "error")}
        about["shared_with_an_earlier_program"] = reused
        return [join_tail(b, decode, handoff) for b in bodies], seconds, about

    def compiled_as(name, progress=on_tpu):  # the full model's figures, compiled or scaled
        if not cut_programs:
            split = programs.split.get(name) if getattr(args, "split_decode", False) else None
            if split is None:
                return compile_program(getattr(programs, name), progress, args.hlo_dir, cache)
            body = compile_program(split[0], progress, args.hlo_dir, cache)
            (p,), seconds, about = joined([body], split, progress)
            p.update(compile_seconds=seconds, decode=about, split_method=layers_lib.JOIN_METHOD)
            return p
        split = cut_programs[0].split.get(name)
        if split is None:
            measured = [compile_program(getattr(c, name), progress, args.hlo_dir, cache)
                        for c in cut_programs]
            p = scale_linear(measured, cut.depths, cut.full, "layers", layers_lib.SCALE_METHOD)
        else:  # the decode does not depend on the depth: compiled once, joined to each cut model
            bodies = [compile_program(c.split[name][0], progress, args.hlo_dir, cache)
                      for c in cut_programs]
            tails, seconds, about = joined(bodies, split, progress)
            p = scale_linear(tails, cut.depths, cut.full,
                             "layers", layers_lib.SCALE_METHOD + "; " + layers_lib.JOIN_METHOD)
            p["compile_seconds"], p["decode"] = seconds, about
        if cut.info["scan_kept"] is False and p["compiled"]:
            # XLA counts a loop body once: across cut models scanned unlike the model (a run of
            # one block is unrolled) its figures do not extrapolate (each compile's: scaled_from)
            p.update(xla_flops_per_device=None, optimal_seconds=None, xla_bytes_accessed=None)
        return p

    if not rl:
        step = compiled_as("sft_step")
        step["batch_bytes"] = per_device_bytes(programs.abstract_args("sft_step")[2:])
        compiled = {"step": step}
        # donated state: the step's outputs reuse its arguments (alias), temp comes on top
        peak(step, resident, topo is not None)
    else:
        layout = programs.layout
        rollout_args, update_args = (programs.abstract_args("rollout"),
                                     programs.abstract_args("update"))
        rollout, update = compiled_as("rollout"), compiled_as("update")
        update["batch_bytes"] = per_device_bytes(update_args[2])  # the whole batch's fields
        rollout["vae_bytes"] = per_device_bytes(rollout_args[2])
        rollout["chunk_bytes"] = per_device_bytes((rollout_args[3], rollout_args[4],
                                                   rollout_args[6]))  # this chunk's rows
        out.update({"global_batch": int(t.train_batch_per_replica),
                    "rollout_chunk": layout.rollout_chunk, "micro_batches": layout.micro_batches,
                    "optimize_chunks": layout.optimize_chunks,
                    "mu_iterations": layout.mu_iterations,
                    # the step's prompt conditioning: rows per device of its table (0: per row)
                    "cond_slots": layout.cond_slots})
        compiled = {"rollout": rollout, "update": update}
        stored = update["batch_bytes"]  # the whole batch's rollout fields, kept for the update
        peak(update, resident + stored, topo is not None)
        # (the compiled rollout drops the state it does not read: its argument bytes are less
        # than the resident state, which stays on the device all the same)
        peak(rollout, resident + stored + rollout["chunk_bytes"], topo is not None)
        step = update
    sampler = programs.evaluate if rl else programs.sample
    out["validation"] = validation_plan(args, config, rl, topo is not None, sampler is not None)
    if out["validation"]["planned"]:  # what a TPU run also compiles: validation
        name = "evaluate" if rl else "sample"
        p = compiled[name] = compiled_as(name, True)
        peak(p, resident + per_device_bytes(programs.abstract_args(name)[3:]), True)
    out = finish(out, compiled, step, topo, config)
    if cut and out["total_bytes"] > NEAR_LIMIT * out["device_memory_bytes"]:
        out["near_limit_note"] = (  # near the limit, only the model itself settles the fit
            f"the scaled peak is {out['total_bytes'] / out['device_memory_bytes']:.0%} of the "
            f"device's memory, within a cut model's error of it (scaled peaks measured 5.5% under "
            f"to 13.5% over full compiles): --full-depth compiles the model itself")
    if topo is not None and rl and update["compiled"] and rollout.get("estimated_step_seconds"):
        chunks = -(-int(t.train_batch_per_replica) // layout.rollout_chunk)
        rollout["chunks_per_step"] = chunks
        rollout["estimated_seconds_per_step"] = rollout["estimated_step_seconds"] * chunks
    return out


def validation_plan(args, config, rl: bool, on_tpu: bool, has_sampler: bool) -> dict:
    """{"planned": whether the plan compiles the validation program (RL: evaluate, SFT: the
    sampler), "why"}. An RL run compiles evaluate only with validation.enable, so a recipe that
    turns it off is planned without it (41 s of compiles in sana_video_nft's plan); the same
    --config.validation.enable=True that turns it on for the run plans it."""
    if not on_tpu:
        return {"planned": False, "why": "a CPU screen compiles the training programs only"}
    if not has_sampler:
        return {"planned": False, "why": "this setup has no VAE, so no sampler"}
    if getattr(args, "no_validation", False):
        return {"planned": False, "why": "--no-validation"}
    if rl and not bool(config.validation.enable):
        return {"planned": False, "why": "the recipe's validation.enable is False, so its run "
                "compiles no evaluate program (--config.validation.enable=True plans it)"}
    return {"planned": True, "why": "the run's validation sampler"
            + (" (validation.enable)" if rl else " (generation with the trained weights)")}


def program_signature(program) -> str:
    """A program's name and its arguments' shapes, dtypes and shardings: two programs built
    alike with the same signature compile to the same executable."""
    import jax
    return program.name + repr(jax.tree.map(lambda x: (x.shape, str(x.dtype), str(x.sharding)),
                                            program.abstract_args()))


def _depth(family, t_cfg: dict) -> int | None:
    """The transformer's block count, None for a family whose trained module has no blocks."""
    try:
        return len(family.block_kinds(t_cfg))
    except ValueError:  # PipelineError: no num_layers (a family outside the shipped ones)
        return None


# On a TPU topology a DiT this deep is compiled at AUTO_LAYERS and twice that many blocks and
# scaled (--layers), in a third to a quarter of a full compile's time (15-20 minutes for SD3.5-M
# or Wan2.1 on 2 cores). Measured against full compiles (docs/sharding_and_memory.md), the scaled
# peaks came out 5.5% under (Wan2.1 NFT's update) to 13.5% over (a scanned SD3.5-M step):
# so a scaled peak above NEAR_LIMIT of the memory says to compile the model itself.
AUTO_LAYERS, AUTO_MIN_DEPTH = 2, 8
NEAR_LIMIT = 0.9


def layers_k(args, family, configs, on_tpu: bool) -> tuple[int | None, str]:
    """(K of --layers or None for the model itself, why): --layers as given; else on a TPU
    topology AUTO_LAYERS for a DiT of AUTO_MIN_DEPTH blocks or more, unless --full-depth or
    --split-decode asks for the model itself."""
    k = getattr(args, "layers", None)
    if k is not None:
        return int(k), "--layers"
    if not on_tpu or getattr(args, "full_depth", False) or getattr(args, "split_decode", False):
        return None, "full depth"
    depth = _depth(family, configs["transformer"])
    if depth is None or depth < AUTO_MIN_DEPTH:
        return None, "full depth"
    return AUTO_LAYERS, f"auto (a TPU topology and {depth} blocks; --full-depth for the model itself)"


def _cut(k: int | None, family, configs, scan: bool):
    """K and 2K-block transformers (plan/layers.py), None for no K or when 2K is the whole model
    (then the model itself is compiled); one line for a K it cannot take."""
    if k is None:
        return None
    try:
        cut = layers_lib.cut(family, configs["transformer"], int(k), scan)
    except ValueError as e:  # a K it cannot take; a family without blocks (PipelineError)
        raise SystemExit(f"wfm_jax.plan: {e}") from None
    if cut.depths[1] == cut.full:
        from wfm_jax.plan.compiled import say
        say(f"wfm_jax.plan: --layers {k}: 2K is the model's depth; compiling the model itself")
        return None
    return cut


def _tflops(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e12:.2f}"


def _bytes(v: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(v) >= 0.1 * size:
            return f"{v / size:.1f} {unit}"
    return f"{v:.0f} B"


def describe(r: dict) -> str:
    g = _bytes
    mesh = " x ".join(f"{k}={v}" for k, v in r["mesh"].items())
    size = r["size"] if isinstance(r["size"], list) else [r["size"]] * 2
    shape = f"{size[0]}x{size[1]}" + (f"x{r['frames']} frames" if r["frames"] else "")
    if r.get("prompt_tokens"):  # VLM GRPO: prompt + response rows, one image each
        shape = (f"{r['prompt_tokens']} prompt + {r['response_tokens']} response tokens/row, "
                 + (f"one {shape} image ({r['visual_tokens_per_row']} visual tokens)" if r["size"]
                    else "text only"))
    elif r.get("sequence_length"):  # a VLM: rows of tokens, one image each
        shape = (f"{r['sequence_length']} tokens/row, one {shape} image ({r['visual_tokens_per_row']} "
                 f"visual tokens)" if r["size"] else f"{r['sequence_length']} tokens/row, text only")
    if r.get("prompt_tokens"):  # VLM GRPO
        batch = (f"{r['global_batch']} rows a step, rolled out {r['rollout_rows']} at a time "
                 f"({r['rollout_rows'] // r['n_generation']} prompts x {r['n_generation']}), optimizer "
                 f"updates of {r['optimizer_update_rows']} rows in micro-batches of {r['update_rows']}")
    elif r["algorithm"] == "sft":
        batch = f"batch {r['batch_per_device']}/device ({r['global_batch']} global)"
    else:
        batch = (f"batch {r['global_batch']} global, rollout chunks of {r['rollout_chunk']}, "
                 f"{r['micro_batches']} micro-batches")
    lines = [
        f"{r['config']} ({r['family']} {r['algorithm']}{', LoRA' if r['lora'] else ''}): "
        f"{r['devices']} devices ({mesh}), {batch}, {shape}, remat {r['remat']}, scan "
        f"{'on' if r['scan_layers'] else 'off'}, "
        + ("" if r.get("sequence_length") else f"encoders/VAE in {r['frozen_dtype']} ")
        + f"(configs: {r['model_configs']})",
        f"  per device: params {g(r['params_bytes'])}, optimizer {g(r['optimizer_bytes'])}, "
        f"EMA {g(r['ema_bytes'])}, old policy {g(r['old_bytes'])}, reference "
        f"{g(r['ref_bytes'])}, frozen transformer buffers {g(r['transformer_frozen_bytes'])}, "
        f"text encoders + VAE {g(r['encoders_vae_bytes'])}"]
    if r.get("sequence_length"):
        lines[-1] = (f"  per device: params {g(r['params_bytes'])}, optimizer {g(r['optimizer_bytes'])}, "
                     f"reference {g(r['ref_bytes'])}, "
                     f"frozen {g(r['transformer_frozen_bytes'])} (vision tower trained: "
                     f"{r['train_vision']}); activations (the step's temporaries) "
                     f"{g(r['activation_bytes']) if r['activation_bytes'] is not None else '?'}; "
                     f"{r['parameters'] / 1e9:.3f} B parameters, {r['text_layers']} decoder layers, "
                     f"{r['vision_blocks']} vision blocks")
    if r.get("target"):
        lines.append(f"  planned for {r['target']} ({r['target_source']}; the recipe's plan.target: "
                     f"{r['recipe_target'] or 'none'})")
    scaled = [p["scale_method"] for p in r["programs"].values() if p.get("scale_method")]
    if scaled:
        lines.append(f"  scaled: {scaled[0]}")
    if r.get("layer_scaling"):
        lines.append(f"  {layers_lib.describe(r['layer_scaling'])}; blocks cut by "
                     f"{r.get('layers_source', '--layers')}")
    if r.get("topology"):
        lines.append(_topology_table(r))
        lines.append(f"  estimates: {r['estimate_method']}; peak bf16 per chip: "
                     + ", ".join(f"{c} {v / 1e12:.0f} TFLOP/s" for c, v in r["peak_table"].items()))
    for name, p in r["programs"].items():
        if not p["compiled"]:
            lines.append(f"  {name}: not compiled: {p['error']}")
            continue
        coll = ", ".join(f"{k} {g(v)}" for k, v in p["collective_bytes"].items() if v)
        lines.append(
            f"  {name}: temp {g(p['temp_bytes'])}, outputs not aliased "
            f"{g(p['output_bytes'] - p['alias_bytes'])}, peak {g(p['peak_bytes'])}; "
            f"{p['flops'] / 1e12:.2f} TFLOP (matmuls, all devices; XLA per device, loop bodies "
            f"once: {_tflops(p['xla_flops_per_device'])}); collectives: {coll or 'none'}; "
            f"compiled in {p['compile_seconds']} s")
        if p.get("estimate_method"):
            lines.append(f"    {estimate_line(p)}")
        if breakdown_line(p):
            lines.append(f"    {breakdown_line(p)}")
    v = r.get("validation")
    if r.get("topology") and v and not v["planned"]:
        lines.append(f"  validation: not planned: {v['why']}")
    lines.append(fit_line(r))
    if r.get("near_limit_note"):
        lines.append(f"  note: {r['near_limit_note']}")
    return "\n".join(lines)


def estimate_line(p: dict) -> str:
    """How a program's estimate was made: the method, the cost model's loop-once seconds and the
    factor, the loops read from its HLO (trip counts, the bodies' share of the loop-once time)."""
    method = p["estimate_method"]
    t = p.get("estimated_step_seconds")
    if t is None:
        return f"estimate: none ({p.get('estimate_note', method)})"
    line = f"estimate: {t:.4g} s by {method}"
    hlo = p.get("hlo") or {}
    if method == "hlo_loops":
        loops = hlo.get("loops", [])
        trips = ", ".join("?" if x["trips"] is None else str(x["trips"]) for x in loops[:12])
        share = sum(x["share"] for x in loops if x.get("nested") == 0)  # outermost loops
        line += (f" (cost model, loop bodies once: {p['optimal_seconds']:.4g} s x "
                 f"{p['loop_scale']:.3g}; " + (f"{len(loops)} loops, trips {trips}"
                 + ("..." if len(loops) > 12 else "") + f", {share:.0%} of the loop-once time "
                 f"in loop bodies)" if loops else "no loops)"))
    elif method == "flop_ratio":
        line += f" (cost model x {p['loop_scale']:.3g} = jaxpr FLOPs / XLA FLOPs)"
    if p.get("kernel_seconds"):
        line += (f"; {p['kernel_seconds']:.4g} s of it flash attention's backward kernels, "
                 f"which declare no cost: their matmuls at the cost model's rate")
    if p.get("scaled_from"):
        line += "; per compile: " + ", ".join(
            f"{m.get('layers', m.get('vision_blocks'))}: {m['estimated_step_seconds']:.4g} s"
            for m in p["scaled_from"] if m.get("estimated_step_seconds") is not None)
    if p.get("estimate_note"):
        line += f"; note: {p['estimate_note']}"
    return line


def breakdown_line(p: dict, top: int = 3) -> str:
    """Where the roofline puts the program's time (plan/hlo_breakdown.py): the share of each
    kind of instruction and the source lines whose instructions take the most. A program scaled
    from cut models: the deeper compile's."""
    hlo = (p.get("scaled_from") or [p])[-1].get("hlo") or {}
    b = hlo.get("breakdown")
    if not b:
        return ""
    kinds = ", ".join(f"{k} {v:.0%}" for k, v in sorted(b["share_by_kind"].items(),
                                                          key=lambda kv: -kv[1]))
    rows = "; ".join(f"{x['source']} ({x['kind']}, {x['share']:.1%})"
                     for x in b.get("top_sources", [])[:top])
    return f"roofline time by kind: {kinds}; largest source lines: {rows}"


def _topology_table(r: dict) -> str:
    """One row per program: compiled, kernel, bytes per device, fit, FLOPs, estimates."""
    head = ("program", "compiled", "attention", "argument", "temp", "output-alias", "peak",
            "HBM", "fits", "TFLOP/device", "est. s", "est. MFU")
    rows = [head]
    for name, p in r["programs"].items():
        if not p["compiled"]:
            need = p.get("required_bytes")
            rows.append((name, "no", "-", _bytes(p["argument_bytes"]),
                         _bytes(need) if need else "-", "-", "-", _bytes(p["hbm_bytes"]),
                         "no" if p["fits"] is False else "?", "-", "-", "-"))
            continue
        t, mfu = p["estimated_step_seconds"], p["estimated_mfu"]
        rows.append((name, "yes", p["attention_kernel"], _bytes(p["argument_bytes"]),
                     _bytes(p["temp_bytes"]), _bytes(p["output_bytes"] - p["alias_bytes"]),
                     _bytes(p["peak_bytes"]), _bytes(p["hbm_bytes"]), "yes" if p["fits"] else "no",
                     f"{p['flops_per_device'] / 1e12:.3g}", f"{t:.3g}" if t else "-",
                     f"{mfu:.1%}" if mfu else "-"))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    return "\n".join("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in rows)


def fit_line(r: dict) -> str:
    if r["total_bytes"] is None:
        return f"  no program compiled for {r['device_kind']}"
    failed = ", ".join(r.get("failed_programs") or [])
    verdict = "fits" if r["fits"] else "does not fit"
    if failed:
        verdict += f" (not compiled: {failed})"
    return (f"  peak ({r['peak_program']}) {_bytes(r['total_bytes'])} per device "
            f"({r['total_bytes'] / 1e9:.1f} GB): {verdict} a {r['device_kind']} "
            f"({r['device_memory_bytes'] / 1e9:.0f} GB; "
            + ("the TPU compiler's analysis)" if r.get("topology")
               else "CPU analysis: GPU temp is lower)"))


def check_fits(config) -> dict | None:
    """main's check before any weight is read: plan the recipe's programs on this run's devices
    and raise programs.SetupError (one line, the numbers) when the peak exceeds a device's
    memory. Runs on accelerators (the limit: $WFM_JAX_DEVICE_MEMORY_BYTES, else the device's
    own bytes_limit) and wherever $WFM_JAX_DEVICE_MEMORY_BYTES is set (CPU included)."""
    import jax

    from wfm_jax.programs import SetupError
    limit = os.environ.get(MEMORY_ENV)
    if limit is None:
        if jax.default_backend() == "cpu":
            return None
        limit = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")
        if not limit:
            return None
    devices = jax.device_count()
    context = max(1, int(config.policy.parallelism.context))
    args = parse_args(["--devices", str(devices), "--batch-per-device",
                       str(max(1, int(config.train.train_batch_per_replica) * context // devices))])
    try:
        r = plan(args, config, limit=int(limit))
    except SystemExit as e:  # a mesh or layout the run cannot have: one line, as plan says it
        raise SetupError(str(e).removeprefix("wfm_jax.plan: ")) from None
    r["device_kind"] = jax.devices()[0].device_kind
    r["device_memory_bytes"], r["fits"] = int(limit), r["total_bytes"] <= int(limit)
    if r.get("resident_exceeds_limit"):
        raise SetupError(
            f"this run does not fit: what stays on each device needs {r['total_bytes']} bytes "
            f"({r['total_bytes'] / GiB:.2f} GiB) before any program's temporaries (train state "
            f"{r['train_state_bytes'] / GiB:.2f} GiB, frozen "
            f"{(r['transformer_frozen_bytes'] + r['encoders_vae_bytes']) / GiB:.2f} GiB) and "
            f"each of the {devices} {r['device_kind']} devices has {int(limit)} bytes "
            f"({int(limit) / GiB:.2f} GiB); try more fsdp, LoRA, a smaller model (python -m "
            f"wfm_jax.plan --config ... for the figures)")
    if not r["fits"]:
        p = r["programs"][r["peak_program"]]
        raise SetupError(
            f"this run does not fit: its {r['peak_program']} needs {r['total_bytes']} bytes "
            f"({r['total_bytes'] / GiB:.2f} GiB) per device (train state "
            f"{r['train_state_bytes'] / GiB:.2f} GiB, frozen "
            f"{(r['transformer_frozen_bytes'] + r['encoders_vae_bytes']) / GiB:.2f} GiB, temp "
            f"{p['temp_bytes'] / GiB:.2f} GiB) and each of the {devices} {r['device_kind']} "
            f"devices has {int(limit)} bytes ({int(limit) / GiB:.2f} GiB); try policy.remat=full, "
            f"more fsdp, a smaller batch{VLM_ROWS if 'sequence_length' in r else ''} (python -m "
            f"wfm_jax.plan --config ... for the figures)")
    return r
