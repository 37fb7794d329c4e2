"""Models (one folder per family) and their loaders. Heavy imports happen on first use."""
from __future__ import annotations

import jax.numpy as jnp


def load_transformer(path: str, dtype=None, param_dtype=jnp.float32, mesh=None, rules=None,
                     **options):
    """The diffusion transformer of a diffusers transformer dir, a pipeline dir (its
    `transformer/`) or a wfm_jax state dir, loaded straight into its shards on `mesh`.

    The returned NNX module is called like the diffusers forward:
    `model(hidden_states, encoder_hidden_states, pooled_projections, timestep)` -> velocity in
    the layout of `hidden_states`. `dtype` is the compute dtype, `param_dtype` the stored one;
    options go to the model constructor (SD3: attention_impl="auto"|"xla"|"cudnn"|None,
    remat="none"|"full"|"dots"). `rules` (default: the active ones, wfm_jax.core.mesh.DEFAULT_RULES)
    place the parameters; run the forward under `jax.set_mesh(mesh)` and, for custom rules,
    `wfm_jax.core.mesh.use_rules(rules)` so the activation constraints agree.
    """
    from converters.loading import load_model
    model, _ = load_model(path, component="transformer", dtype=dtype, param_dtype=param_dtype,
                          mesh=mesh, rules=rules, **options)
    return model


def export_diffusers(model, config, dst, **kwargs):
    """See `converters.loading.export_diffusers`."""
    from converters.loading import export_diffusers as _export
    return _export(model, config, dst, **kwargs)
