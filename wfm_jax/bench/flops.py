"""Analytic FLOP counts of the benchmarked work (matmuls, convolutions and attention only).

A (m x k) @ (k x n) matmul costs 2 m k n FLOPs. Element-wise work (norms, modulation, softmax,
GELU, the optimizer update) is left out, as MFU conventions do.

MMDiT forward, per sample, with D = heads * head_dim, N = image tokens = (h/p)(w/p), L = text
tokens, F = 4 D (MLP width), S = N + L, J = joint_attention_dim, P = pooled_projection_dim,
C / C_out = latent channels, p = patch:

  embeddings   2 N p^2 C D (patchify)  + 2 L J D (context_embedder)
               + 2 (256 D + D^2) (timestep MLP) + 2 (P D + D^2) (pooled-text MLP)
  per block    adaLN: 2 D (6 D or 9 D with dual attention) + 2 D (6 D, or 2 D in the last block)
               joint attention projections: 2 N D^2 * 4 (q, k, v, out) + 2 L D^2 * 3 (+1 for
               to_add_out, absent in the last block)
               joint attention: 2 S^2 D (scores) + 2 S^2 D (weights x values)
               dual attention (MMDiT-X blocks): 2 N D^2 * 4 + 4 N^2 D
               MLPs: 2 N D F * 2 (+ 2 L D F * 2 for the context MLP, absent in the last block)
  output       2 D (2 D) (norm_out) + 2 N D p^2 C_out (proj_out)

Train step (the MFU numerator, "model FLOPs"): full fine-tune = 3 x forward (backward = 2 x
forward: one matmul for the input gradient, one for the weight gradient). LoRA: the frozen
matmuls need only input gradients (1 x), attention still 2 x, the adapters 2 x:
2 x linear + 3 x attention + 3 x LoRA. Remat recomputes the forward of each rematerialised block
once more; that is counted separately (`recompute`) and never in MFU.
"""
from __future__ import annotations

from collections.abc import Iterable

from wfm_jax.models.layers.remat import rematerialises
from wfm_jax.models.sd3.transformer import sd3_config
from wfm_jax.programs.stats import count_jaxpr_flops  # noqa: F401 -- the bench's check of the formulas

TIME_CHANNELS = 256  # diffusers' Timesteps(num_channels=256)


def _lin(rows: int, fan_in: int, fan_out: int) -> float:
    return 2.0 * rows * fan_in * fan_out


def mmdit_forward(config: dict, latent_h: int, latent_w: int, text_len: int) -> dict:
    """Per-sample forward FLOPs of the SD3 MMDiT: {"linear", "attention", "total"}, plus the
    first-layer matmuls whose input gradient autodiff never computes (`first_layer`)."""
    cfg = sd3_config(config)
    p, c_in, c_out = cfg["patch_size"], cfg["in_channels"], cfg["out_channels"]
    d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    n = (latent_h // p) * (latent_w // p)
    seq, ff = n + text_len, 4 * d
    first = (_lin(n, p * p * c_in, d) + _lin(text_len, cfg["joint_attention_dim"], d)
             + _lin(1, TIME_CHANNELS, d) + _lin(1, cfg["pooled_projection_dim"], d))
    linear = first + 2 * _lin(1, d, d)  # linear_2 of both embedding MLPs
    attention = 0.0
    layers = cfg["num_layers"]
    for i in range(layers):
        last, dual = i == layers - 1, i in cfg["dual_attention_layers"]
        linear += _lin(1, d, (9 if dual else 6) * d) + _lin(1, d, (2 if last else 6) * d)
        linear += 4 * _lin(n, d, d) + (3 if last else 4) * _lin(text_len, d, d)
        attention += 4.0 * seq * seq * d
        if dual:
            linear += 4 * _lin(n, d, d)
            attention += 4.0 * n * n * d
        linear += 2 * _lin(n, d, ff) + (0 if last else 2 * _lin(text_len, d, ff))
    linear += _lin(1, d, 2 * d) + _lin(n, d, p * p * c_out)
    return {"linear": linear, "attention": attention, "total": linear + attention,
            "first_layer": first}


def lora_targets(config: dict, targets: Iterable[str]) -> list[tuple[str, bool]]:
    """(module name, on text tokens?) of each SD3 attention linear a LoRA target list hits."""
    cfg = sd3_config(config)
    names = []
    for i in range(cfg["num_layers"]):
        last = i == cfg["num_layers"] - 1
        mods = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "attn.add_q_proj",
                "attn.add_k_proj", "attn.add_v_proj"] + ([] if last else ["attn.to_add_out"])
        if i in cfg["dual_attention_layers"]:
            mods += ["attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0"]
        for m in mods:
            path = f"transformer_blocks.{i}.{m}"
            if any(path == t or path.endswith("." + t) for t in targets):
                names.append((path, "add_" in m or "to_add_out" in m))
    return names


