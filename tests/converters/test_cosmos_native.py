"""cosmos-rl native `.pt` checkpoints <-> diffusers CosmosTransformer3DModel (spec cosmos_rl_wfm.md
§4): round trips bit-exact both ways, the diffusers side loads (strictly) in diffusers and runs the
same forward, the native side loads strictly into a torch module built to cosmos-rl's native key
layout, names follow the spec's rename list, the config is read off the shapes, and bad input
(DCP dirs, non-checkpoints, unknown keys, no torch) is one line with a non-zero exit.

The native module and the name mapping below are written from the spec, independently of
converters/cosmos_native.py. Sizes: the tiny Cosmos twin's transformer (wfm_jax/tiny_cosmos.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
from diffusers import CosmosTransformer3DModel  # noqa: E402
from diffusers.models.transformers import transformer_cosmos  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch import nn  # noqa: E402

from converters import cosmos_native  # noqa: E402
from converters.cli import main  # noqa: E402
from converters.table import ConversionError  # noqa: E402

# the tiny twin's transformer (tiny_cosmos.transformer_config)
TINY = {"in_channels": 5, "out_channels": 4, "num_attention_heads": 2, "attention_head_dim": 12,
        "num_layers": 2, "mlp_ratio": 2.0, "text_embed_dim": 16, "adaln_lora_dim": 8,
        "max_size": [8, 32, 32], "patch_size": [1, 2, 2], "rope_scale": [1.0, 3.0, 3.0],
        "concat_padding_mask": True, "extra_pos_embed_type": None, "use_crossattn_projection": True,
        "crossattn_proj_in_channels": 64, "encoder_hidden_states_channels": 16}
# the released Predict2.5 2B / 14B nets (spec §4)
P25_2B = dict(TINY, in_channels=17, out_channels=16, num_attention_heads=16, attention_head_dim=128,
              num_layers=28, mlp_ratio=4.0, text_embed_dim=1024, adaln_lora_dim=256,
              max_size=[128, 240, 240], crossattn_proj_in_channels=100352,
              encoder_hidden_states_channels=1024)
P25_14B = dict(P25_2B, num_attention_heads=40, num_layers=36)
# spec §4, applied in this order as substring replacements after stripping `net.`
SPEC_RENAMES = [
    ("t_embedder.1", "time_embed.t_embedder"), ("t_embedding_norm", "time_embed.norm"),
    ("blocks", "transformer_blocks"),
    ("adaln_modulation_self_attn.1", "norm1.linear_1"), ("adaln_modulation_self_attn.2", "norm1.linear_2"),
    ("adaln_modulation_cross_attn.1", "norm2.linear_1"), ("adaln_modulation_cross_attn.2", "norm2.linear_2"),
    ("adaln_modulation_mlp.1", "norm3.linear_1"), ("adaln_modulation_mlp.2", "norm3.linear_2"),
    ("self_attn", "attn1"), ("cross_attn", "attn2"), ("q_proj", "to_q"), ("k_proj", "to_k"),
    ("v_proj", "to_v"), ("output_proj", "to_out.0"), ("q_norm", "norm_q"), ("k_norm", "norm_k"),
    ("mlp.layer1", "ff.net.0.proj"), ("mlp.layer2", "ff.net.2"), ("x_embedder.proj.1", "patch_embed.proj"),
    ("final_layer.adaln_modulation.1", "norm_out.linear_1"),
    ("final_layer.adaln_modulation.2", "norm_out.linear_2"), ("final_layer.linear", "proj_out")]
DROPPED = ("pos_embedder.seq", "pos_embedder.dim_spatial_range", "pos_embedder.dim_temporal_range",
           "accum_video_sample_counter", "accum_image_sample_counter", "accum_iteration",
           "accum_train_in_hours")
# rows of the spec §4 table: native (after `net.`), diffusers, shape (2B)
SPEC_ROWS = [
    ("x_embedder.proj.1.weight", "patch_embed.proj.weight", (2048, 72)),
    ("t_embedder.1.linear_1.weight", "time_embed.t_embedder.linear_1.weight", (2048, 2048)),
    ("t_embedder.1.linear_2.weight", "time_embed.t_embedder.linear_2.weight", (6144, 2048)),
    ("t_embedding_norm.weight", "time_embed.norm.weight", (2048,)),
    ("crossattn_proj.0.weight", "crossattn_proj.0.weight", (1024, 100352)),
    ("crossattn_proj.0.bias", "crossattn_proj.0.bias", (1024,)),
    ("blocks.0.adaln_modulation_self_attn.1.weight", "transformer_blocks.0.norm1.linear_1.weight",
     (256, 2048)),
    ("blocks.0.adaln_modulation_self_attn.2.weight", "transformer_blocks.0.norm1.linear_2.weight",
     (6144, 256)),
    ("blocks.0.self_attn.q_proj.weight", "transformer_blocks.0.attn1.to_q.weight", (2048, 2048)),
    ("blocks.0.self_attn.q_norm.weight", "transformer_blocks.0.attn1.norm_q.weight", (128,)),
    ("blocks.0.self_attn.output_proj.weight", "transformer_blocks.0.attn1.to_out.0.weight", (2048, 2048)),
    ("blocks.0.cross_attn.k_proj.weight", "transformer_blocks.0.attn2.to_k.weight", (2048, 1024)),
    ("blocks.27.adaln_modulation_mlp.1.weight", "transformer_blocks.27.norm3.linear_1.weight", (256, 2048)),
    ("blocks.27.mlp.layer1.weight", "transformer_blocks.27.ff.net.0.proj.weight", (8192, 2048)),
    ("blocks.27.mlp.layer2.weight", "transformer_blocks.27.ff.net.2.weight", (2048, 8192)),
    ("final_layer.adaln_modulation.2.weight", "norm_out.linear_2.weight", (4096, 256)),
    ("final_layer.linear.weight", "proj_out.weight", (64, 2048))]


# ---- cosmos-rl's net, as spec §4 describes its state dict ----------------------------------------

def _lin(i, o, bias=False):
    return nn.Linear(i, o, bias=bias)


class _Attn(nn.Module):
    def __init__(self, d, kv, head_dim):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = _lin(d, d), _lin(kv, d), _lin(kv, d)
        self.q_norm, self.k_norm = nn.RMSNorm(head_dim), nn.RMSNorm(head_dim)
        self.output_proj = _lin(d, d)


class _Block(nn.Module):
    def __init__(self, c, d):
        super().__init__()
        lora = c["adaln_lora_dim"]
        self.self_attn = _Attn(d, d, c["attention_head_dim"])
        self.cross_attn = _Attn(d, c["text_embed_dim"], c["attention_head_dim"])
        self.mlp = nn.Module()
        ff = int(d * c["mlp_ratio"])
        self.mlp.layer1, self.mlp.layer2 = _lin(d, ff), _lin(ff, d)
        for name in ("self_attn", "cross_attn", "mlp"):  # LayerNorms: no affine parameters
            setattr(self, f"adaln_modulation_{name}",
                    nn.Sequential(nn.SiLU(), _lin(d, lora), _lin(lora, 3 * d)))


class NativeNet(nn.Module):
    """Module tree with cosmos-rl's MiniTrainDIT key layout (parameters and persistent buffers)."""

    def __init__(self, c):
        super().__init__()
        hd, lora = c["attention_head_dim"], c["adaln_lora_dim"]
        d = c["num_attention_heads"] * hd
        p = c["patch_size"][0] * c["patch_size"][1] * c["patch_size"][2]
        self.x_embedder = nn.Module()
        self.x_embedder.proj = nn.Sequential(nn.Identity(), _lin((c["in_channels"] + 1) * p, d))
        self.pos_embedder = nn.Module()
        dim_h = hd // 6 * 2
        dim_t = hd - 2 * dim_h
        grid = max(m // q for m, q in zip(c["max_size"], c["patch_size"], strict=True))
        self.pos_embedder.register_buffer("seq", torch.arange(grid, dtype=torch.float32))
        for name, dim in (("dim_spatial_range", dim_h), ("dim_temporal_range", dim_t)):
            self.pos_embedder.register_buffer(name, torch.arange(0, dim, 2)[: dim // 2].float() / dim)
        emb = nn.Module()
        emb.linear_1, emb.linear_2 = _lin(d, d), _lin(d, 3 * d)
        self.t_embedder = nn.Sequential(nn.Identity(), emb)
        self.t_embedding_norm = nn.RMSNorm(d)
        self.blocks = nn.ModuleList(_Block(c, d) for _ in range(c["num_layers"]))
        self.final_layer = nn.Module()
        self.final_layer.linear = _lin(d, p * c["out_channels"])
        self.final_layer.adaln_modulation = nn.Sequential(nn.SiLU(), _lin(d, lora), _lin(lora, 2 * d))
        if c["use_crossattn_projection"]:
            self.crossattn_proj = nn.Sequential(
                _lin(c["crossattn_proj_in_channels"], c["encoder_hidden_states_channels"], bias=True),
                nn.GELU())
        for name in ("accum_video_sample_counter", "accum_image_sample_counter", "accum_iteration"):
            self.register_buffer(name, torch.tensor(0, dtype=torch.int64))
        self.register_buffer("accum_train_in_hours", torch.tensor(0.0))


def _spec_name(native: str) -> str:
    for old, new in SPEC_RENAMES:
        native = native.replace(old, new)
    return native


def _randomise(module, seed, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():  # norm weights near 1, the rest near 0: a swap shows
            base = 1.0 if p.ndim == 1 and bool((p == 1).all()) else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
            p.data = p.data.to(dtype)  # parameters only: buffers stay as the net keeps them
    return module


def _native_file(path, seed=0, wrap=None, config=TINY):
    net = _randomise(NativeNet(config), seed)
    sd = {f"net.{k}": v for k, v in net.state_dict().items()}
    sd["net.accum_iteration"] = torch.tensor(1234)  # a trained file's counters are not zero
    torch.save(sd if wrap is None else wrap(sd), path)
    return sd


def _cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err.strip()


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1).view(torch.uint8),
                                                                     b.view(-1).view(torch.uint8))


@pytest.fixture(scope="module")
def config_json(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps({"_class_name": "CosmosTransformer3DModel", **TINY}))
    return path


@pytest.fixture(scope="module")
def diffusers_model():
    torch.manual_seed(0)
    # bf16-representable fp32 weights: the bf16 native file holds them exactly
    return _randomise(CosmosTransformer3DModel(**TINY).eval(), 1).float()


@pytest.fixture(scope="module")
def diffusers_dir(diffusers_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "transformer"
    diffusers_model.to(torch.bfloat16).save_pretrained(path)
    diffusers_model.float()
    return path


# ---- names ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("config", [TINY, P25_2B, P25_14B], ids=["tiny", "2B", "14B"])
def test_table_follows_spec_renames_and_covers_both_sides(config):
    with torch.device("meta"):
        native = NativeNet(config).state_dict()
        diffusers = CosmosTransformer3DModel(**config).state_dict()
    want = {k: _spec_name(k) for k in native if k not in DROPPED}
    assert dict(cosmos_native.build_table(config)) == want
    assert set(want.values()) == set(diffusers)
    assert cosmos_native.expected_shapes(config) == {k: tuple(v.shape) for k, v in diffusers.items()}
    assert set(cosmos_native.native_buffers(config)) == set(DROPPED)
    # shapes alone give back the released config (no --config), buffers included
    inferred = cosmos_native.infer_config({k: tuple(v.shape) for k, v in native.items()},
                                          None if config is not TINY else {"max_size": TINY["max_size"]})
    assert {k: inferred[k] for k in config} == config


def test_spec_table_rows():
    pairs = set(cosmos_native.build_table(P25_2B))
    shapes = cosmos_native.expected_shapes(P25_2B)
    for native, diffusers, shape in SPEC_ROWS:
        assert (native, diffusers) in pairs
        assert shapes[diffusers] == shape, diffusers


# ---- round trips ------------------------------------------------------------------------------

def test_native_to_diffusers_to_native_bit_exact(tmp_path, capsys, config_json):
    src = _native_file(tmp_path / "model_ema_bf16.pt")
    assert _cli(capsys, "to-diffusers", tmp_path / "model_ema_bf16.pt", tmp_path / "hf",
                "--config", config_json) == (0, "")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["_class_name"] == "CosmosTransformer3DModel"
    assert {k: config[k] for k in TINY} == TINY
    weights = load_file(tmp_path / "hf" / "diffusion_pytorch_model.safetensors")
    assert {v.dtype for v in weights.values()} == {torch.bfloat16}  # stored dtype kept
    assert _cli(capsys, "to-cosmos-native", tmp_path / "hf", tmp_path / "back.pt") == (0, "")
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert set(back) == set(src)
    for key, value in src.items():
        if key == "net.accum_iteration":
            assert _same(back[key], torch.tensor(0))  # counters restart at zero
        else:
            assert _same(back[key], value), key
    net = NativeNet(TINY).to(torch.bfloat16)
    net.load_state_dict({k.removeprefix("net."): v for k, v in back.items()}, strict=True)


def test_diffusers_to_native_to_diffusers_bit_exact_and_same_forward(tmp_path, capsys, diffusers_dir,
                                                                     diffusers_model, monkeypatch):
    assert _cli(capsys, "to-cosmos-native", diffusers_dir.parent, tmp_path / "n.pt") == (0, "")
    native = torch.load(tmp_path / "n.pt", weights_only=True)
    assert all(k.startswith("net.") for k in native)
    params = {k for k in native if k.removeprefix("net.") not in DROPPED}
    assert {v.dtype for k, v in native.items() if k in params} == {torch.bfloat16}
    net = NativeNet(TINY).to(torch.bfloat16)
    net.load_state_dict({k.removeprefix("net."): v for k, v in native.items()}, strict=True)
    ref = NativeNet(TINY)  # the buffers as spec §4 computes them
    for name, buf in ref.named_buffers():
        assert _same(native[f"net.{name}"], buf), name
    # the only rename applied is the spec's, tensor for tensor
    hf = load_file(diffusers_dir / "diffusion_pytorch_model.safetensors")
    for key in params:
        assert _same(native[key], hf[_spec_name(key.removeprefix("net."))]), key

    assert _cli(capsys, "to-diffusers", tmp_path / "n.pt", tmp_path / "back", "--config",
                diffusers_dir / "config.json") == (0, "")
    back = load_file(tmp_path / "back" / "diffusion_pytorch_model.safetensors")
    assert set(back) == set(hf)
    assert all(_same(back[k], hf[k]) for k in hf)

    loaded = CosmosTransformer3DModel.from_pretrained(tmp_path / "back").float().eval()
    fresh = CosmosTransformer3DModel(**TINY)
    fresh.load_state_dict(back, strict=True)  # every key, no more, no less
    monkeypatch.setattr(transformer_cosmos, "transforms", SimpleNamespace(  # torchvision absent
        functional=SimpleNamespace(resize=lambda img, size, interpolation=None:
                                   torch.nn.functional.interpolate(img, size=size, mode="nearest")),
        InterpolationMode=SimpleNamespace(NEAREST="nearest")), raising=False)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 4, 4, 8, 6, generator=gen)
    cond = torch.zeros(2, 1, 4, 8, 6)
    cond[:, :, :1] = 1.0
    args = {"hidden_states": x, "timestep": torch.tensor([0.9, 0.25]),
            "encoder_hidden_states": torch.randn(2, 7, 64, generator=gen), "condition_mask": cond,
            "padding_mask": torch.zeros(1, 1, 64, 64), "fps": 16, "return_dict": False}
    with torch.no_grad():
        want = diffusers_model(**args)[0]
        got = loaded(**args)[0]
    assert want.abs().max() > 0
    assert torch.equal(got, want)


def test_fp32_source_is_cast_to_bf16_unless_asked(tmp_path, capsys, diffusers_model):
    diffusers_model.save_pretrained(tmp_path / "fp32")
    sd = diffusers_model.state_dict()
    for dtype, want in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        assert _cli(capsys, "to-cosmos-native", tmp_path / "fp32", tmp_path / f"{dtype}.pt",
                    "--dtype", dtype) == (0, "")
        native = torch.load(tmp_path / f"{dtype}.pt", weights_only=True)
        for key, value in native.items():
            name = key.removeprefix("net.")
            if name not in DROPPED:
                assert _same(value, sd[_spec_name(name)].to(want)), key


def test_training_checkpoint_picks_the_ema_net(tmp_path, capsys, config_json):
    """cosmos-rl's `iter_*.pt` = {model: {net.*, net_ema.*, net_ref.*}, optimizer, ...}."""
    nets = {name: _native_file(tmp_path / f"{name}.pt", seed)
            for seed, name in enumerate(("net", "ema", "ref"))}
    model = dict(nets["net"])
    for name in ("ema", "ref"):
        model.update({k.replace("net.", f"net_{name}.", 1): v for k, v in nets[name].items()})
    model["net.blocks.0.mlp.layer1._extra_state"] = torch.zeros(0)  # TransformerEngine's, dropped
    wrapped = {"model": model, "optimizer": {}, "iteration": 5}
    torch.save(wrapped, tmp_path / "iter_000000005.pt")
    for weights in ("ema", "net", "ref"):
        out = tmp_path / weights
        assert _cli(capsys, "to-diffusers", tmp_path / "iter_000000005.pt", out, "--config", config_json,
                    "--weights", weights) == (0, "")
        got = load_file(out / "diffusion_pytorch_model.safetensors")
        assert _same(got["proj_out.weight"], nets[weights]["net.final_layer.linear.weight"])


def test_without_config_the_released_values_fill_in_and_wfm_jax_reads_it(tmp_path, capsys):
    """A net at the released max_size: every size from the shapes, the rest said in one note;
    the result is an ordinary diffusers dir (`to-jax` takes it)."""
    config = dict(TINY, max_size=[128, 240, 240])
    _native_file(tmp_path / "m.pt", config=config)
    rc, err = _cli(capsys, "to-diffusers", tmp_path / "m.pt", tmp_path / "hf")
    assert rc == 0
    assert err.startswith("note: ")
    assert "\n" not in err
    assert "--config" in err
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert {k: written[k] for k in config} == config
    assert _cli(capsys, "to-jax", tmp_path / "hf", tmp_path / "jax") == (0, "")


def test_native_options_refused_for_a_state_dir(tmp_path, capsys, config_json):
    (tmp_path / "state").mkdir()
    _refused(_cli(capsys, "to-diffusers", tmp_path / "state", tmp_path / "out", "--config",
                  config_json), 1, "native")


def test_python_api_for_the_loader(tmp_path):
    _native_file(tmp_path / "m.pt")
    config = cosmos_native.native_to_diffusers_dir(str(tmp_path / "m.pt"), str(tmp_path / "out"),
                                                   config={"max_size": TINY["max_size"]})
    assert config["num_layers"] == 2
    assert (tmp_path / "out" / "config.json").is_file()


# ---- refusals -------------------------------------------------------------------------------------

def _refused(result, rc, *words):
    code, err = result
    assert code == rc, err
    assert err.startswith("error: "), err
    assert "\n" not in err
    for word in words:
        assert word in err


def _nothing_written(dst):
    assert not os.path.lexists(dst)
    assert [n for n in os.listdir(os.path.dirname(dst)) if n.startswith(".")] == []  # no temp left


def test_dcp_dir_is_refused_with_how_to_consolidate(tmp_path, capsys, config_json):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp
    _native_file(tmp_path / "m.pt")
    torch_save_to_dcp(tmp_path / "m.pt", tmp_path / "iter_000000010")
    assert (tmp_path / "iter_000000010" / ".metadata").is_file()
    _refused(_cli(capsys, "to-diffusers", tmp_path / "iter_000000010", tmp_path / "out"), 1,
             "DCP", "dcp_to_torch")
    _nothing_written(tmp_path / "out")
    dcp_to_torch_save(tmp_path / "iter_000000010", tmp_path / "consolidated.pt")  # what it says
    assert _cli(capsys, "to-diffusers", tmp_path / "consolidated.pt", tmp_path / "out",
                "--config", config_json) == (0, "")


@pytest.mark.parametrize("case", ["not_torch", "no_net", "unknown_key", "wrong_config",
                                  "default_max_size", "missing_file"])
def test_bad_native_input_is_one_line(tmp_path, capsys, config_json, case):
    src, extra = tmp_path / "m.pt", ["--config", config_json]
    if case == "not_torch":
        src.write_bytes(b"this is not a checkpoint")
    elif case == "no_net":
        torch.save({"weights": torch.zeros(3)}, src)
    elif case == "unknown_key":
        _native_file(src, wrap=lambda sd: {**sd, "net.extra_pos_embedder.pos_emb_t": torch.zeros(8, 24)})
    elif case == "wrong_config":
        _native_file(src)
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**TINY, "num_layers": 3}))
        extra = ["--config", bad]
    elif case == "default_max_size":
        _native_file(src)
        extra = []  # the tiny RoPE table does not fit the released max_size: asks for --config
    else:
        src = tmp_path / "absent.pt"
    words = ["--config"] if case in ("default_max_size", "wrong_config") else []
    _refused(_cli(capsys, "to-diffusers", src, tmp_path / "out", *extra), 1, *words)
    _nothing_written(tmp_path / "out")


