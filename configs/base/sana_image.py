"""What every SANA1.5 1.6B recipe shares (configs/sana_image_*.py start from it with
`compose("base/sana_image.py")`): the released 1024px checkpoint, its size and text length, and
cosmos-rl's mesh for it (configs/sana/*.toml).

    huggingface-cli download Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers \
        --local-dir Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers
"""
from wfm_jax.config.schema import default_config


def get_config():
    c = default_config()
    c.train.max_steps = 2000
    c.policy.model_name_or_path = "Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers"
    c.policy.family = "sana"
    d = c.policy.diffusers
    d.inference_size = (1024, 1024)
    d.max_prompt_length = 300  # SanaPipeline's max_sequence_length
    # dp_shard_size 8: parameters sharded over every device, blocks rematerialised
    # (model_gradient_checkpointing)
    c.policy.parallelism.data = 1
    c.policy.parallelism.fsdp = -1
    c.policy.remat = "nothing_saveable"
    return c
