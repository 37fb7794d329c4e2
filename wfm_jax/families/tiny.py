"""A complete tiny StableDiffusion3Pipeline directory with random weights, built offline in
seconds, and `build_tiny_pipeline`, which builds any family's tiny twin (the other families'
writers live in their own `tiny` modules). Its command line is `python -m wfm_jax.tiny`
(wfm_jax/cli/tiny.py, which lists the forms).

Tests and the embedded recipe defaults use it in place of a downloaded model. It needs no torch:
tokenizers are built from a byte-level vocab and saved by transformers, configs are written as
JSON (the same files diffusers/transformers `save_pretrained` write), and every weight is drawn
with numpy in the shape the wfm_jax model and its converter table give, then saved as
safetensors in the diffusers/transformers key layout. All of it goes into a temporary sibling
directory renamed into place, so DIR is either complete or untouched.
"""
from __future__ import annotations

import json
import math
import os
from importlib import metadata

import numpy as np

# Shapes (design.md): CLIP 16 + 16 wide = T5 width = joint_attention_dim; pooled = 32 + 32.
CLIP_WIDTH, CLIP_PROJECTION, T5_WIDTH = 16, 32, 32
CLIP_MAX_LENGTH = 77
VAE_SCALING_FACTOR, VAE_SHIFT_FACTOR = 1.5305, 0.0609  # SD3's values: exercises the shift path
CLIP_MERGES = [("t", "h"), ("th", "e</w>"), ("a", "n"), ("o", "n</w>")]
T5_WORDS = ["▁a", "▁the", "▁of", "▁photo", "▁cat", "▁dog", "▁red", "▁blue", "▁on",
            "▁in"]
T5_EXTRA_IDS = 8
EMBEDDING_STD = 0.02  # token / position tables and T5's relative-position bias
PINNED_DIFFUSERS = "0.42.1"  # written as `_diffusers_version` when diffusers is not installed

# component -> (library, class) as model_index.json names them; the offset seeds its weights
MODELS = {
    "text_encoder": ("transformers", "CLIPTextModelWithProjection", 1),
    "text_encoder_2": ("transformers", "CLIPTextModelWithProjection", 2),
    "text_encoder_3": ("transformers", "T5EncoderModel", 3),
    "transformer": ("diffusers", "SD3Transformer2DModel", 4),
    "vae": ("diffusers", "AutoencoderKL", 5),
}
OTHERS = {
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
    "tokenizer": ("transformers", "CLIPTokenizer"),
    "tokenizer_2": ("transformers", "CLIPTokenizer"),
    "tokenizer_3": ("transformers", "T5Tokenizer"),
}


def byte_symbols() -> list[str]:
    """GPT-2/CLIP byte-level alphabet: one printable unicode character per byte value, printable
    ASCII and Latin-1 bytes standing for themselves, the rest shifted above U+0100."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    symbols = {b: chr(b) for b in keep}
    shifted = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + shifted)
            shifted += 1
    return [symbols[b] for b in keep] + [symbols[b] for b in range(256) if b not in keep]


def word_merges(words) -> list[tuple[str, str]]:
    """BPE merges that spell each word left to right into one word-final token. Longer words'
    chains rank first, so a shorter word's merge cannot split them (a chain's pairs all start
    at its word's first letter, so only a word sharing that prefix could interfere)."""
    merges = []
    for word in sorted(dict.fromkeys(words), key=lambda w: (-len(w), w)):
        pieces = list(word[:-1]) + [word[-1] + "</w>"]
        left = pieces[0]
        for right in pieces[1:]:
            if (left, right) not in merges:
                merges.append((left, right))
            left += right
    return merges


def clip_tokenizer(pad_token: str = "<|endoftext|>", words=(), max_length: int = CLIP_MAX_LENGTH):
    """CLIP BPE over bytes (each symbol alone and word-final) plus a few merges (518 tokens),
    plus merges that make each of `words` short."""
    from transformers import CLIPTokenizer

    merges = word_merges(words)
    merges += [m for m in CLIP_MERGES if m not in merges]
    symbols = byte_symbols()
    tokens = symbols + [s + "</w>" for s in symbols]
    tokens += list(dict.fromkeys("".join(m) for m in merges if "".join(m) not in tokens))
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    return CLIPTokenizer(vocab=vocab, merges=merges, pad_token=pad_token,
                         model_max_length=max_length)


def t5_tokenizer(words=()):
    """Unigram over special tokens, lower-case letters, digits and a few words (with scores),
    plus `words` whole."""
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789.,")
    pieces += [(c, -5.0 - 0.01 * i) for i, c in enumerate(chars)]
    pieces += [("▁" + c, -6.0 - 0.01 * i) for i, c in enumerate(chars)]
    pieces += [(w, -3.0 - 0.01 * i) for i, w in enumerate(T5_WORDS)]
    pieces += [("▁" + w, -2.5) for w in words if "▁" + w not in T5_WORDS]
    return T5Tokenizer(vocab=pieces, extra_ids=T5_EXTRA_IDS)