def lora_forward(config: dict, latent_h: int, latent_w: int, text_len: int,
                 targets: Iterable[str], rank: int) -> float:
    """Per-sample forward FLOPs of the LoRA branches x A B (all targets are D -> D)."""
    cfg = sd3_config(config)
    d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    n = (latent_h // cfg["patch_size"]) * (latent_w // cfg["patch_size"])
    return sum(_lin(text_len if text else n, d, rank) + _lin(text_len if text else n, rank, d)
               for _, text in lora_targets(config, targets))


def train_step(config: dict, batch: int, latent_h: int, latent_w: int, text_len: int, *,
               lora_targets_: Iterable[str] | None = None, lora_rank: int = 0,
               remat: str = "everything_saveable") -> dict:
    """FLOPs of one SD3 train step over `batch` samples (see `train_step_from`)."""
    fwd = mmdit_forward(config, latent_h, latent_w, text_len)
    lora = (None if lora_targets_ is None else
            lora_forward(config, latent_h, latent_w, text_len, lora_targets_, lora_rank))
    return train_step_from(fwd, lora, _outside_blocks(config, latent_h, latent_w, text_len),
                           batch, remat)


def train_step_from(fwd: dict, lora: float | None, outside: float, batch: int,
                    remat: str = "everything_saveable") -> dict:
    """FLOPs of one train step over `batch` samples, from a per-sample forward count `fwd`
    ({"linear", "attention", "total", "first_layer"}), the LoRA branches' forward (None: full
    fine-tune) and the forward FLOPs outside the blocks (never rematerialised).

    model: the MFU numerator (conventions above). autodiff: the matmul FLOPs a full fine-tune's
    backward really runs (model minus the first layers' input gradients, which nothing needs).
    recompute: extra forward FLOPs remat adds (blocks only), not part of MFU.
    """
    if lora is None:
        model = 3.0 * fwd["total"]
        autodiff = model - fwd["first_layer"]
        lora = 0.0
    else:
        model = 2.0 * fwd["linear"] + 3.0 * fwd["attention"] + 3.0 * lora
        autodiff = None  # which frozen input gradients autodiff prunes depends on the targets
    block_fwd = fwd["total"] - outside + lora
    recompute = block_fwd if rematerialises(remat) else 0.0
    return {"model": batch * model, "forward": batch * (fwd["total"] + lora),
            "autodiff": None if autodiff is None else batch * autodiff,
            "recompute": batch * recompute}


def _outside_blocks(config: dict, latent_h: int, latent_w: int, text_len: int) -> float:
    """Forward FLOPs of the embeddings and the output head (not rematerialised)."""
    cfg = sd3_config(config)
    p = cfg["patch_size"]
    d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    n = (latent_h // p) * (latent_w // p)
    fwd = mmdit_forward(config, latent_h, latent_w, text_len)
    head = _lin(1, d, 2 * d) + _lin(n, d, p * p * cfg["out_channels"])
    return fwd["first_layer"] + 2 * _lin(1, d, d) + head


def _conv(h: int, w: int, k: int, c_in: int, c_out: int) -> float:
    return 2.0 * h * w * k * k * c_in * c_out


def vae_decode(vae_config: dict, latent_h: int, latent_w: int) -> float:
    """Per-sample FLOPs of AutoencoderKL.decode (3x3/1x1 convolutions and the mid attention)."""
    chans = tuple(reversed(vae_config["block_out_channels"]))
    layers = int(vae_config.get("layers_per_block", 1)) + 1
    zc = vae_config["latent_channels"]
    h, w = latent_h, latent_w
    total = _conv(h, w, 1, zc, zc) if vae_config.get("use_post_quant_conv", True) else 0.0
    total += _conv(h, w, 3, zc, chans[0])

    def resnet(h, w, c_in, c_out):
        skip = _conv(h, w, 1, c_in, c_out) if c_in != c_out else 0.0
        return _conv(h, w, 3, c_in, c_out) + _conv(h, w, 3, c_out, c_out) + skip

    total += 2 * resnet(h, w, chans[0], chans[0])
    if vae_config.get("mid_block_add_attention", True):
        t = h * w
        total += 4 * _lin(t, chans[0], chans[0]) + 4.0 * t * t * chans[0]
    for i, c_out in enumerate(chans):
        c_in = chans[max(i - 1, 0)]
        for j in range(layers):
            total += resnet(h, w, c_in if j == 0 else c_out, c_out)
        if i < len(chans) - 1:
            h, w = 2 * h, 2 * w
            total += _conv(h, w, 3, c_out, c_out)
    return total + _conv(h, w, 3, chans[-1], vae_config.get("out_channels", 3))


def rollout(config: dict, vae_config: dict, batch: int, steps: int, latent_h: int,
            latent_w: int, text_len: int) -> dict:
    """`steps` transformer forwards (no CFG: guidance 1.0) plus one VAE decode, per batch."""
    fwd = mmdit_forward(config, latent_h, latent_w, text_len)["total"]
    dec = vae_decode(vae_config, latent_h, latent_w)
    return {"model": batch * (steps * fwd + dec), "transformer": batch * steps * fwd,
            "vae_decode": batch * dec}


# ----------------------------------------------------------------------------- Cosmos DiT
# CosmosTransformer3DModel forward, per sample, with D = heads * head_dim, T latent frames (one
# timestep per frame, as the family feeds it), N = (T/pt)(h/ph)(w/pw) tokens, L text tokens of
# width W (crossattn_proj: W -> E = encoder_hidden_states_channels = text_embed_dim), F = mlp_ratio
# D, r = adaln_lora_dim, P = pt ph pw, C_in = in_channels + 1 (padding mask):
#   embeddings  2 N P C_in D (patchify) + 2 L W E (crossattn_proj) + 2 T (D^2 + 3 D^2) (time MLP)
#   per block   adaLN-LoRA x3: 3 * 2 T (D r + 3 r D)
#               self-attention: 4 * 2 N D^2 (q, k, v, out) + 4 N^2 D (scores, weights x values)
#               cross-attention: 2 * 2 N D^2 (q, out) + 2 * 2 L E D (k, v) + 4 N L D
#               MLP: 2 * 2 N D F
#   output      2 T (D r + 2 r D) (adaLN-LoRA, 2 chunks) + 2 N D P C_out (proj_out)


def _cosmos_dims(config: dict, frames: int, latent_h: int, latent_w: int) -> dict:
    from wfm_jax.models.cosmos.transformer import cosmos_config
    cfg = cosmos_config(config)
    pt, ph, pw = cfg["patch_size"]
    d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    return dict(cfg=cfg, d=d, n=(frames // pt) * (latent_h // ph) * (latent_w // pw),
                t=frames, r=cfg["adaln_lora_dim"], f=int(d * cfg["mlp_ratio"]),
                e=cfg["encoder_hidden_states_channels"] if cfg["use_crossattn_projection"]
                else cfg["text_embed_dim"], p=pt * ph * pw)


def cosmos_forward(config: dict, frames: int, latent_h: int, latent_w: int,
                   text_len: int) -> dict:
    """Per-sample forward FLOPs of the Cosmos DiT (conventions above): {"linear", "attention",
    "total", "first_layer", "outside_blocks"}."""
    k = _cosmos_dims(config, frames, latent_h, latent_w)
    cfg, d, n, t, r, ff, e, p = (k[x] for x in ("cfg", "d", "n", "t", "r", "f", "e", "p"))
    first = _lin(n, p * (cfg["in_channels"] + int(cfg["concat_padding_mask"])), d)
    first += _lin(t, d, d)  # time MLP linear_1: its input (the sinusoid) needs no gradient
    if cfg["use_crossattn_projection"]:
        first += _lin(text_len, cfg["crossattn_proj_in_channels"], e)
    head = _lin(t, d, r) + _lin(t, r, 2 * d) + _lin(n, d, p * cfg["out_channels"])
    outside = first + _lin(t, d, 3 * d) + head
    block = 3 * (_lin(t, d, r) + _lin(t, r, 3 * d))
    block += 6 * _lin(n, d, d) + 2 * _lin(text_len, e, d) + 2 * _lin(n, d, ff)
    attention = cfg["num_layers"] * (4.0 * n * n * d + 4.0 * n * text_len * d)
    linear = outside + cfg["num_layers"] * block
    return {"linear": linear, "attention": attention, "total": linear + attention,
            "first_layer": first, "outside_blocks": outside}


def cosmos_lora_forward(config: dict, frames: int, latent_h: int, latent_w: int, text_len: int,
                        targets: Iterable[str], rank: int) -> float:
    """Per-sample forward FLOPs of the LoRA branches x A B on the Cosmos blocks' linears."""
    k = _cosmos_dims(config, frames, latent_h, latent_w)
    d, n, ff, e = k["d"], k["n"], k["f"], k["e"]
    # module -> (rows, fan_in, fan_out)
    mods = {"attn1.to_q": (n, d, d), "attn1.to_k": (n, d, d), "attn1.to_v": (n, d, d),
            "attn1.to_out.0": (n, d, d), "attn2.to_q": (n, d, d),
            "attn2.to_k": (text_len, e, d), "attn2.to_v": (text_len, e, d),
            "attn2.to_out.0": (n, d, d), "ff.net.0.proj": (n, d, ff), "ff.net.2": (n, ff, d)}
    total = 0.0
    for m, (rows, fan_in, fan_out) in mods.items():
        if any(m == x or m.endswith("." + x) for x in targets):
            total += _lin(rows, fan_in, rank) + _lin(rows, rank, fan_out)
    return k["cfg"]["num_layers"] * total
