"""ConverterConformance: the checks every converted model shares (transformers, VAEs).

A test class fills in the fixture below (the diffusers class, the converter's build_table and
make_model, the tiny configs as variants) and inherits: the table maps every diffusers key and
every model parameter exactly once; the round trip diffusers -> wfm_jax -> diffusers is
bit-identical (fp32 and bf16) and loads back into diffusers strictly; a bad checkpoint (missing,
unexpected or wrongly shaped key, another config's checkpoint) is one ConversionError naming it.
"""
from __future__ import annotations

import itertools
import re
from typing import ClassVar

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from flax import nnx

from converters.table import ConversionError, convert_to_diffusers, convert_to_jax
from wfm_jax.core.abstract import abstract_module
from wfm_jax.core.tree import flat_arrays, flat_params, flat_shapes

# (test class, variant) -> the torch model, its fp32 tensors and whatever the class adds
_CASES: dict = {}


def loaders(tensors: dict) -> dict:
    return {k: (lambda v=v: v) for k, v in tensors.items()}


def numpy_state(model: torch.nn.Module, dtype=torch.float32) -> dict[str, np.ndarray]:
    """The state dict as numpy, bf16 through ml_dtypes (numpy has no bfloat16 of its own)."""
    out = {}
    for k, v in model.state_dict().items():
        v = v.detach().to(dtype).contiguous()
        out[k] = (v.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if dtype == torch.bfloat16
                  else v.numpy())
    return out


def torch_state(tensors: dict, dtype: str) -> dict[str, torch.Tensor]:
    return {k: (torch.from_numpy(v.view(np.int16).copy()).view(torch.bfloat16)
                if dtype == "bfloat16" else torch.from_numpy(v.copy())) for k, v in tensors.items()}


