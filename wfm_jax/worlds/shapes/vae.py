"""Fit the tiny pipeline's VAE as a plain autoencoder on shapes images, so that its latents
mean something: the pretrained tiny model (tiny_pretrain.py) needs a decoder that turns what the
transformer learns back into the shapes, and a random VAE does not.

Loss: ||decode(mean + std * eps) - x||^2 plus a small pull of the latent means toward 0 (no KL:
the sampled latent's noise already drives the variance down). Afterwards the config's
scaling_factor / shift_factor are set from the latents' std / mean, as SD3's are.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

LATENT_PULL = 1e-4


def _loss(model, x, key):
    dist = model.encode(x)
    z = dist.mean + dist.std * jax.random.normal(key, dist.mean.shape)
    recon = model.decode(z)
    return jnp.mean((recon - x) ** 2) + LATENT_PULL * jnp.mean(dist.mean ** 2)


def fit_vae(pipeline_dir: str, images: np.ndarray, *, steps: int, batch: int = 16,
            lr: float = 5e-3, seed: int = 0, log=print) -> dict:
    """Train `pipeline_dir`/vae in place on uint8 [N, H, W, 3] images; returns
    {"mse": final reconstruction MSE on [-1, 1] pixels, "scaling_factor", "shift_factor"}."""
    from converters.loading import export_diffusers, load_model

    model, config = load_model(pipeline_dir, component="vae")
    x_all = jnp.asarray(np.transpose(images, (0, 3, 1, 2)), jnp.float32) / 127.5 - 1.0
    tx = optax.adam(optax.cosine_decay_schedule(lr, max(steps, 1), alpha=0.05))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, key):
        k_idx, k_eps = jax.random.split(key)
        idx = jax.random.choice(k_idx, x_all.shape[0], (batch,), replace=False)

        def loss_fn(p):
            return _loss(nnx.merge(graphdef, p, rest), x_all[idx], k_eps)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    key = jax.random.key(seed)
    for i in range(steps):
        params, opt_state, loss = step(params, opt_state, jax.random.fold_in(key, i))
        if log and (i + 1) % max(steps // 5, 1) == 0:
            log(f"vae step {i + 1}/{steps}: loss {float(loss):.5f}")
    model = nnx.merge(graphdef, params, rest)

    @jax.jit
    def moments(x):
        dist = model.encode(x)
        return dist.mean, jnp.mean((model.decode(dist.mean) - x) ** 2)

    means, errs = zip(*(moments(x_all[i:i + 64]) for i in range(0, x_all.shape[0], 64)))
    z = np.concatenate([np.asarray(m) for m in means])
    shift, scale = float(z.mean()), float(1.0 / (z.std() + 1e-6))
    config = {**config, "shift_factor": shift, "scaling_factor": scale}
    export_diffusers(model, config, f"{pipeline_dir}/vae")
    return {"mse": float(np.mean([float(e) for e in errs])), "scaling_factor": scale,
            "shift_factor": shift}
