"""One family registry (wfm_jax.families.FAMILIES) and the registries' shared behaviour
(wfm_jax.core.registry): lazy entries, did-you-mean errors, every shipped entry resolving, and a
toy family defined here that the tiny builder, `load_pipeline`, the recipe check and `generate`
find once registered, with nothing outside this file changed. Its trained module is named
`denoiser`, not `transformer`, so any caller still reaching for `pipe.transformer` fails here."""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from converters.registry import COMPONENTS, ModelSpec, UnsupportedModelError, spec_for
from wfm_jax.core.errors import RunFailure, UserError, WfmError, exit_code
from wfm_jax.core.registry import Registry
from wfm_jax.families import FAMILIES
from wfm_jax.families import base as fam
from wfm_jax.families.base import PipelineError, PipelineFamily

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHANNELS, FACTOR = 3, 4
DENOISER_CONFIG = {"_class_name": "Denoiser", "in_channels": CHANNELS}
VAE_CONFIG = {"_class_name": "Scale", "value": 1.0}


# ----------------------------------------------------------------------------- the registry itself

def test_lazy_entries_load_on_first_get_and_unknown_names_get_a_hint():
    reg = Registry("codec", {"json": "json:dumps", "path_join": "os.path:join", "direct": len})
    assert reg.names() == ["direct", "json", "path_join"] and "json" in reg and len(reg) == 3
    assert reg.reference("json") == "json:dumps" and reg.reference("direct") is None
    assert reg.get("json") is json.dumps and reg.get("path_join") is os.path.join
    assert reg.get("direct") is len
    with pytest.raises(UserError) as e:
        reg.get("jsn")
    assert str(e.value) == "unknown codec 'jsn'; did you mean 'json'? known: direct, json, path_join"
    with pytest.raises(UserError, match=r"^unknown codec 'zzz'; known: direct, json, path_join$"):
        reg.get("zzz")
    with pytest.raises(UserError, match="'json' is already registered"):
        reg.register("json", str)
    reg.register("json", str, replace=True)
    assert reg.get("json") is str  # the loaded value is dropped with the entry it came from
    reg.unregister("json")
    assert "json" not in reg
    with pytest.raises(ValueError, match="not of the form"):
        Registry("codec", {"bad": "json.dumps"}).get("bad")


def test_error_roots_keep_the_old_builtin_bases():
    from converters.table import ConversionError
    from reward_client.errors import RewardConfigError, RewardServiceError
    from wfm_jax.config.base import ConfigError
    from wfm_jax.data.errors import DataError
    from wfm_jax.io.storage.s3 import S3Error
    from wfm_jax.models.lora import LoraError

    for cls in (ConfigError, DataError, LoraError, ConversionError, PipelineError,
                UnsupportedModelError, RewardConfigError):
        assert issubclass(cls, UserError) and issubclass(cls, ValueError), cls
        assert exit_code(cls("x")) == 2
    assert issubclass(S3Error, UserError) and issubclass(S3Error, RuntimeError)
    assert issubclass(RewardServiceError, RunFailure) and issubclass(RewardServiceError, RuntimeError)
    assert exit_code(RewardServiceError("x")) == 1 and exit_code(ValueError("x")) is None
    assert issubclass(UserError, WfmError) and issubclass(RunFailure, WfmError)


