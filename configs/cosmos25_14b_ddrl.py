"""DDRL post-training of Cosmos-Predict2.5-14B at 720p: cosmos-rl's
cosmos_predict2-5_14b_720_reason_embedding_ddrl.toml (values: `ddrl_720` in
configs/cosmos25_2b_ddrl.py), FSDP shards of 32 devices and context parallel 8 (cosmos-rl's);
1024 GPUs recommended.

    python -m wfm_jax.main --config configs/cosmos25_14b_ddrl.py \
        --config.train.train_policy.dataset.local_dir=/path/to/dataset   # videos/ + metas/
"""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "cosmos25_2b_ddrl",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "cosmos25_2b_ddrl.py"))
_shared = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_shared)


def get_config():
    return _shared.ddrl_720("nvidia/Cosmos-Predict2.5-14B", "./outputs/cosmos25_14b_ddrl",
                            fsdp=32, context=8)
