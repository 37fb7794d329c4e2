"""Qwen2.5-VL text tower and the Cosmos-Reason1 prompt embedding: parity with transformers /
diffusers torch, the chat-template ids, converter round trips (visual tower passed through), key
and config errors."""
from __future__ import annotations

import copy
import json
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from converters import qwen2_5_vl as qwen_conv
from converters.loading import check_against_model
from converters.registry import spec_for
from converters.safetensors_io import open_checkpoint, save_checkpoint
from converters.table import ConversionError, convert_to_diffusers, convert_to_jax
from wfm_jax.core.abstract import abstract_module
from wfm_jax.core.mesh import MESH_AXES
from wfm_jax.core.tree import flat_params
from wfm_jax.families.cosmos.tiny_qwen import qwen_config, qwen_tokenizer
from wfm_jax.models.cosmos import text_embedding as te
from wfm_jax.models.text.qwen2_5_vl import Passthrough, QwenTextConfig, make_model, passthrough_shapes, rope_tables

ATOL = 2e-5
SEQ = 10
MAX_LEN = 128  # the templated short prompt is ~100 tokens with the tiny byte-level vocab


@pytest.fixture(scope="module")
def tokenizer():
    return qwen_tokenizer()


def _hf_config(config: dict) -> transformers.Qwen2_5_VLConfig:
    return transformers.Qwen2_5_VLConfig(**{k: config[k] for k in (
        "text_config", "vision_config", "tie_word_embeddings")})


def _torch_model(config: dict, seed: int = 0):
    torch.manual_seed(seed)
    model = transformers.Qwen2_5_VLForConditionalGeneration(_hf_config(config)).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # norms start at 1, biases at 0: perturb so a swapped mapping shows
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu().contiguous()
    return (t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16
            else t.numpy())


def _saved_state(model, tmp_path) -> dict[str, np.ndarray]:
    """What save_pretrained writes (the checkpoint key layout)."""
    model.save_pretrained(tmp_path)
    return {k: v() for k, v in open_checkpoint(str(tmp_path)).items()}


def _loaders(state):
    return {k: (lambda v=v: v) for k, v in state.items()}


def _jax_model(config, state, param_dtype=jnp.float32, dtype=None):
    model = abstract_module(lambda: make_model(config, dtype=dtype, param_dtype=param_dtype,
                                              rngs=nnx.Rngs(0)))
    variables = dict(nnx.state(model, nnx.Variable).flat_state())
    flat = convert_to_jax(qwen_conv.build_table(config), _loaders(state))
    assert {".".join(map(str, p)) for p in variables} == set(flat)
    for path, var in variables.items():
        var.set_value(jnp.asarray(flat[".".join(map(str, path))], param_dtype))
    return model


def _apply(model, *args):
    graph, state = nnx.split(model)
    return jax.jit(lambda state, *a: nnx.merge(graph, state)(*a))(state, *args)


@pytest.fixture(scope="module")
def pair(tokenizer, tmp_path_factory):
    config = qwen_config(len(tokenizer))
    torch_model = _torch_model(config)
    state = _saved_state(torch_model, tmp_path_factory.mktemp("qwen"))
    return config, torch_model, _jax_model(config, state)


def _ids(config, batch, rng):
    return rng.integers(0, config["text_config"]["vocab_size"], size=(batch, SEQ))


# ---- the text tower ---------------------------------------------------------------------------


@pytest.mark.parametrize("padded", [False, True], ids=["no_mask", "right_padding_mask"])
def test_hidden_states_parity(pair, padded):
    """All num_hidden_layers + 1 hidden states (the last after the final norm) vs transformers;
    diffusers passes no mask, a padding mask is checked too."""
    config, torch_model, jax_model = pair
    ids = _ids(config, 3, np.random.default_rng(1))
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    with torch.no_grad():
        want = torch_model(torch.from_numpy(ids), output_hidden_states=True,
                           attention_mask=torch.from_numpy(mask) if padded else None).hidden_states
    got = _apply(jax_model, jnp.asarray(ids), jnp.asarray(mask) if padded else None)
    assert len(got) == len(want) == config["text_config"]["num_hidden_layers"] + 1
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), w.numpy()
        rows = mask.astype(bool) if padded else np.ones(ids.shape, bool)  # padded queries: any
        err = float(np.max(np.abs(g - w)[rows]))
        assert err <= ATOL, f"hidden_states[{i}] max abs err {err:.3g}"


