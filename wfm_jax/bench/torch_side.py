"""The PyTorch stack a user would otherwise run: diffusers modules (+ peft LoRA), eager mode.

Same weights (weights.random_state_dict), same inputs (inputs.py), same precision policy as the
wfm_jax workloads: full fine-tune = fp32 master weights under bf16 autocast; LoRA = bf16 frozen
base, fp32 adapters, bf16 autocast (diffusers' train_dreambooth_lora_sd3 recipe); rollout = bf16
weights, fp32 latents through diffusers' DPMSolverMultistepScheduler (DPM-Solver++ 2M for flow
models) on the family's sigma grid (bench/families.py), then the VAE decode (fp32 for Cosmos).
"""
from __future__ import annotations

import numpy as np

from wfm_jax.bench import devices, inputs, timing, weights
from wfm_jax.bench.suites import OPTIM
from wfm_jax.models.layers.remat import rematerialises


def device():
    import torch
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync(dev):
    import torch
    if dev.type == "cuda":
        return lambda _: torch.cuda.synchronize(dev)
    return lambda _: None  # eager CPU ops have finished when they return


def _maybe_compile(module, options):
    import torch
    return torch.compile(module) if options.torch_compile else module


def _compile_figure(t: dict, options) -> tuple[float | None, str]:
    if options.torch_compile:
        return (t["first_call_s"] - t["step_time_s"],
                "torch.compile: first call (compile + run) minus the steady step")
    return None, "n/a: eager mode (no compilation); see first_call_s for first-call overhead"


def _add_lora(model, suite):
    import torch
    from peft import LoraConfig
    model.requires_grad_(False)
    model.add_adapter(LoraConfig(r=suite.lora_rank, lora_alpha=suite.lora_alpha,
                                 init_lora_weights="gaussian",
                                 target_modules=list(suite.workload.lora_targets)))
    layers = {name[: -len(".lora_A.default")]: mod
              for name, mod in model.named_modules() if name.endswith(".lora_A.default")}
    a = weights.lora_a({p: m.in_features for p, m in layers.items()}, suite.lora_rank)
    with torch.no_grad():
        for path, mod in layers.items():
            mod.weight.copy_(torch.from_numpy(a[path].T))
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:  # diffusers' cast_training_params: adapters train in fp32
        p.data = p.data.float()
    return trainable


def train(suite, mode: str, options, peak_flops: float | None) -> dict:
    import torch
    dev = device()
    lora = mode == "lora"
    wl = suite.workload
    model = weights.torch_module(wl.transformer_class, suite.transformer, dev,
                                 torch.bfloat16 if lora else torch.float32)
    if rematerialises(options.remat):
        model.enable_gradient_checkpointing()
    model.train()
    trainable = _add_lora(model, suite) if lora else list(model.parameters())
    if not lora:
        wl.torch_freeze(model)
        trainable = [p for p in trainable if p.requires_grad]
    o = OPTIM[mode]
    opt = torch.optim.AdamW(trainable, lr=o["lr"], betas=o["betas"], eps=o["eps"],
                            weight_decay=o["weight_decay"])
    forward = _maybe_compile(model, options)
    b = {k: torch.from_numpy(v).to(dev) for k, v in inputs.train_batch(suite).items()}
    s = b["sigmas"].view(-1, *([1] * (b["x0"].ndim - 1)))
    losses = []

    def call():
        opt.zero_grad(set_to_none=True)
        x_t = (1.0 - s) * b["x0"] + s * b["noise"]
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            v = wl.torch_velocity(forward, x_t, b, b["sigmas"], b["timesteps"])
        loss = ((v.float() - (b["noise"] - b["x0"])) ** 2).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, o["clip"])
        opt.step()
        losses.append(loss.detach())
        return loss

    devices.torch_reset_peak(dev)
    t = timing.time_calls(call, _sync(dev), warmup=suite.warmup, repeats=suite.repeats)
    f = wl.train_flops(suite, lora, options.remat)
    compile_s, compile_note = _compile_figure(t, options)
    return timing.record(
        "torch", f"diffusers {wl.transformer_class}{' + peft LoRA' if lora else ''}, "
        f"{'torch.compile' if options.torch_compile else 'eager'}, autocast bf16, "
        f"torch.optim.AdamW (default impl), grad checkpointing={rematerialises(options.remat)}",
        t, samples=suite.train_batch, flops=f["model"], peak_flops=peak_flops,
        memory=devices.torch_peak_memory(dev), compile_time_s=compile_s,
        compile_note=compile_note,
        extra={"first_loss": float(losses[0]),
               "trained_params": int(sum(p.numel() for p in trainable)),
               "recompute_flops": f["recompute"]})


def dpm_scheduler():
    from diffusers import DPMSolverMultistepScheduler
    return DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", solver_order=2,
                                       prediction_type="flow_prediction", use_flow_sigmas=True,
                                       flow_shift=inputs.SHIFT, lower_order_final=True,
                                       final_sigmas_type="zero")


def rollout(suite, options, peak_flops: float | None) -> dict:
    import torch
    dev = device()
    wl = suite.workload
    transformer = _maybe_compile(weights.torch_module(
        wl.transformer_class, suite.transformer, dev, torch.bfloat16).eval(), options)
    vae_dtype = torch.float32 if wl.vae_fp32 else torch.bfloat16
    vae = weights.torch_module(wl.vae_class, suite.vae, dev, vae_dtype).eval()
    b = {k: torch.from_numpy(v).to(dev) for k, v in inputs.rollout_batch(suite).items()}
    text = {k: v.to(torch.bfloat16) for k, v in b.items() if k != "noise"}
    sigmas = wl.rollout_sigmas(suite)
    sched = dpm_scheduler()
    outputs = []

    @torch.no_grad()
    def call():
        sched.set_timesteps(suite.rollout_steps)
        sched.sigmas = torch.from_numpy(sigmas)  # the grid wfm_jax samples on
        x = b["noise"]
        for i, t in enumerate(sched.timesteps):
            sig = torch.full((x.shape[0],), float(sigmas[i]), device=dev)
            ts = torch.full((x.shape[0],), float(sigmas[i] * np.float32(1000)), device=dev)
            v = wl.torch_velocity(transformer, x.to(torch.bfloat16), text, sig, ts)
            x = sched.step(v.float(), t, x).prev_sample
        image = wl.torch_decode(vae, suite, x)
        outputs.append(image)
        return image

    devices.torch_reset_peak(dev)
    t = timing.time_calls(call, _sync(dev), warmup=suite.warmup, repeats=suite.repeats)
    f = wl.rollout_flops(suite)
    compile_s, compile_note = _compile_figure(t, options)
    return timing.record(
        "torch", f"diffusers {wl.transformer_class} + DPMSolverMultistepScheduler (2M, flow; "
        f"{wl.sampler_name}) + {wl.vae_class}.decode, bf16"
        f"{' (VAE fp32)' if wl.vae_fp32 else ''}, "
        f"{'torch.compile' if options.torch_compile else 'eager'}",
        t, samples=suite.rollout_batch, flops=f["model"], peak_flops=peak_flops,
        memory=devices.torch_peak_memory(dev), compile_time_s=compile_s,
        compile_note=compile_note, extra={"output_mean": float(outputs[0].mean())})