def test_bad_diffusers_input_is_one_line(tmp_path, capsys, diffusers_dir):
    _refused(_cli(capsys, "to-cosmos-native", tmp_path, tmp_path / "n.pt"), 1, "config.json")
    wrong = tmp_path / "sd3"
    wrong.mkdir()
    (wrong / "config.json").write_text(json.dumps({"_class_name": "SD3Transformer2DModel"}))
    _refused(_cli(capsys, "to-cosmos-native", wrong, tmp_path / "n.pt"), 2, "SD3Transformer2DModel")
    lying = tmp_path / "lying"
    lying.mkdir()
    (lying / "diffusion_pytorch_model.safetensors").symlink_to(
        diffusers_dir / "diffusion_pytorch_model.safetensors")
    (lying / "config.json").write_text(json.dumps({"_class_name": "CosmosTransformer3DModel",
                                                   **TINY, "num_layers": 3}))
    _refused(_cli(capsys, "to-cosmos-native", lying, tmp_path / "n.pt"), 1, "missing",
             "transformer_blocks.2")
    _nothing_written(tmp_path / "n.pt")


def test_without_torch_one_line_names_the_pin(tmp_path, capsys, monkeypatch, diffusers_dir):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now fails
    with pytest.raises(cosmos_native.MissingTorchError, match=r"pip install torch==2\.13\.0"):
        cosmos_native.native_params(str(tmp_path / "m.pt"))
    rc, err = _cli(capsys, "to-cosmos-native", diffusers_dir, tmp_path / "n.pt")
    assert rc == 1
    assert err == "error: cosmos-rl native .pt checkpoints need torch: pip install torch==2.13.0"


