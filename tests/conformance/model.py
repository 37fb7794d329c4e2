"""ModelConformance: the checks every converted transformer inherits (diffusers-style mixin).

On top of ConverterConformance (table, round trip, bad checkpoints) a transformer test gets:
  - the fp32 forward equals the diffusers module on identical weights (atol 2e-5), per variant;
  - bf16 compute (fp32 master weights) stays within 2% of fp32 and, where diffusers runs in bf16
    (its fp32 modules kept, as from_pretrained does), no further from fp32 than twice diffusers;
  - every parameter carries logical axes, one per dimension, and the named ones are as stated;
  - the converter CLI round trip is bit-identical, loads in diffusers, and a missing key is one
    line naming it with nothing written;
  - each remat option checkpoints every block with its policy; remat values and grads equal
    remat none; scanned blocks equal the unrolled loop;
  - the forward on an 8-device (data, fsdp, context) mesh equals diffusers;
  - a bad remat or attention option is one ValueError naming it.

A model test fills in the fixture (ConverterConformance's and the one below) and `inputs`.
"""
from __future__ import annotations

import copy
import json
import os
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors import safe_open

from tests.conformance.converter import ConverterConformance
from wfm_jax.core.tree import flat_params
from wfm_jax.models.layers.norms import KEEP_NORM_STATS
from wfm_jax.models.layers.remat import REMAT_POLICIES, check_remat, rematerialises

ATOL = 2e-5
# bf16 compute vs fp32, relative to the output's max magnitude: bf16 keeps 8 significant bits
# (~4e-3 per rounding); ~10 chained matmul/attention roundings in these tiny models measure
# under 1%, so 2% leaves room yet catches a wrong cast.
BF16_REL_TOL = 2e-2


