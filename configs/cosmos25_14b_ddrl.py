"""DDRL post-training of Cosmos-Predict2.5-14B at 720p: cosmos-rl's
cosmos_predict2-5_14b_720_reason_embedding_ddrl.toml (the values of
configs/cosmos25_2b_ddrl.py, which this recipe composes), FSDP shards of 32 devices and context
parallel 8 (cosmos-rl's); 1024 GPUs recommended.

    python -m wfm_jax.main --config configs/cosmos25_14b_ddrl.py \
        --config.train.train_policy.dataset.local_dir=/path/to/dataset   # videos/ + metas/
"""
from wfm_jax.config.recipe import compose


def get_config():
    c = compose("cosmos25_2b_ddrl.py")  # the same cosmos-rl values
    c.policy.model_name_or_path = "nvidia/Cosmos-Predict2.5-14B"
    c.policy.parallelism.fsdp = 32
    c.policy.parallelism.context = 8
    c.plan.target = "v5p:8x8x4"  # what it is planned to fit: 256 chips: its mesh is fsdp 32 x context 8
    return c
