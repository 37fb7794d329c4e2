"""Wan2.1 (WanPipeline). Light: the recipes' schema reads this."""

# No cosmos-rl recipe exists: the analogue of its Cosmos-Predict2.5 NFT list, the self- and
# cross-attention projections and both FFN linears (spec video_models.md §5.5)
LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2")