def test_registries_and_the_schema_import_no_family_and_no_jax():
    code = ("import sys; import wfm_jax.families, converters.registry, wfm_jax.config.schema, "
            "reward_client.errors; "
            "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('wfm_jax.families.') "
            "or m.startswith('converters.') and m not in ('converters.registry', 'converters.table')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, check=True).stdout
    # the family packages' light __init__ (LoRA targets) only; no pipeline, converter or jax
    assert out.strip() == str(["wfm_jax.families.cosmos", "wfm_jax.families.sana",
                               "wfm_jax.families.sd3", "wfm_jax.families.wan"])


# ----------------------------------------------------------------------------- every entry resolves

def test_every_family_entry_resolves_to_its_family():
    from wfm_jax.config import schema

    assert FAMILIES.names() == ["cosmos", "sana", "sana_video", "sd3", "wan"]
    for name, cls in FAMILIES.items():
        assert issubclass(cls, PipelineFamily) and cls.family == name, name
        assert cls.trainable == ("transformer",) and cls.export_components() == cls.trainable
        assert cls.lora_targets and cls.tiny_writer, name
    assert fam.families()["sana_video"] == "SanaVideoPipeline"
    assert len(fam.supported_pipelines()) == len(FAMILIES)
    # the schema's names are the families' own lists, not copies
    assert schema.SD3_LORA_TARGETS is FAMILIES.get("sd3").lora_targets
    assert schema.WAN_LORA_TARGETS is FAMILIES.get("wan").lora_targets
    assert schema.COSMOS_LORA_TARGETS is FAMILIES.get("cosmos").lora_targets
    assert schema.SANA_LORA_TARGETS is FAMILIES.get("sana").lora_targets
    assert FAMILIES.get("sana_video").lora_targets is FAMILIES.get("sana").lora_targets
    assert tuple(schema.default_config().policy.lora.target_modules) == schema.SD3_LORA_TARGETS


def test_every_component_entry_resolves_to_its_spec():
    # at least the shipped specs (a test module may have registered its own toy class)
    assert set(COMPONENTS.names()) >= {
        "SD3Transformer2DModel", "AutoencoderKL", "AutoencoderKLWan", "AutoencoderDC",
        "CLIPTextModelWithProjection", "T5EncoderModel", "UMT5EncoderModel", "WanTransformer3DModel",
        "CosmosTransformer3DModel", "SanaTransformer2DModel", "SanaVideoTransformer3DModel",
        "Qwen2_5_VLForConditionalGeneration", "Gemma2Model", "Qwen3VLForConditionalGeneration"}
    for name, spec in COMPONENTS.items():
        assert isinstance(spec, ModelSpec) and spec.class_name == name, name
    assert spec_for({"architectures": ["T5EncoderModel"]}) is COMPONENTS.get("T5EncoderModel")
    with pytest.raises(UnsupportedModelError) as e:
        spec_for({"_class_name": "AutoencoderKLwan"})
    msg = str(e.value)
    assert msg.startswith("unsupported model class 'AutoencoderKLwan' (did you mean 'AutoencoderKLWan'?)")
    assert "; supported: AutoencoderDC, AutoencoderKL," in msg and "\n" not in msg


def test_unknown_family_names_the_nearest_and_the_known():
    with pytest.raises(PipelineError) as e:
        fam.family_named("sd35")
    assert str(e.value) == ("unknown model family 'sd35'; did you mean 'sd3'? "
                            "known: cosmos, sana, sana_video, sd3, wan")
    assert isinstance(e.value, UserError) and isinstance(e.value, ValueError)


# ----------------------------------------------------------------------------- a toy family

class Denoiser(nnx.Module):
    """velocity = latents * gain (per channel) + the prompt's context."""

    def __init__(self, in_channels: int, **_):
        self.gain = nnx.Param(jnp.zeros((in_channels,), jnp.float32))


class Scale(nnx.Module):
    def __init__(self, value: float):
        self.w = nnx.Param(jnp.asarray(value, jnp.float32))


class ToyPipeline(PipelineFamily):
    """An image family in a dozen lines: latents (B, 3, H/4, W/4), pixels their nearest upsample."""

    pipeline_class = "ToyDiffusionPipeline"
    family = "toy"
    trainable = ("denoiser",)
    lora_targets = ("gain",)
    default_steps, default_guidance = 3, 1.0

    def __init__(self, directory: str, gain: np.ndarray):
        self.directory = directory
        self.denoiser = Denoiser(**DENOISER_CONFIG)
        self.denoiser.gain[...] = jnp.asarray(gain)
        self.vae, self.text_encoders = Scale(1.0), (Scale(0.1),)
        self.transformer_config = dict(DENOISER_CONFIG)
        self.vae_config, self.scheduler_config = {}, {"shift": 1.0}

    @classmethod
    def write_tiny(cls, directory: str, seed: int = 0) -> None:
        os.makedirs(os.path.join(directory, "denoiser"))
        gain = np.random.default_rng(seed).uniform(-1.0, 0.0, CHANNELS).astype(np.float32)
        np.save(os.path.join(directory, "denoiser", "gain.npy"), gain)
        for name, config in (("denoiser", DENOISER_CONFIG), ("vae", VAE_CONFIG)):  # what plan reads
            os.makedirs(os.path.join(directory, name), exist_ok=True)
            with open(os.path.join(directory, name, "config.json"), "w") as f:
                json.dump(config, f)
        with open(os.path.join(directory, "model_index.json"), "w") as f:
            json.dump({"_class_name": cls.pipeline_class, "denoiser": ["wfm_jax", "Denoiser"]}, f)

    @classmethod
    def load(cls, directory, *, mesh=None, **options):
        pipe = cls(directory, np.load(os.path.join(directory, "denoiser", "gain.npy")))
        if mesh is not None:  # onto the trainer's mesh, replicated, as the real loaders place them
            sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            for module in (pipe.denoiser, pipe.vae, *pipe.text_encoders):
                state = nnx.state(module)
                nnx.update(module, jax.tree.map(lambda x: jax.device_put(x, sharding), state))
        return pipe

    @classmethod
    def make_component(cls, config, **options):
        return Denoiser(**config) if config["_class_name"] == "Denoiser" else Scale(config["value"])

    def cond_shapes(self, batch, text_len):
        return {"context": (batch, 1)}

    def export_trainable(self, module, directory):
        os.makedirs(directory, exist_ok=True)
        np.save(os.path.join(directory, "gain.npy"), np.asarray(module.gain[...], np.float32))

    def latent_shape(self, batch, height, width, frames=None):
        return (batch, CHANNELS, height // FACTOR, width // FACTOR)

    def tokenize(self, prompts, max_sequence_length):
        return {"ids": np.array([[len(p)] for p in prompts], np.int32)}

    def encode_text_with(self, text_encoders, ids, max_sequence_length):
        return {"context": jnp.asarray(ids["ids"], jnp.float32) * text_encoders[0].w[...]}

    def cond_from_embedding(self, embedding):
        return {"context": np.asarray(embedding, np.float32)}

    def velocity_with(self, denoiser, latents, timesteps, cond):
        gain = denoiser.gain[...][None, :, None, None]
        return latents * gain + cond["context"][:, :, None, None]

    def posterior_with(self, vae, pixels):
        mean = jnp.transpose(pixels[:, ::FACTOR, ::FACTOR], (0, 3, 1, 2)) * vae.w[...]
        return mean, jnp.zeros_like(mean)

    def normalize_latents(self, z):
        return z

    def decode_with(self, vae, latents):
        x = jnp.repeat(jnp.repeat(latents / vae.w[...], FACTOR, -1), FACTOR, -2)
        return jnp.clip(jnp.transpose(x, (0, 2, 3, 1)) / 2 + 0.5, 0.0, 1.0)


@pytest.fixture
def toy_family():
    FAMILIES.register("toy", ToyPipeline)
    yield ToyPipeline
    FAMILIES.unregister("toy")
    assert "toy" not in FAMILIES


def test_a_registered_family_is_found_built_and_loaded(tmp_path, toy_family):
    from wfm_jax.families.tiny import build_tiny_pipeline

    assert fam.family_named("toy") is ToyPipeline
    assert fam.families()["toy"] == "ToyDiffusionPipeline"
    assert "ToyDiffusionPipeline" in fam.supported_pipelines()
    path = build_tiny_pipeline(str(tmp_path / "toy"), seed=3, family="toy")
    assert fam.family_class(path) is ToyPipeline
    pipe = fam.load_pipeline(path, family="toy")
    want = np.random.default_rng(3).uniform(-1.0, 0.0, CHANNELS).astype(np.float32)
    assert pipe.trainable_module() is pipe.denoiser
    np.testing.assert_array_equal(np.asarray(pipe.trainable_module().gain[...]), want)
    shell = pipe.shell()  # the trained component is dropped whatever its name
    assert shell.denoiser is None and pipe.denoiser is not None
    assert shell.static_key() == pipe.static_key()
    module = pipe.trainable_module()
    pipe.set_trainable_module(None)  # what a trainer does once the module lives in its state
    assert pipe.denoiser is None and pipe.trainable_module() is None
    pipe.set_trainable_module(module)
    with pytest.raises(PipelineError, match="holds a ToyDiffusionPipeline .'toy' family. but the "
                                            "recipe is for the 'sd3' family"):
        fam.load_pipeline(path, family="sd3")


def test_the_recipe_check_reads_the_registry(toy_family):
    from wfm_jax.config.base import ConfigError
    from wfm_jax.config.checks import check_family
    from wfm_jax.config.schema import default_config

    c = default_config()
    c.policy.family = "toy"
    check_family(c)  # accepted once registered: no list of families in the schema
    c.policy.family = "toyy"
    with pytest.raises(ConfigError, match=r"'policy.family' = 'toyy' is not one of \[.*'toy'.*\]; "
                                          r"did you mean 'toy'\?"):
        check_family(c)


def test_generate_samples_the_trainable_module(tmp_path, toy_family):
    """programs.sample.generate on the toy family equals Euler on its linear velocity in numpy."""
    from wfm_jax.families.tiny import build_tiny_pipeline
    from wfm_jax.programs.sample import generate
    from wfm_jax.sampling.schedule import flow_sigmas

    pipe = fam.load_pipeline(build_tiny_pipeline(str(tmp_path / "toy"), seed=1, family="toy"))
    prompts, steps, size = ["a cat", "a red dog"], 3, 8
    images = generate(pipe, prompts, steps=steps, guidance=1.0, height=size, width=size, seed=5)

    x = np.asarray(jax_normal(5, (2, CHANNELS, size // FACTOR, size // FACTOR)), np.float64)
    gain = np.asarray(pipe.denoiser.gain[...], np.float64)[None, :, None, None]
    context = 0.1 * np.array([len(p) for p in prompts], np.float64)[:, None, None, None]
    sigmas = flow_sigmas(steps, 1.0)[0]
    for s, s_next in itertools.pairwise(sigmas):
        x = x + (s_next - s) * (x * gain + context)
    want = np.clip(np.transpose(x.repeat(FACTOR, -1).repeat(FACTOR, -2), (0, 2, 3, 1)) / 2 + 0.5, 0, 1)
    assert images.shape == (2, size, size, 3)
    np.testing.assert_allclose(images, want, atol=2e-5)


def jax_normal(seed: int, shape) -> np.ndarray:
    """The initial noise generate draws (jax.random.normal of key(seed))."""
    import jax
    return np.asarray(jax.random.normal(jax.random.key(seed), shape, jnp.float32))


def test_a_family_training_two_components_says_so(tmp_path):
    class TwoTrained(ToyPipeline):
        family, trainable = "toy2", ("denoiser", "vae")

    TwoTrained.write_tiny(str(tmp_path))
    pipe = TwoTrained.load(str(tmp_path))
    assert TwoTrained.export_components() == ("denoiser", "vae")
    with pytest.raises(PipelineError, match=r"the 'toy2' family trains \['denoiser', 'vae'\]"):
        pipe.trainable_module()
    shell = pipe.shell()
    assert shell.denoiser is None and shell.vae is None


def test_a_family_without_a_tiny_twin_says_so(tmp_path, toy_family):
    from wfm_jax.families.tiny import build_tiny_pipeline

    class NoTwin(ToyPipeline):
        family = "notwin"
        write_tiny = classmethod(PipelineFamily.write_tiny.__func__)  # the base's: no tiny_writer

    FAMILIES.register("notwin", NoTwin)
    try:
        with pytest.raises(PipelineError, match="the 'notwin' family has no tiny twin"):
            build_tiny_pipeline(str(tmp_path / "x"), family="notwin")
        assert not os.path.exists(tmp_path / "x")  # nothing half-written
    finally:
        FAMILIES.unregister("notwin")


@pytest.mark.parametrize("name", ["sd3", "wan", "cosmos", "sana", "sana_video"])
def test_weightless_instances_hold_the_released_configs(name):
    """What plan and bench build their programs on: each family from configs alone (the
    released presets of programs.released), with nothing loaded and its geometry answering."""
    from wfm_jax.programs.released import released_configs

    cls = FAMILIES.get(name)
    configs = released_configs(name, "2B")
    pipe = cls.weightless(configs, directory="/nowhere")
    assert pipe.trainable_module() is None and pipe.vae is None and pipe.text_encoders == ()
    assert pipe.transformer_config == configs["transformer"]
    assert hash(pipe.static_key()) == hash(pipe.shell().static_key())
    frames = 81 if cls.is_video else None
    shape = pipe.latent_shape(2, 480, 832, frames=frames)
    assert shape[0] == 2 and len(shape) == (5 if cls.is_video else 4)
    cond = pipe.cond_shapes(2, 16)  # what the planner compiles the programs on
    assert cond and all(s[0] == 2 and len(s) in (2, 3) for s in cond.values()), cond
    if name.startswith("sana"):
        assert pipe.instruction == tuple(cls.instruction_default)