def tokenizers(words=(), clip_max_length: int = CLIP_MAX_LENGTH) -> dict:
    # "!" pads CLIP-G as in SD3, so its padding differs from EOS
    return dict(tokenizer=clip_tokenizer(words=words, max_length=clip_max_length),
                tokenizer_2=clip_tokenizer(pad_token="!", words=words, max_length=clip_max_length),
                tokenizer_3=t5_tokenizer(words))


# ----------------------------------------------------------------------------- configs

def _diffusers_version() -> str:
    try:
        return metadata.version("diffusers")
    except metadata.PackageNotFoundError:
        return PINNED_DIFFUSERS


def _diffusers_config(class_name: str, **values) -> dict:
    return {"_class_name": class_name, "_diffusers_version": _diffusers_version(), **values}


def transformer_config(**overrides) -> dict:
    """Every `SD3Transformer2DModel.__init__` argument, as diffusers' save_pretrained lists them."""
    values = dict(
        sample_size=32, patch_size=2, in_channels=4, num_layers=2,
        attention_head_dim=8, num_attention_heads=4, joint_attention_dim=T5_WIDTH,
        caption_projection_dim=32, pooled_projection_dim=2 * CLIP_PROJECTION, out_channels=4,
        pos_embed_max_size=96, dual_attention_layers=[], qk_norm=None)
    return _diffusers_config("SD3Transformer2DModel", **{**values, **overrides})


def vae_config(**overrides) -> dict:
    return {**_vae_config(), **overrides}


def _vae_config() -> dict:
    return _diffusers_config(
        "AutoencoderKL", in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D"], block_out_channels=[8], layers_per_block=1,
        act_fn="silu", latent_channels=4, norm_num_groups=1, sample_size=32,
        scaling_factor=VAE_SCALING_FACTOR, shift_factor=VAE_SHIFT_FACTOR, latents_mean=None,
        latents_std=None, force_upcast=True, use_quant_conv=False, use_post_quant_conv=False,
        mid_block_add_attention=True)


def scheduler_config() -> dict:
    return _diffusers_config(
        "FlowMatchEulerDiscreteScheduler", num_train_timesteps=1000, shift=3.0,
        use_dynamic_shifting=False, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
        max_image_seq_len=4096, invert_sigmas=False, shift_terminal=None, use_karras_sigmas=False,
        use_exponential_sigmas=False, use_beta_sigmas=False, time_shift_type="exponential",
        stochastic_sampling=False)


def text_encoder_configs(toks: dict) -> dict:
    """transformers config objects (torch-free) for the two CLIPs and T5, matched to `toks`."""
    import transformers

    def clip(tok, hidden_act):
        return transformers.CLIPTextConfig(
            vocab_size=len(tok), hidden_size=CLIP_WIDTH, intermediate_size=37,
            projection_dim=CLIP_PROJECTION, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=CLIP_MAX_LENGTH, hidden_act=hidden_act,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id, architectures=["CLIPTextModelWithProjection"],
            dtype="float32")

    t5 = toks["tokenizer_3"]
    return dict(
        # CLIP-L uses quick_gelu, CLIP-G the erf gelu
        text_encoder=clip(toks["tokenizer"], "quick_gelu"),
        text_encoder_2=clip(toks["tokenizer_2"], "gelu"),
        text_encoder_3=transformers.T5Config(
            vocab_size=len(t5), d_model=T5_WIDTH, d_kv=8, d_ff=37, num_layers=2, num_heads=2,
            relative_attention_num_buckets=8, relative_attention_max_distance=16,
            feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False,
            pad_token_id=t5.pad_token_id, eos_token_id=t5.eos_token_id,
            decoder_start_token_id=t5.pad_token_id, architectures=["T5EncoderModel"],
            dtype="float32"))


