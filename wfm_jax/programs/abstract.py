"""A recipe's pipeline and train state without weights (`abstract_setup`): ShapeDtypeStructs
carrying the mesh's shardings, built from config.json files (the model dir's when on disk, else
the released ones) through converters.registry, whatever the family. It satisfies
programs.setup.Setup, so programs.build compiles on it exactly what the trainer runs."""
from __future__ import annotations

import dataclasses
import json
import os

from wfm_jax.core.abstract import abstract_module
from wfm_jax.programs import setup as setup_lib
from wfm_jax.programs.released import released_configs
from wfm_jax.programs.stats import per_device_bytes


@dataclasses.dataclass
class AbstractSetup:
    """A programs.setup.Setup without weights; `configs` / `source`: the pipeline configs it
    was built from and where they came from (a model dir or "released")."""
    config: object
    mesh: object
    rules: tuple
    graphdef: object
    frozen: object
    tx: object
    shardings: object
    pipe: object
    state: object = None
    lr_schedule: object = None
    configs: dict | None = None
    source: str = ""

    def batch_sharding(self):
        return setup_lib.batch_sharding(self.mesh, self.rules)

    def vae_state(self):
        """The VAE's variables as ShapeDtypeStructs placed on the mesh."""
        from flax import nnx
        return placed(self.pipe.vae, self.mesh, self.rules, nnx.Variable)


