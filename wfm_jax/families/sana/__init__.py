"""SANA 1.5 (SanaPipeline) and SANA-Video (SanaVideoPipeline). Light: the recipes' schema reads this."""

# cosmos-rl's configs/sana/*-lora.toml and *-nft.toml (r 4, alpha 4): the linear self-attention
# (attn1) and the cross-attention (attn2) projections, no FFN
LORA_TARGETS = ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0",
                "attn2.to_q", "attn2.to_k", "attn2.to_v", "attn2.to_out.0")
