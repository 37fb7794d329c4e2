"""Stable Diffusion 3 / 3.5 (StableDiffusion3Pipeline). Light: the recipes' schema reads this."""

# cosmos-rl's SD3.5 NFT/SFT LoRA list: the joint attention's image and text projections
LORA_TARGETS = (
    "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
    "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_add_out",
)