def write_json(data: dict, path: str) -> None:
    """diffusers' layout: sorted keys, 2-space indent, trailing newline."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def model_index() -> dict:
    entries = {name: [lib, cls] for name, (lib, cls, _) in MODELS.items()}
    entries.update({name: list(v) for name, v in OTHERS.items()})
    entries.update(feature_extractor=[None, None], image_encoder=[None, None])
    return _diffusers_config("StableDiffusion3Pipeline", **entries)


# ----------------------------------------------------------------------------- weights

def _buffers(spec, config: dict, model) -> dict[str, np.ndarray]:
    """Values of the model's checkpoint buffers (SD3's sincos position table): these are not
    random, so take what the wfm_jax constructor computes (under jit, so XLA drops every other
    initialiser)."""
    import jax
    from flax import nnx

    from wfm_jax.core.tree import flat_params
    from wfm_jax.models.layers.embeddings import Buffer

    if not flat_params(model, Buffer):
        return {}

    def build():
        made = spec.make_model(config, rngs=nnx.Rngs(0))
        return {k: v[...] for k, v in flat_params(made, Buffer).items()}

    return {k: np.asarray(v, np.float32) for k, v in jax.jit(build)().items()}


def _draw(path: str, transform: str, shapes: dict, rng: np.random.Generator) -> np.ndarray:
    """One parameter in wfm_jax layout. Kernels and their biases as torch's default init
    (uniform, bound 1/sqrt(fan_in)); norm scales 1 + 0.1 N and other biases 0.1 N, so nothing is
    constant; embedding tables small."""
    shape = shapes[path]
    prefix, leaf = path.rpartition(".")[0], path.rpartition(".")[2]
    kernel = f"{prefix}.kernel" if prefix else "kernel"
    if transform in ("linear", "conv") or (leaf == "bias" and kernel in shapes):
        fan_in = math.prod(shapes[kernel][:-1])  # (in, out) or HWIO
        return rng.uniform(-1.0, 1.0, shape).astype(np.float32) / np.float32(math.sqrt(fan_in))
    noise = rng.standard_normal(shape, dtype=np.float32)
    if leaf in ("scale", "gamma"):  # gamma: the Wan VAE's RMS-norm weight
        return 1.0 + 0.1 * noise
    if leaf == "bias":
        return 0.1 * noise
    return EMBEDDING_STD * noise


def random_weights(config: dict, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], str]:
    """(checkpoint key -> fp32 tensor, weights file stem) for one component's config.json: the
    shapes come from the abstract wfm_jax model, the keys and layouts from its converter table."""
    from converters import registry
    from converters.loading import abstract_model
    from converters.table import ConversionError, convert_to_diffusers
    from wfm_jax.core.tree import flat_shapes

    spec = registry.spec_for(config)
    table = spec.build_table(config)
    model = abstract_model(spec, config)
    shapes = flat_shapes(model)
    transforms = {r.jax: r.transform for r in table}
    if set(shapes) != set(transforms):
        raise ConversionError(f"{registry.class_name_of(config)}: table and model disagree on "
                              f"{sorted(set(shapes) ^ set(transforms))[:8]}")
    flat = _buffers(spec, config, model)
    for path in sorted(transforms):  # fixed order: the draw depends on the seed alone
        if path not in flat:
            flat[path] = _draw(path, transforms[path], shapes, rng)
    return convert_to_diffusers(table, flat), spec.weights_stem


# ----------------------------------------------------------------------------- the directory

def write_pipeline(directory: str, seed: int = 0, *, transformer: dict | None = None,
                   vae: dict | None = None, words=(), clip_max_length: int = CLIP_MAX_LENGTH) -> None:
    """Write every file of the pipeline into `directory` (non-atomic; see build_tiny_pipeline).
    transformer / vae: config overrides; words: kept whole by the tokenizers."""
    from converters.safetensors_io import save_checkpoint

    toks = tokenizers(words, clip_max_length)
    for name, tok in toks.items():
        tok.save_pretrained(os.path.join(directory, name))
    for name, cfg in text_encoder_configs(toks).items():
        cfg.save_pretrained(os.path.join(directory, name))
    write_json(transformer_config(**(transformer or {})),
               os.path.join(directory, "transformer", "config.json"))
    write_json(vae_config(**(vae or {})), os.path.join(directory, "vae", "config.json"))
    write_json(scheduler_config(), os.path.join(directory, "scheduler", "scheduler_config.json"))
    for name, (_, _, offset) in MODELS.items():
        with open(os.path.join(directory, name, "config.json")) as f:
            config = json.load(f)  # as written: exactly what every loader will see
        tensors, stem = random_weights(config, np.random.default_rng([seed, offset]))
        save_checkpoint(tensors, os.path.join(directory, name), stem=stem)
    write_json(model_index(), os.path.join(directory, "model_index.json"))


def build_tiny_pipeline(directory: str, seed: int = 0, overwrite: bool = False,
                        family: str = "sd3") -> str:
    """Write the tiny pipeline of `family` (its class's `write_tiny`, looked up in FAMILIES) to
    `directory` (must be absent or empty unless overwrite)."""
    from wfm_jax.families import FAMILIES
    from wfm_jax.io.atomic import atomic_directory

    if family not in FAMILIES:
        raise ValueError(f"unknown tiny pipeline family {family!r}; choose one of {FAMILIES.names()}")
    if seed < 0:  # numpy seeds are non-negative
        raise ValueError(f"seed must be >= 0, got {seed}")
    directory = os.path.abspath(directory)
    if os.path.isfile(directory):
        raise FileExistsError(f"{directory} is a file, not a pipeline directory")
    if os.path.isdir(directory) and os.listdir(directory) and not overwrite:
        raise FileExistsError(f"{directory} exists and is not empty (pass overwrite to replace it)")
    write = FAMILIES.get(family).write_tiny
    with atomic_directory(directory) as tmp:
        write(tmp, seed)
    return directory