def eqns(jaxpr):
    """Every equation of a jaxpr, nested ones (scan, checkpoint, pjit bodies) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    yield from eqns(sub)


def _checkpoint_eqns(jaxpr, norms: bool) -> list:
    return [e for e in eqns(jaxpr) if e.primitive.name in ("checkpoint", "remat2")
            and (e.params["policy"] is KEEP_NORM_STATS) == norms]


def checkpoints(jaxpr) -> list:
    """The per-block remat checkpoints (not the norms' own: layers/norms.py KEEP_NORM_STATS)."""
    return _checkpoint_eqns(jaxpr, norms=False)


def norm_checkpoints(jaxpr) -> list:
    """The norms' and modulation helpers' own checkpoints (layers/norms.py KEEP_NORM_STATS)."""
    return _checkpoint_eqns(jaxpr, norms=True)


def to_torch(args, kwargs):
    t = lambda a: torch.from_numpy(np.asarray(a)) if isinstance(a, np.ndarray) else a
    return [t(a) for a in args], {k: t(v) for k, v in kwargs.items()}


def torch_forward(model, args, kwargs) -> np.ndarray:
    targs, tkwargs = to_torch(args, kwargs)
    with torch.no_grad():
        return model(*targs, **tkwargs, return_dict=False)[0].float().numpy()


def split_static(kwargs: dict) -> tuple[dict, dict]:
    """Arrays are traced; Python values (Cosmos' fps) stay static."""
    arrays = {k: v for k, v in kwargs.items() if isinstance(v, np.ndarray | jax.Array)}
    return arrays, {k: v for k, v in kwargs.items() if k not in arrays}


def jit_forward(model):
    """(args, kwargs) -> numpy output, the model's state an argument of one jit."""
    graph, state = nnx.split(model)

    def run(args, kwargs):
        arrays, static = split_static(kwargs)
        fn = jax.jit(lambda s, a, kw: nnx.merge(graph, s)(*a, **kw, **static))
        return np.asarray(fn(state, tuple(args), arrays))

    return run


def place_on(model, mesh):
    """Split the model and put every parameter on its logical sharding over mesh."""
    from wfm_jax.core.mesh import param_shardings
    graph, state = nnx.split(model)
    shardings = param_shardings(model, mesh)
    for path, var in nnx.to_flat_state(state):
        var.set_value(jax.device_put(var.get_value(), shardings[".".join(map(str, path))]))
    return graph, state


def raw_safetensors(directory) -> dict:
    out = {}
    with safe_open(os.path.join(directory, "diffusion_pytorch_model.safetensors"), "numpy") as f:
        for key in f.keys():
            piece = f.get_slice(key)
            out[key] = (piece.get_dtype(), tuple(piece.get_shape()), f.get_tensor(key).tobytes())
    return out


def repeat_batch(args, kwargs, times: int):
    if times == 1:
        return args, kwargs
    rep = lambda v: np.concatenate([v] * times) if np.ndim(v) else v
    return [rep(a) for a in args], {k: rep(v) for k, v in kwargs.items()}


class ModelConformance(ConverterConformance):
    # ------------------------------------------------------------- the fixture a test fills in
    bf16_variant: str | None = None  # None: the first variant
    bf16_vs_diffusers = True  # also bound bf16 by diffusers' own bf16 error
    axes_config: ClassVar[dict] = {}  # overrides of base for the logical-axes check
    expected_axes: ClassVar[dict[str, tuple]] = {}  # parameter -> its logical axes
    cli_variant: str | None = None  # the variant the CLI round trip converts
    cli_missing_key: str = ""  # the key the CLI must name when it is missing
    remat_options: tuple[str, ...] = ("everything_saveable", "nothing_saveable",
                                      "dots_with_no_batch_dims_saveable")
    remat_config: ClassVar[dict] = {}  # overrides of base for the remat jaxpr check
    remat_variant: str | None = None  # the variant whose grads are compared ...
    remat_grad_option = "nothing_saveable"  # ... under this option against no remat
    remat_scan_steps = 0  # > 0: the forward runs inside a lax.scan of this length (the rollout)
    scan_variant: str | None = None
    sharded_variant: str | None = None
    sharded_param: str = ""  # a kernel that must end up split over fsdp
    sharded_batch_repeat = 1  # repeat the batch so it divides data x fsdp
    attention_impl_match = "cudnn"
    slow_tests: frozenset[str] = frozenset()  # marked slow (tests/models/conftest.py)

    def inputs(self, variant: str, config: dict) -> tuple[list, dict]:
        """The forward's (positional, keyword) inputs as numpy, diffusers' layout."""
        raise NotImplementedError

    def torch_bf16_inputs(self, args, kwargs):
        """Inputs for diffusers' bf16 model: floating tensors in bf16, the rest as they are."""
        cast = lambda t: t.bfloat16() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        targs, tkwargs = to_torch(args, kwargs)
        return [cast(a) for a in targs], {k: cast(v) for k, v in tkwargs.items()}

    def check_torch_bf16(self, model) -> None:
        """Extra assertions on diffusers' bf16 model."""

    def check_axes(self, params: dict) -> None:
        """Extra assertions on the parameters' logical axes."""

    def check_remat_jaxpr(self, model, jaxpr, remat: str) -> None:
        """Default: one checkpoint per block, with the option's policy."""
        found = checkpoints(jaxpr)
        if not rematerialises(remat):
            assert not found
        else:
            assert len(found) == {**self.base, **self.remat_config}["num_layers"]
            assert all(e.params["policy"] is REMAT_POLICIES[check_remat(remat)] for e in found)

    # ------------------------------------------------------------------------------- machinery
    def extend_case(self, case: dict) -> None:
        args, kwargs = self.inputs(case["variant"], case["config"])
        case.update(args=args, kwargs=kwargs,
                    want=torch_forward(case["torch_model"], args, kwargs))

    def first(self, name: str | None) -> str:
        return name or next(iter(self.variants))

    # ---------------------------------------------------------------------------------- checks
    def test_forward_matches_diffusers_fp32(self, variant):
        case = self.case(variant)
        got = jit_forward(self.jax_model(case["config"], case["tensors"]))(case["args"],
                                                                           case["kwargs"])
        assert got.shape == case["want"].shape
        err = float(np.max(np.abs(got - case["want"])))
        print(f"{type(self).__name__} {variant} fp32 max abs err {err:.3g}")
        assert err <= ATOL, f"{variant}: max abs diff {err:.3g}"

    def test_bf16_compute_close_to_fp32_and_to_diffusers_bf16(self, tmp_path):
        case = self.case(self.first(self.bf16_variant))
        model = self.jax_model(case["config"], case["tensors"], dtype=jnp.bfloat16)
        got = jit_forward(model)(case["args"], case["kwargs"])
        assert got.dtype == jnp.bfloat16
        got, want = got.astype(np.float32), case["want"]
        scale = np.max(np.abs(want))
        rel = np.max(np.abs(got - want)) / scale
        assert np.all(np.isfinite(got)) and rel <= BF16_REL_TOL, rel
        if not self.bf16_vs_diffusers:
            return
        case["torch_model"].save_pretrained(tmp_path)
        ref = self.torch_class.from_pretrained(str(tmp_path), torch_dtype=torch.bfloat16)
        self.check_torch_bf16(ref)
        targs, tkwargs = self.torch_bf16_inputs(case["args"], case["kwargs"])
        with torch.no_grad():
            theirs = ref(*targs, **tkwargs, return_dict=False)[0].float().numpy()
        ref_rel = np.max(np.abs(theirs - want)) / scale
        print(f"bf16 rel err: wfm_jax {rel:.3g}, diffusers {ref_rel:.3g}")
        assert rel <= 2 * ref_rel, (rel, ref_rel)

    def test_every_parameter_has_logical_axes(self):
        params = flat_params(self.abstract({**self.base, **self.axes_config}))
        for key, var in params.items():
            axes = getattr(var, "out_sharding", None)
            assert axes is not None and len(axes) == len(var.shape), key
        for key, axes in self.expected_axes.items():
            assert params[key].out_sharding == axes, key
        self.check_axes(params)

    def test_cli_round_trip_bit_identical(self, tmp_path, capsys, dtype):
        from converters import jax_state
        from converters.cli import main as converters_main
        torch_model = copy.deepcopy(self.case(self.first(self.cli_variant))["torch_model"])
        src = tmp_path / "src"
        torch_model.to(getattr(torch, dtype)).save_pretrained(src)
        assert converters_main(["to-jax", str(src), str(tmp_path / "jax")]) == 0
        stored = {np.dtype(d).name for _, d in jax_state.state_meta(str(tmp_path / "jax")).values()}
        assert stored == {dtype}
        assert converters_main(["to-diffusers", str(tmp_path / "jax"), str(tmp_path / "back")]) == 0
        assert raw_safetensors(src) == raw_safetensors(tmp_path / "back")
        config = json.loads((tmp_path / "back" / "config.json").read_text())
        assert config["_class_name"] == self.torch_class.__name__
        self.torch_class.from_pretrained(str(tmp_path / "back"))  # diffusers loads it
        from safetensors.numpy import load_file, save_file
        tensors = load_file(str(src / "diffusion_pytorch_model.safetensors"))
        del tensors[self.cli_missing_key]
        save_file(tensors, str(src / "diffusion_pytorch_model.safetensors"))
        capsys.readouterr()
        assert converters_main(["to-jax", str(src), str(tmp_path / "bad")]) == 1
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and self.cli_missing_key in err
        assert not (tmp_path / "bad").exists()

    def test_remat_checkpoints_each_block_with_its_policy(self, remat):
        config = {**self.base, **self.remat_config}
        model = self.abstract(config, remat=remat)
        graph, state = nnx.split(model)
        args, kwargs = self.inputs(self.first(None), config)
        arrays, static = split_static(kwargs)
        jaxpr = jax.make_jaxpr(lambda s, a, kw: nnx.merge(graph, s)(*a, **kw, **static))(
            state, tuple(args), arrays).jaxpr
        self.check_remat_jaxpr(model, jaxpr, remat)

    def test_remat_matches_no_remat_values_and_grads(self):
        case = self.case(self.first(self.remat_variant))
        args, kwargs = case["args"], case["kwargs"]
        arrays, static = split_static(kwargs)

        def value_and_grad(remat):
            graph, state = nnx.split(self.jax_model(case["config"], case["tensors"], remat=remat))
            forward = lambda s, a: nnx.merge(graph, s)(*a, **arrays, **static)
            if not self.remat_scan_steps:
                loss = lambda s: jnp.sum(forward(s, args) ** 2)
            else:  # as the RL rollout: the model merged inside a lax.scan under jit
                step = lambda s: lambda x, _: (forward(s, [x, *args[1:]]), None)
                loss = lambda s: jnp.sum(jax.lax.scan(step(s), args[0], None,
                                                      length=self.remat_scan_steps)[0] ** 2)
            return jax.jit(jax.value_and_grad(loss))(state)

        (v0, g0), (v1, g1) = value_and_grad("everything_saveable"), value_and_grad(self.remat_grad_option)
        np.testing.assert_allclose(v1, v0, rtol=1e-5)
        for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0), strict=True):
            # recompute order changes fp32 rounding
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6 * float(np.abs(b).max()) + 1e-7)

    def test_scan_equals_unrolled(self):
        case = self.case(self.first(self.scan_variant))
        outs = [jit_forward(self.jax_model(case["config"], case["tensors"], scan_layers=scan))(
            case["args"], case["kwargs"]) for scan in (True, False)]
        np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-6)
        assert float(np.max(np.abs(outs[0] - case["want"]))) <= ATOL

    @pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (host) devices")
    def test_sharded_forward_matches_diffusers(self):
        """Weights on their logical shards (embed over fsdp), batch over data, tokens over
        context: the numbers must not move."""
        from wfm_jax.core.mesh import make_mesh
        case = self.case(self.first(self.sharded_variant))
        mesh = make_mesh(data=2, fsdp=2, context=2)
        graph, state = place_on(self.jax_model(case["config"], case["tensors"]), mesh)
        placed = {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(state)}
        assert "fsdp" in str(placed[self.sharded_param].sharding.spec)
        args, kwargs = repeat_batch(case["args"], case["kwargs"], self.sharded_batch_repeat)
        arrays, static = split_static(kwargs)
        with jax.set_mesh(mesh):
            fn = jax.jit(lambda s, a, kw: nnx.merge(graph, s)(*a, **kw, **static))
            got = np.asarray(fn(state, tuple(args), arrays))
        want = np.concatenate([case["want"]] * self.sharded_batch_repeat)
        err = float(np.max(np.abs(got - want)))
        assert err <= ATOL, err

    def test_bad_options_fail_clearly(self):
        with pytest.raises(ValueError, match="remat"):
            self.abstract(self.base, remat="some")
        with pytest.raises(ValueError, match=self.attention_impl_match):
            self.abstract(self.base, attention_impl="cudnn")
