"""What every Cosmos-Predict2.5 recipe shares (configs/cosmos25_*.py start from it with
`compose("base/cosmos25_2b.py")`; the 14B one changes the checkpoint): the released 2B
checkpoint and its 93-frame video shape. The resolution is each recipe's (cosmos-rl's recipes
differ: 720p DDRL, 480p GRPO, 512x512 NFT, the pipeline's 704x1280 for SFT).

    huggingface-cli download nvidia/Cosmos-Predict2.5-2B --revision diffusers/base/post-trained \
        --local-dir nvidia/Cosmos-Predict2.5-2B
"""
from wfm_jax.config.schema import default_config


def get_config():
    c = default_config()
    c.train.max_steps = 2000
    c.train.ema_enable = True  # every Cosmos recipe validates and exports the EMA weights
    c.policy.model_name_or_path = "nvidia/Cosmos-Predict2.5-2B"  # revision diffusers/base/post-trained
    c.policy.family = "cosmos"
    d = c.policy.diffusers
    d.is_video = True
    d.train_frames = 93  # Cosmos2_5_PredictBasePipeline's default: 24 latent frames
    d.inference_frames = 93
    d.max_prompt_length = 512  # cosmos-rl's max_prompt_length (the rollout's text length)
    d.sample.eval_num_steps = 36  # Cosmos2_5_PredictBasePipeline's default
    c.policy.remat = "nothing_saveable"  # 93 frames: each block rematerialised
    return c
