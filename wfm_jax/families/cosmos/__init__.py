"""Cosmos-Predict2.5 (Cosmos2_5_PredictBasePipeline). Light: the recipes' schema reads this."""

# cosmos-predict2-5-2b-720-nft.toml's list (attn1 and attn2, not crossattn_proj)
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2")
