"""SFT that teaches the tiny SD3 pipeline the shapes world: the second stage of
`python -m wfm_jax.tiny --pretrained DIR` (which first builds the base pipeline, its fitted VAE
and the dataset, then runs this recipe with wfm_jax's own SFT trainer on them).

Run alone it trains whatever pipeline and paired dataset it is pointed at:

    python -m wfm_jax.main --config configs/tiny_pretrain.py \
        --config.policy.model_name_or_path=BASE --config.train.train_policy.dataset.local_dir=DATA
"""
from wfm_jax.config.schema import default_config


def get_config():
    c = default_config()
    c.train.output_dir = "./outputs/tiny_pretrain"
    c.train.train_policy.type = "sft"
    c.train.max_steps = 1500
    c.train.seed = 0
    c.train.param_dtype = "float32"
    c.train.compute_dtype = "float32"
    c.train.train_batch_per_replica = 16
    c.train.optm_lr = 2e-3
    c.train.optm_weight_decay = 1e-4
    c.train.optm_warmup_steps = 20
    c.train.lr_schedule = "cosine"  # decays to 0 by the last step
    c.train.optm_grad_norm_clip = 1.0
    c.train.ema_enable = True
    c.train.ema_decay = 0.98
    c.train.log_freq = 10
    c.train.ckpt.save_freq = 100000  # only the final checkpoint: saving is slow on 2 cores
    c.train.ckpt.max_keep = 1
    # 60 prompts and 1200 fixed images: T5/CLIP and the VAE encoder run once per prompt / image
    # instead of every step (losses bit-equal to the uncached run)
    c.train.train_policy.cache_encodings = True
    ds = c.train.train_policy.dataset
    ds.local_dir = "./outputs/tiny_pretrain_data"
    ds.layout = "paired"
    c.policy.model_name_or_path = "./outputs/tiny_pretrain_base"
    c.policy.lora.enable = False
    d = c.policy.diffusers
    d.inference_size = (32, 32)
    d.max_prompt_length = 16
    d.weighting_scheme = "logit_normal"
    c.policy.parallelism.data = -1
    return c
