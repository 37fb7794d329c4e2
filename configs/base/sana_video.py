"""What every SANA-Video 2B (480p) recipe shares (configs/sana_video_*.py start from it with
`compose("base/sana_video.py")`): the released checkpoint, its video shape and text length, and
cosmos-rl's mesh for it (configs/sana/sana-video-*.toml).

    huggingface-cli download Efficient-Large-Model/SANA-Video_2B_480p_diffusers \
        --local-dir Efficient-Large-Model/SANA-Video_2B_480p_diffusers
"""
from wfm_jax.config.schema import default_config


def get_config():
    c = default_config()
    c.train.max_steps = 2000
    c.policy.model_name_or_path = "Efficient-Large-Model/SANA-Video_2B_480p_diffusers"
    c.policy.family = "sana_video"
    d = c.policy.diffusers
    d.is_video = True
    d.inference_size = (480, 832)
    # SanaVideoPipeline's default; 4k + 1 (the Wan VAE): 21 latent frames. Clips are cut to
    # train_frames and rollouts / validation sample inference_frames (cosmos-rl always sampled 81)
    d.train_frames = 81
    d.inference_frames = 81
    d.max_prompt_length = 300  # SanaVideoPipeline's max_sequence_length
    # dp_shard_size 8: parameters sharded over every device, blocks rematerialised
    # (model_gradient_checkpointing)
    c.policy.parallelism.data = 1
    c.policy.parallelism.fsdp = -1
    c.policy.remat = "nothing_saveable"
    return c