def test_infer_config_refuses_shapes_that_do_not_fit():
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in NativeNet(TINY).state_dict().items()}
    with pytest.raises(ConversionError, match="patch_size"):  # 24 input features, 9-element patches
        cosmos_native.infer_config(shapes, {"patch_size": [1, 3, 3]})


def test_failure_while_writing_leaves_nothing(tmp_path, capsys, config_json, monkeypatch):
    _native_file(tmp_path / "m.pt")

    def half_then_fail(nbytes, load_many, directory, **_):
        with open(os.path.join(directory, "diffusion_pytorch_model.safetensors"), "wb") as f:
            f.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(cosmos_native, "save_checkpoint_streaming", half_then_fail)
    _refused(_cli(capsys, "to-diffusers", tmp_path / "m.pt", tmp_path / "out", "--config", config_json),
             1, "disk full")
    _nothing_written(tmp_path / "out")


def test_module_entry_point_exit_codes(tmp_path):
    """`python -m converters` itself: 1 and one stderr line for a DCP dir, 2 for a usage error."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / ".metadata").write_bytes(b"")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root}  # this checkout's converters, wherever pytest runs
    run = subprocess.run([sys.executable, "-m", "converters", "to-diffusers", str(tmp_path / "ckpt"),
                          str(tmp_path / "out")], capture_output=True, text=True, env=env)
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1
    assert "dcp_to_torch" in run.stderr
    run = subprocess.run([sys.executable, "-m", "converters", "to-cosmos-native"],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 2
