"""reward_client: rewards for wfm_jax RL, remote (cosmos-rl reward protocol) or in-process.

Trainer entry point: ``RewardComputer`` (see reward_client/computer.py for the API).
Add a local reward: ``@register_reward("name")`` (see reward_client/registry.py).
Reference server: ``python -m reward_client.server``; checking a service:
``python -m reward_client score --reward NAME=WEIGHT ... --images x.npy --prompts p.txt``.
"""
from reward_client.catalog import available_rewards
from reward_client.client import RemoteRewardClient
from reward_client.combine import RewardFnSpec, combine_scores, parse_reward_fns
from reward_client.computer import RewardComputer, RewardResult
from reward_client.config import RemoteConfig, resolve_remote_config
from reward_client.errors import (
                                  RewardConfigError,
                                  RewardError,
                                  RewardProtocolError,
                                  RewardServiceError,
                                  RewardUnavailableError,
                                  RewardValueError,
)
from reward_client.registry import register_reward

__all__ = [
                                  "RemoteConfig",
                                  "RemoteRewardClient",
                                  "RewardComputer",
                                  "RewardConfigError",
                                  "RewardError",
                                  "RewardFnSpec",
                                  "RewardProtocolError",
                                  "RewardResult",
                                  "RewardServiceError",
                                  "RewardUnavailableError",
                                  "RewardValueError",
                                  "available_rewards",
                                  "combine_scores",
                                  "parse_reward_fns",
                                  "register_reward",
                                  "resolve_remote_config",
]
