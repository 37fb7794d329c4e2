"""SFT that teaches the tiny SD3 pipeline the shapes world: the second stage of
`python -m wfm_jax.tiny --pretrained DIR` (which first builds the base pipeline, its fitted VAE
and the dataset, then runs this recipe with wfm_jax's own SFT trainer on them).

Run alone it trains whatever pipeline and paired dataset it is pointed at:

    python -m wfm_jax.main --config configs/tiny_pretrain.py \
        --config.policy.model_name_or_path=BASE --config.train.train_policy.dataset.local_dir=DATA
"""
from wfm_jax.train.pretrain import pretrain_recipe


def get_config():
    return pretrain_recipe()