def test_mrope_on_text_is_1d_rope(pair):
    """transformers' 3-stream mrope cos/sin for text positions == our 1-D rotate-half tables."""
    config, torch_model, _ = pair
    rotary = torch_model.model.language_model.rotary_emb
    assert list(rotary.mrope_section) == [1, 1, 2]  # three non-trivial sections
    cfg = QwenTextConfig.from_dict(config)
    x = torch.zeros(1, dtype=torch.float32)
    cos, sin = rotary(x, torch.arange(SEQ)[None])
    want_cos, want_sin = cos[0].numpy(), sin[0].numpy()  # (B, S, head_dim)
    got_cos, got_sin = rope_tables(SEQ, cfg.head_dim, cfg.rope_theta)
    np.testing.assert_allclose(got_cos, want_cos, atol=1e-6, rtol=0)
    np.testing.assert_allclose(got_sin, want_sin, atol=1e-6, rtol=0)


def test_bf16_compute_tracks_fp32(pair):
    config, _, jax_model = pair
    ids = jnp.asarray(_ids(config, 2, np.random.default_rng(2)))
    ref = np.asarray(_apply(jax_model, ids)[-1])
    bf16 = abstract_module(lambda: make_model(config, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
    for (_path, var), (_, src) in zip(nnx.state(bf16, nnx.Variable).flat_state(),
                                     nnx.state(jax_model, nnx.Variable).flat_state()):
        var.set_value(src.get_value())
    got = _apply(bf16, ids)[-1]
    assert got.dtype == jnp.bfloat16
    err = np.max(np.abs(np.asarray(got, np.float32) - ref))
    assert err < 0.05 * np.max(np.abs(ref)), err


def test_rms_norm_rounds_like_transformers_in_bf16():
    """Normalise in fp32, round to bf16, then scale in bf16: Qwen2_5_VLRMSNorm's order."""
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRMSNorm

    from wfm_jax.models.text.qwen2_5_vl import QwenRMSNorm
    rng = np.random.default_rng(7)
    x = torch.from_numpy(rng.normal(size=(4, 64)).astype(np.float32)).to(torch.bfloat16)
    ref = Qwen2_5_VLRMSNorm(64, eps=1e-6).to(torch.bfloat16)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(rng.normal(size=64).astype(np.float32)))
        want = _numpy(ref(x)).astype(np.float32)
    norm = QwenRMSNorm(64, eps=1e-6, param_dtype=jnp.bfloat16)
    norm.scale.set_value(jnp.asarray(_numpy(ref.weight)))
    got = norm(jnp.asarray(_numpy(x)))
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32), want)


def test_sharded_forward_matches_single_device(pair):
    """8-device data x fsdp x context mesh: activation constraints apply, numbers do not move."""
    config, _, jax_model = pair
    ids = jnp.asarray(_ids(config, 4, np.random.default_rng(3)))
    want = _apply(jax_model, ids)
    mesh = jax.make_mesh((2, 2, 2), MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3)
    with jax.set_mesh(mesh):
        got = _apply(jax_model, ids)
    for g, w in zip(got, want):
        # 1.1e-6 apart on this machine (2026-11-25: 6 of 640 values over the old 1e-6)
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=0)


# ---- the Reason1 embedding ------------------------------------------------------------------


PROMPTS = ["a cat on the mat",
           "the " * 40 + "end"]  # long enough to be truncated at MAX_LEN


