"""A complete tiny StableDiffusion3Pipeline directory with random weights, built offline in seconds.

    python -m wfm_jax.tiny DIR [--seed S] [--overwrite]

Tests and the embedded recipe defaults use it in place of a downloaded model. Everything is built
in memory (tokenizers from a byte-level vocab, models from configs under a fixed torch seed) and
saved with diffusers' `save_pretrained`, into a temporary sibling directory renamed into place, so
DIR is either complete or untouched.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

# Shapes (design.md): CLIP 16 + 16 wide = T5 width = joint_attention_dim; pooled = 32 + 32.
CLIP_WIDTH, CLIP_PROJECTION, T5_WIDTH = 16, 32, 32
CLIP_MAX_LENGTH = 77
VAE_SCALING_FACTOR, VAE_SHIFT_FACTOR = 1.5305, 0.0609  # SD3's values: exercises the shift path
CLIP_MERGES = [("t", "h"), ("th", "e</w>"), ("a", "n"), ("o", "n</w>")]
T5_WORDS = ["▁a", "▁the", "▁of", "▁photo", "▁cat", "▁dog", "▁red", "▁blue", "▁on",
            "▁in"]
T5_EXTRA_IDS = 8


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


def clip_tokenizer(pad_token: str = "<|endoftext|>"):
    """CLIP BPE over bytes (each symbol alone and word-final) plus a few merges: 518 tokens."""
    from transformers import CLIPTokenizer

    symbols = byte_symbols()
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in CLIP_MERGES]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    return CLIPTokenizer(vocab=vocab, merges=list(CLIP_MERGES), pad_token=pad_token,
                         model_max_length=CLIP_MAX_LENGTH)


def t5_tokenizer():
    """Unigram over special tokens, lower-case letters, digits and a few words (with scores)."""
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789.,")
    pieces += [(c, -5.0 - 0.01 * i) for i, c in enumerate(chars)]
    pieces += [("▁" + c, -6.0 - 0.01 * i) for i, c in enumerate(chars)]
    pieces += [(w, -3.0 - 0.01 * i) for i, w in enumerate(T5_WORDS)]
    return T5Tokenizer(vocab=pieces, extra_ids=T5_EXTRA_IDS)


def _randomise_constants(model, seed: int) -> None:
    """Give every constant tensor (norm scales at 1, biases and any zero-init layer at 0) small
    random values, so no output is trivially constant and swapped mappings show up in parity."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() > 1 and float(p.std()) == 0.0:
                p.add_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))


def build_components(seed: int = 0) -> dict:
    """The pipeline's components (torch modules, tokenizers, scheduler), deterministic in seed."""
    import torch
    import transformers
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel

    tokenizer, tokenizer_2 = clip_tokenizer(), clip_tokenizer(pad_token="!")  # "!" as SD3's CLIP-G
    tokenizer_3 = t5_tokenizer()

    def seeded(offset, make):
        torch.manual_seed(seed * 1000 + offset)
        model = make()
        _randomise_constants(model, seed * 1000 + offset + 500)
        return model.eval()

    def clip_config(tok, hidden_act):
        return transformers.CLIPTextConfig(
            vocab_size=len(tok), hidden_size=CLIP_WIDTH, intermediate_size=37,
            projection_dim=CLIP_PROJECTION, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=CLIP_MAX_LENGTH, hidden_act=hidden_act,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id)

    t5_config = transformers.T5Config(
        vocab_size=len(tokenizer_3), d_model=T5_WIDTH, d_kv=8, d_ff=37, num_layers=2, num_heads=2,
        relative_attention_num_buckets=8, relative_attention_max_distance=16,
        feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False,
        pad_token_id=tokenizer_3.pad_token_id, eos_token_id=tokenizer_3.eos_token_id,
        decoder_start_token_id=tokenizer_3.pad_token_id)

    return dict(
        # CLIP-L uses quick_gelu, CLIP-G the erf gelu
        text_encoder=seeded(1, lambda: transformers.CLIPTextModelWithProjection(
            clip_config(tokenizer, "quick_gelu"))),
        text_encoder_2=seeded(2, lambda: transformers.CLIPTextModelWithProjection(
            clip_config(tokenizer_2, "gelu"))),
        text_encoder_3=seeded(3, lambda: transformers.T5EncoderModel(t5_config)),
        transformer=seeded(4, lambda: SD3Transformer2DModel(
            sample_size=32, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=8,
            num_attention_heads=4, joint_attention_dim=T5_WIDTH, caption_projection_dim=32,
            pooled_projection_dim=2 * CLIP_PROJECTION, out_channels=4, pos_embed_max_size=96)),
        vae=seeded(5, lambda: AutoencoderKL(
            block_out_channels=(8,), layers_per_block=1, latent_channels=4, norm_num_groups=1,
            use_quant_conv=False, use_post_quant_conv=False,
            scaling_factor=VAE_SCALING_FACTOR, shift_factor=VAE_SHIFT_FACTOR)),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        tokenizer=tokenizer, tokenizer_2=tokenizer_2, tokenizer_3=tokenizer_3,
    )


def build_tiny_pipeline(directory: str, seed: int = 0, overwrite: bool = False) -> str:
    """Write the tiny pipeline to `directory` (must be absent or empty unless overwrite)."""
    from diffusers import StableDiffusion3Pipeline

    directory = os.path.abspath(directory)
    if os.path.isfile(directory):
        raise FileExistsError(f"{directory} is a file, not a pipeline directory")
    if os.path.isdir(directory) and os.listdir(directory) and not overwrite:
        raise FileExistsError(f"{directory} exists and is not empty (pass overwrite to replace it)")
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.tmp-", dir=parent)
    try:
        StableDiffusion3Pipeline(**build_components(seed)).save_pretrained(tmp)
        if os.path.isdir(directory):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.old-", dir=parent)
            os.replace(directory, os.path.join(old, "pipe"))
            os.replace(tmp, directory)
            shutil.rmtree(old)
        else:
            os.replace(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wfm_jax.tiny",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("directory", help="output pipeline directory (absent or empty)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing directory")
    args = parser.parse_args(argv)
    try:
        path = build_tiny_pipeline(args.directory, seed=args.seed, overwrite=args.overwrite)
    except (FileExistsError, PermissionError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