def randomise(model: torch.nn.Module, scale: float = 0.1) -> torch.nn.Module:
    """Every weight re-drawn (diffusers zero-inits modulation and output layers, which would hide
    a swapped mapping): norm weights near 1, everything else near 0."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            base = 1.0 if p.ndim == 1 and bool((p == 1).all()) else 0.0
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))
    return model


def _names(pattern: str) -> str:
    return re.escape(pattern)


class ConverterConformance:
    # ------------------------------------------------------------- the fixture a test fills in
    torch_class: type  # the diffusers module
    base: ClassVar[dict] = {}  # the tiny config
    variants: ClassVar[dict[str, dict]] = {"base": {}}  # name -> overrides of base
    config_from_torch = False  # use diffusers' full config (its defaults filled in), as VAEs do
    table_configs: ClassVar[dict[str, dict] | None] = None  # tables checked; None: variants'
    round_trip_cases: ClassVar[list[tuple[str, str]] | None] = None  # (variant, dtype); None: all
    bad_checkpoint_variant: str | None = None  # None: the first variant
    missing_key: str  # a diffusers key the bad-checkpoint test drops ...
    wrong_shape: tuple[str, tuple]  # ... and one it reshapes
    unexpected_key: str | None = None  # an extra key it adds (its value: missing_key's)
    other_variant: str | None = None  # a variant whose checkpoint this table must refuse ...
    other_match: str = ""  # ... with an error naming this

    @staticmethod
    def build_table(config: dict):
        raise NotImplementedError

    @staticmethod
    def make_model(config: dict, **kw):
        raise NotImplementedError

    def build_torch(self, config: dict) -> torch.nn.Module:
        """The randomised diffusers model of a config."""
        torch.manual_seed(0)
        return randomise(self.torch_class(**config).eval())

    def extend_case(self, case: dict) -> None:
        """Add the class's reference outputs to a freshly built case (ModelConformance does)."""

    # ------------------------------------------------------------------------------- machinery
    def pytest_generate_tests(self, metafunc):
        names = metafunc.fixturenames
        if "variant" in names and "dtype" in names:
            cases = self.round_trip_cases or list(itertools.product(self.variants,
                                                                    ("float32", "bfloat16")))
            metafunc.parametrize("variant, dtype", cases, ids=[f"{v}-{d}" for v, d in cases])
        elif "variant" in names:
            metafunc.parametrize("variant", list(self.variants))
        elif "dtype" in names:
            metafunc.parametrize("dtype", ["float32", "bfloat16"])
        if "table_config" in names:
            configs = self.table_configs or self.variants
            metafunc.parametrize("table_config", list(configs.values()), ids=list(configs))
        if "remat" in names:
            metafunc.parametrize("remat", list(self.remat_options))

    def config(self, variant: str) -> dict:
        return {**self.base, **self.variants[variant]}

    def case(self, variant: str) -> dict:
        """Built once per (class, variant): the torch model and its fp32 numpy tensors."""
        key = (type(self), variant)
        if key not in _CASES:
            config = self.config(variant)
            model = self.build_torch(config)
            config = dict(model.config) if self.config_from_torch else config
            case = dict(variant=variant, config=config, torch_model=model,
                        tensors=numpy_state(model))
            self.extend_case(case)
            _CASES[key] = case
        return _CASES[key]

    def abstract(self, config: dict, **kw):
        """The model without random init (that costs one compile per shape)."""
        return abstract_module(lambda: self.make_model(config, rngs=nnx.Rngs(0), **kw))

    def jax_model(self, config: dict, tensors: dict, *, dtype=None, param_dtype=jnp.float32,
                  **options):
        """Checkpoint -> table -> model."""
        model = self.abstract(config, dtype=dtype, param_dtype=param_dtype, **options)
        flat = convert_to_jax(self.build_table(config), loaders(tensors), flat_shapes(model))
        params = flat_params(model)
        assert set(params) == set(flat)
        for key, var in params.items():
            var.set_value(jnp.asarray(flat[key], param_dtype))
        return model

    # ---------------------------------------------------------------------------------- checks
    def test_table_maps_every_key_exactly_once(self, table_config):
        config = {**self.base, **table_config}
        reference = self.torch_class.from_config(config)
        config = dict(reference.config) if self.config_from_torch else config
        table = self.build_table(config)
        assert len({r.hf for r in table}) == len(table) == len({r.jax for r in table})
        assert {r.hf for r in table} == set(reference.state_dict())
        shapes = flat_shapes(self.abstract(config))
        assert {r.jax for r in table} == set(shapes)
        convert_to_jax(table, loaders(numpy_state(reference)), shapes)  # and the shapes agree

    def test_round_trip_is_bit_identical_and_loads_in_diffusers(self, variant, dtype):
        case = self.case(variant)
        torch_dtype = getattr(torch, dtype)
        tensors = numpy_state(case["torch_model"], torch_dtype)
        model = self.jax_model(case["config"], tensors, param_dtype=jnp.dtype(dtype))
        back = convert_to_diffusers(self.build_table(case["config"]), flat_arrays(model))
        assert set(back) == set(tensors)
        for key, value in tensors.items():
            assert back[key].dtype == value.dtype and back[key].shape == value.shape, key
            assert back[key].tobytes() == value.tobytes(), f"{key} changed in the round trip"
        reloaded = self.torch_class.from_config(case["config"]).to(torch_dtype)
        reloaded.load_state_dict(torch_state(back, dtype), strict=True)
        again = numpy_state(reloaded, torch_dtype)
        assert all(again[k].tobytes() == v.tobytes() for k, v in tensors.items())

    def test_bad_checkpoints_name_the_key(self):
        case = self.case(self.bad_checkpoint_variant or next(iter(self.variants)))
        config, tensors = case["config"], case["tensors"]
        table = self.build_table(config)
        shapes = flat_shapes(self.abstract(config))
        key = self.missing_key
        assert key in tensors
        missing = {k: v for k, v in tensors.items() if k != key}
        with pytest.raises(ConversionError, match="missing keys: .*" + _names(key)):
            convert_to_jax(table, loaders(missing), shapes)
        if self.unexpected_key:
            extra = {**tensors, self.unexpected_key: tensors[key]}
            with pytest.raises(ConversionError,
                               match="unexpected keys: .*" + _names(self.unexpected_key)):
                convert_to_jax(table, loaders(extra), shapes)
        shape_key, shape = self.wrong_shape
        assert tensors[shape_key].shape != shape
        wrong = {**tensors, shape_key: np.zeros(shape, np.float32)}
        with pytest.raises(ConversionError, match="wrong shape for " + _names(shape_key)):
            convert_to_jax(table, loaders(wrong), shapes)
        if self.other_variant:  # another config's checkpoint has keys this table does not know
            with pytest.raises(ConversionError, match=self.other_match):
                convert_to_jax(table, loaders(self.case(self.other_variant)["tensors"]), shapes)