class _Recorder(torch.nn.Module):
    """The text encoder as diffusers calls it, keeping the ids and kwargs it was given."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.calls = []

    @property
    def dtype(self):
        return self.model.dtype

    def forward(self, input_ids, **kwargs):
        self.calls.append((input_ids.clone(), kwargs))
        return self.model(input_ids, **kwargs)


def _diffusers_embeds(torch_model, tokenizer, prompts, max_len):
    """diffusers' own Cosmos2_5_PredictBasePipeline._get_prompt_embeds on a pipeline-like object
    (tokenizer + text encoder; the transformer and VAE play no part in it)."""
    from types import SimpleNamespace

    from diffusers.pipelines.cosmos.pipeline_cosmos2_5_predict import Cosmos2_5_PredictBasePipeline
    encoder = _Recorder(torch_model)
    fake = SimpleNamespace(tokenizer=tokenizer, text_encoder=encoder,
                           _execution_device=torch.device("cpu"))
    with torch.no_grad():
        embeds = Cosmos2_5_PredictBasePipeline._get_prompt_embeds(
            fake, prompt=prompts, max_sequence_length=max_len, device=torch.device("cpu"),
            dtype=torch.float32)
    (ids, kwargs), = encoder.calls
    return embeds, ids, kwargs


def test_token_ids_equal_diffusers(pair, tokenizer, tmp_path):
    _, torch_model, _ = pair
    _, want, kwargs = _diffusers_embeds(torch_model, tokenizer, PROMPTS, MAX_LEN)
    assert set(kwargs) == {"output_hidden_states"}  # no attention mask, as the docs say
    got = te.prompt_token_ids(tokenizer, PROMPTS, MAX_LEN)
    assert got.shape == (2, MAX_LEN) and got.dtype == np.int32
    np.testing.assert_array_equal(got, want.numpy())
    tokenizer.save_pretrained(tmp_path / "tokenizer")  # as a pipeline dir holds it
    reloaded = te.load_tokenizer(str(tmp_path))
    np.testing.assert_array_equal(te.prompt_token_ids(reloaded, PROMPTS, MAX_LEN), got)
    with pytest.raises(FileNotFoundError, match="no tokenizer/ in pipeline directory"):
        te.load_tokenizer(str(tmp_path / "tokenizer"))
    pad = tokenizer.pad_token_id
    assert got[0, -1] == pad and got[1, -1] != pad  # one padded, one truncated
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert got[0, 0] == im_start and (got[0] == im_start).sum() == 2  # system, user; no assistant


def test_reason1_embedding_matches_diffusers(pair, tokenizer):
    config, torch_model, jax_model = pair
    want, ids, _ = _diffusers_embeds(torch_model, tokenizer, PROMPTS, MAX_LEN)
    text = config["text_config"]
    assert want.shape == (2, MAX_LEN, text["num_hidden_layers"] * text["hidden_size"])
    got = jax.jit(lambda ids: te.reason1_embedding(jax_model, ids))(
        jnp.asarray(te.prompt_token_ids(tokenizer, PROMPTS, MAX_LEN)))
    assert got.shape == tuple(want.shape) and got.dtype == jnp.float32
    err = float(np.max(np.abs(np.asarray(got) - want.numpy())))
    print(f"reason1 embedding max abs err {err:.3g}")
    assert err <= ATOL


def test_normalisation_uses_the_unbiased_std():
    h = jnp.asarray(np.random.default_rng(4).normal(size=(2, 3, 5)), jnp.float32)
    got = np.asarray(te.normalize_hidden_states([h * 0, h]))
    x = torch.from_numpy(np.array(h))
    want = (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-8)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-6, rtol=0)
    assert not np.allclose(got, np.asarray((h - h.mean(-1, keepdims=True))
                                           / (h.std(-1, keepdims=True) + 1e-8)), atol=1e-3)


# ---- converter ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, tied", [(torch.float32, False), (torch.bfloat16, False),
                                         (torch.float32, True)],
                         ids=["fp32", "bf16", "fp32_tied_lm_head"])
def test_round_trip_bit_identical(tokenizer, dtype, tied, tmp_path):
    """save_pretrained -> jax (visual tower and lm_head as passthrough) -> safetensors: the same
    keys, dtypes and bytes; transformers loads the result strictly."""
    config = qwen_config(len(tokenizer), tie_word_embeddings=tied)
    torch_model = _torch_model(config).to(dtype)
    original = _saved_state(torch_model, tmp_path / "src")
    assert ("lm_head.weight" in original) is not tied
    with open(tmp_path / "src" / "config.json") as f:
        saved_config = json.load(f)
    spec = spec_for(saved_config)
    assert spec is qwen_conv.SPEC
    param_dtype = jnp.bfloat16 if dtype == torch.bfloat16 else jnp.float32
    model = _jax_model(saved_config, original, param_dtype)
    passthrough = dict(nnx.state(model, Passthrough).flat_state())
    assert {".".join(map(str, p))[len("passthrough."):] for p in passthrough} == set(
        passthrough_shapes(saved_config))
    assert not any(k.startswith("passthrough") for k in flat_params(model))  # never trained
    flat = {".".join(map(str, p)): np.asarray(v.get_value())
            for p, v in nnx.state(model, nnx.Variable).flat_state()}
    back = convert_to_diffusers(spec.build_table(saved_config), flat)
    assert set(back) == set(original)
    for key, value in original.items():
        assert back[key].dtype == value.dtype and back[key].tobytes() == value.tobytes(), key
    save_checkpoint(back, str(tmp_path / "out"), stem=spec.weights_stem)
    (tmp_path / "out" / "config.json").write_text(json.dumps(saved_config))
    reloaded = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        str(tmp_path / "out"), dtype=dtype)
    for key, value in torch_model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], value), key


def test_cli_round_trip_and_load_model(pair, tokenizer, tmp_path):
    """`python -m converters to-jax | to-diffusers` on a bf16 save is bit-exact; load_model reads
    the text encoder of a checkpoint that has its visual tower, with the same numbers."""
    from converters.cli import main
    from converters.loading import export_diffusers, load_model
    config, torch_model, jax_model = pair
    src = tmp_path / "src"
    copy.deepcopy(torch_model).to(torch.bfloat16).save_pretrained(src)  # the fixture stays fp32
    assert main(["to-jax", str(src), str(tmp_path / "jax")]) == 0
    assert main(["to-diffusers", str(tmp_path / "jax"), str(tmp_path / "back")]) == 0
    want = {k: v() for k, v in open_checkpoint(str(src)).items()}
    got = {k: v() for k, v in open_checkpoint(str(tmp_path / "back")).items()}
    assert set(got) == set(want) and any(k.startswith("visual.") for k in got)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and got[key].tobytes() == value.tobytes(), key
    back = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(str(tmp_path / "back"))
    assert back.config.text_config.num_hidden_layers == config["text_config"]["num_hidden_layers"]

    fp32 = tmp_path / "fp32"
    torch_model.save_pretrained(fp32)
    loaded, loaded_config = load_model(str(fp32))
    ids = jnp.asarray(_ids(config, 2, np.random.default_rng(5)))
    for g, w in zip(_apply(loaded, ids), _apply(jax_model, ids)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    # the family's export path writes the whole checkpoint back, visual tower included
    export_diffusers(loaded, loaded_config, str(tmp_path / "export"))
    want = {k: v() for k, v in open_checkpoint(str(fp32)).items()}
    got = {k: v() for k, v in open_checkpoint(str(tmp_path / "export")).items()}
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and got[key].tobytes() == value.tobytes(), key


def test_bad_keys_are_named(pair, tmp_path):
    config, torch_model, _ = pair
    state = _saved_state(torch_model, tmp_path)
    table = qwen_conv.build_table(config)
    shapes = {".".join(map(str, p)): tuple(v.shape) for p, v in nnx.state(
        abstract_module(lambda: make_model(config, rngs=nnx.Rngs(0))), nnx.Variable).flat_state()}
    for victim in ("model.layers.1.self_attn.k_proj.bias", "visual.blocks.0.attn.qkv.weight",
                   "lm_head.weight"):
        missing = {k: v for k, v in state.items() if k != victim}
        with pytest.raises(ConversionError, match=f"missing keys: .*{victim}"):
            convert_to_jax(table, _loaders(missing), shapes)
    with pytest.raises(ConversionError, match="unexpected keys: .*bogus.weight"):
        convert_to_jax(table, _loaders({**state, "bogus.weight": np.zeros(3, np.float32)}))
    victim = "model.layers.0.mlp.up_proj.weight"
    with pytest.raises(ConversionError, match=f"wrong shape for {victim}"):
        convert_to_jax(table, _loaders(dict(state, **{victim: np.zeros((3, 5), np.float32)})),
                       shapes)
    # transformers' in-memory layout (model.language_model.*, model.visual.*) is not a checkpoint
    in_memory = lambda k: (k if k == "lm_head.weight" else k.replace(
        "model.", "model.language_model.", 1).replace("visual.", "model.visual.", 1))
    renamed = {in_memory(k): v for k, v in state.items()}
    with pytest.raises(ConversionError, match="unexpected keys: model.language_model"):
        convert_to_jax(table, _loaders(renamed))
    # every table path is a model variable and the other way round
    assert {r.jax for r in table} == set(shapes)
    assert {r.hf for r in table} == set(state)


def test_released_legacy_config_and_bad_configs():
    """The released flat config layout (text keys at the top, rope_scaling mrope) parses as
    transformers reads it; an unsupported rope or sliding window is one line."""
    legacy = dict(architectures=["Qwen2_5_VLForConditionalGeneration"], hidden_size=3584,
                  intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                  num_key_value_heads=4, rms_norm_eps=1e-6, rope_theta=1e6, vocab_size=152064,
                  rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]},
                  tie_word_embeddings=False, use_sliding_window=False,
                  vision_config=dict(depth=32, hidden_size=1280, intermediate_size=3420,
                                     num_heads=16, in_chans=3, out_hidden_size=3584,
                                     patch_size=14, spatial_merge_size=2, temporal_patch_size=2))
    cfg = QwenTextConfig.from_dict(legacy)
    want = transformers.Qwen2_5_VLConfig(**legacy).text_config
    for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "rms_norm_eps", "vocab_size"):
        assert getattr(cfg, name) == getattr(want, name), name
    assert cfg.rope_theta == want.rope_parameters["rope_theta"] == 1e6
    assert cfg.num_hidden_layers * cfg.hidden_size == 100352  # Cosmos' crossattn_proj input
    shapes = passthrough_shapes(legacy)
    assert shapes["visual.merger.mlp.0.weight"] == (5120, 5120)
    assert shapes["lm_head.weight"] == (152064, 3584)
    with torch.device("meta"):  # the released model's tensors, built on meta: no memory
        full = transformers.Qwen2_5_VLForConditionalGeneration(
            transformers.Qwen2_5_VLConfig(**legacy))
    # in-memory names -> the checkpoint's (what save_pretrained writes)
    stored = {re.sub(r"^model\.(language_model|visual)\.",
                     lambda m: "model." if m.group(1) == "language_model" else "visual.", k):
              (tuple(v.shape), "BF16") for k, v in full.state_dict().items()}
    assert {k: v[0] for k, v in stored.items() if not k.startswith("model.")} == shapes
    # the whole table against the abstract 7B model: keys, paths and every shape
    check_against_model(qwen_conv.build_table(legacy), stored,
                        abstract_module(lambda: make_model(legacy, rngs=nnx.Rngs(0))))

    with pytest.raises(ValueError, match="unsupported Qwen2.5-VL rope_type 'yarn'"):
        QwenTextConfig.from_dict(dict(legacy, rope_scaling={"type": "yarn", "factor": 4.0}))
    with pytest.raises(ValueError, match="sliding-window attention is not supported"):
        QwenTextConfig.from_dict(dict(legacy, use_sliding_window=True))


def test_token_ids_refuse_a_tokenizer_that_does_not_pad(tokenizer):
    class NoPad:
        def apply_chat_template(self, conversation, **kwargs):
            return tokenizer.apply_chat_template(conversation, tokenize=True)

    with pytest.raises(ValueError, match="expected max_sequence_length 512"):
        te.prompt_token_ids(NoPad(), "a cat")


def test_load_text_tower_reads_only_the_text(pair, tmp_path):
    """From a pipeline dir's text_encoder/ (sharded over fsdp=8) and from a converted state dir:
    the text tower alone, numbers equal to the full model's; other classes are one line."""
    from converters.cli import main
    from converters.qwen_loading import load_text_tower
    from converters.registry import UnsupportedModelError
    from wfm_jax.core.mesh import make_mesh
    from wfm_jax.models.text.qwen2_5_vl import QwenTextModel
    config, torch_model, jax_model = pair
    pipe = tmp_path / "pipe"
    torch_model.save_pretrained(pipe / "text_encoder")
    (pipe / "model_index.json").write_text(json.dumps({
        "_class_name": "Cosmos2_5_PredictBasePipeline",
        "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"]}))
    ids = jnp.asarray(_ids(config, 2, np.random.default_rng(6)))
    want = _apply(jax_model, ids)
    tower, _ = load_text_tower(str(pipe), mesh=make_mesh(fsdp=8))
    assert isinstance(tower, QwenTextModel)
    assert not nnx.state(tower, Passthrough).flat_state()
    kernel = tower.layers[0].mlp.gate_proj.kernel[...]
    assert len(kernel.sharding.device_set) == 8
    state = {".".join(map(str, p)): np.asarray(v.get_value())
             for p, v in nnx.state(jax_model.language_model, nnx.Variable).flat_state()}
    got = {".".join(map(str, p)): np.asarray(v.get_value())
           for p, v in nnx.state(tower, nnx.Variable).flat_state()}
    assert set(got) == set(state)
    for key, value in state.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
    for g, w in zip(_apply(tower, ids), want):  # sharded matmuls may reorder sums
        # 1.1e-6 apart on this machine (2026-11-25: 6 of 640 values over the old 1e-6)
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=0)

    assert main(["to-jax", str(pipe / "text_encoder"), str(tmp_path / "state")]) == 0
    tower, _ = load_text_tower(str(tmp_path / "state"), param_dtype=jnp.bfloat16)
    assert tower.embed_tokens[...].dtype == jnp.bfloat16
    for p, v in nnx.state(tower, nnx.Variable).flat_state():
        key = ".".join(map(str, p))
        np.testing.assert_array_equal(np.asarray(v.get_value()),
                                      state[key].astype(ml_dtypes.bfloat16))

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(
        json.dumps({"architectures": ["T5EncoderModel"]}))
    with pytest.raises(UnsupportedModelError, match="'T5EncoderModel', not a Qwen2_5_VL"):
        load_text_tower(str(tmp_path / "other"))
