"""DiffusionNFT: the loss (loss.py, array functions) and the algorithm on the shared RL loop
(algorithm.py: NFT, NFTConfig)."""
from wfm_jax.algorithms.nft.algorithm import NFT, NFTConfig, nft_grads, nft_rollout
from wfm_jax.algorithms.nft.loss import nft_loss, train_timesteps, trained_step_count

__all__ = ["NFT", "NFTConfig", "nft_grads", "nft_loss", "nft_rollout", "train_timesteps",
           "trained_step_count"]