def _read(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def pipeline_configs(config) -> tuple[dict, str]:
    """({transformer, vae, scheduler, text_encoders}, where they came from): the model dir's
    config.json files when policy.model_name_or_path is a pipeline dir on disk (config only, no
    weights read), else the family's released pipeline."""
    root = str(config.policy.model_name_or_path)
    index = _read(os.path.join(root, "model_index.json"))
    trained = _family(config).trainable[0]  # its folder holds the configs["transformer"] dict
    if index is None:  # a bare transformer/config.json: that transformer, the rest released
        out = released_configs(str(config.policy.family), root)
        own = _read(os.path.join(root, "transformer", "config.json"))
        if own is not None:
            own = {"_class_name": out["transformer"]["_class_name"], **own}
        out["transformer"] = own or out["transformer"]
        return out, "released" + (f" (transformer: {root})" if own else "")
    out = {"transformer": _read(os.path.join(root, trained, "config.json")),
           "vae": _read(os.path.join(root, "vae", "config.json")),
           "scheduler": _read(os.path.join(root, "scheduler", "scheduler_config.json")) or {},
           "text_encoders": [
               _read(os.path.join(root, name, "config.json")) for name in sorted(index)
               if name.startswith("text_encoder") and index[name] and index[name][0]
               and os.path.isfile(os.path.join(root, name, "config.json"))]}
    if out["transformer"] is None or out["vae"] is None:
        raise setup_lib.SetupError(f"{root} lacks {trained}/config.json or vae/config.json")
    return out, root


def _family(config):
    from wfm_jax.families.base import family_named
    return family_named(str(config.policy.family))


def abstract_model(config: dict, dtype, param_dtype, family=None, **options):
    """The component of `config`, abstract, as `family` (a PipelineFamily class; default the
    base's: the converters' ModelSpec) makes it."""
    from flax import nnx

    from wfm_jax.families.base import PipelineFamily
    make = (family or PipelineFamily).make_component
    return abstract_module(lambda: make(config, dtype=dtype, param_dtype=param_dtype,
                                        rngs=nnx.Rngs(0), **options))


def abstract_transformer(config, t_cfg: dict, remat: str, scan: bool):
    """The recipe's transformer (its policy.lora attached when enabled), abstract."""
    from flax import nnx

    from wfm_jax.models import lora as lora_lib
    from wfm_jax.models.options import ModelOptions
    dtypes = setup_lib.DTYPES
    t, lora = config.train, config.policy.lora
    options = ModelOptions.from_policy(config.policy, remat=remat, scan_layers=scan)
    family = _family(config)

    def make():
        model = family.make_component(t_cfg, dtype=dtypes[t.compute_dtype],
                                param_dtype=dtypes[t.param_dtype], rngs=nnx.Rngs(0),
                                **options.constructor_kwargs())
        if lora.enable:
            lora_lib.attach_lora(model, lora.target_modules, lora.r, lora.lora_alpha,
                                 seed=int(t.seed), init=lora.init_lora_weights)
        return model
    return abstract_module(make)


def family_shell(config, configs: dict, vae):
    """A weightless pipeline object of the recipe's family: the configs its *_with methods read
    and the abstract `vae` (whose graphdef the rollout decodes with); no text encoders."""
    return _family(config).weightless(configs, directory=str(config.policy.model_name_or_path), vae=vae)


def placed(model, mesh, rules, filter):
    """nnx.state(model, filter) with every value a ShapeDtypeStruct carrying its sharding."""
    from flax import nnx

    from wfm_jax.core.mesh import param_shardings
    shardings = param_shardings(model, mesh, rules, filter=filter)
    return with_shardings(nnx.state(model, filter), shardings)


def with_shardings(state, shardings):
    """`state` with every value a ShapeDtypeStruct carrying shardings[dotted path]."""
    import jax
    from flax import nnx
    out = []
    for path, var in state.flat_state():
        value = var.get_value()
        sharding = shardings[".".join(map(str, path))]
        out.append((path, var.replace(jax.ShapeDtypeStruct(value.shape, value.dtype,
                                                           sharding=sharding))))
    return nnx.State.from_flat_path(out)


def frozen_component_bytes(configs: list[dict], mesh, rules, dtype, family=None) -> int:
    """Per-device bytes of frozen components (text encoders, VAE) in `dtype` on `mesh`, made
    as `family` makes them (abstract_model)."""
    from flax import nnx
    total = 0
    for cfg in configs:
        total += per_device_bytes(placed(abstract_model(cfg, None, dtype, family), mesh, rules,
                                         nnx.Variable))
    return total


def abstract_setup(config, mesh, rules, remat: str | None = None, scan: bool | None = None,
                   aux_fn=None, configs: dict | None = None) -> AbstractSetup:
    """The recipe's Setup with its abstract TrainState (aux_fn: the RL algorithm's aux copies,
    RLAlgorithm.aux_fn); remat / scan override policy.remat / policy.scan_layers; configs:
    the pipeline's component configs (pipeline_configs' form; default: pipeline_configs)."""
    import jax
    from flax import nnx
    config = setup_lib.with_stand_in_length(config)  # no data here to resolve max_steps from
    remat = config.policy.remat if remat is None else remat
    scan = bool(config.policy.scan_layers) if scan is None else scan
    configs, source = pipeline_configs(config) if configs is None else (configs, "given")
    model = abstract_transformer(config, configs["transformer"], remat, scan)
    use_lora = bool(config.policy.lora.enable)
    trainable = placed(model, mesh, rules, setup_lib.trainable_filter(use_lora))
    frozen = placed(model, mesh, rules, nnx.Not(setup_lib.trainable_filter(use_lora)))
    graphdef, _, _ = setup_lib.split_model(model, use_lora)
    tx, schedule = setup_lib.make_tx(config)
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=setup_lib.replicated(mesh))
    abstract = jax.eval_shape(setup_lib.state_init(config, tx, aux_fn), trainable, rng)
    param_sh = jax.tree.map(lambda x: x.sharding, trainable)
    state_sh = setup_lib.state_shardings(abstract, param_sh, mesh, tx)
    state = setup_lib.with_shardings(abstract, state_sh)
    vae = abstract_model(configs["vae"], None, setup_lib.DTYPES[config.train.compute_dtype],
                         _family(config))
    return AbstractSetup(config, mesh, tuple(rules), graphdef, frozen, tx, state_sh,
                         family_shell(config, configs, vae), state, schedule, configs, source)
