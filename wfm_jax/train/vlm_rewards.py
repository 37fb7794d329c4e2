"""The VLM GRPO trainer's rewards: lm_grpo.rewards weighted by lm_grpo.reward_weights, scored in
this process (reward_client's text rewards) or, with train.train_policy.use_remote_reward, by the
reward service (media_type "text", reward_client/protocol.py; enqueue_url / fetch_url / token /
budget_s from train.train_policy.remote_reward or REMOTE_REWARD_*, as the diffusion trainers).

Either way total = sum(weight * reward): the service only replaces where each reward is computed,
not how they combine (no per-function or total clip, no scale, unlike the diffusion RewardComputer
totals). A reward the service cannot give stops the run with one RewardError line.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reward_client import protocol
from reward_client.catalog import get_reward
from reward_client.computer import RewardComputer
from reward_client.config import resolve_remote_config
from reward_client.errors import RewardConfigError
from wfm_jax.core.errors import UserError


class VLMRewardError(UserError, ValueError):
    """lm_grpo.rewards / reward_weights or the remote reward settings cannot be used."""


class TextRewards:
    def __init__(self, names: Sequence[str], weights: Sequence[float], computer: RewardComputer | None = None):
        where = "train.train_policy.lm_grpo.rewards"
        if len(names) != len(weights) or not names:
            raise VLMRewardError(f"{where} {tuple(names)} and reward_weights {tuple(weights)} must be "
                                 f"non-empty and of one length")
        try:
            rewards = [get_reward(name) for name in names]
        except RewardConfigError as e:  # the name, the nearest one and the known ones in one line
            raise VLMRewardError(f"{where}: {e}") from None
        pixel = [rw.name for rw in rewards if rw.media != "text"]
        if pixel:
            raise VLMRewardError(f"{where}: {pixel} score pixels, not text")
        self.names = [str(n) for n in names]
        self.weights = [float(w) for w in weights]
        self.computer = computer

    @classmethod
    def from_config(cls, config, environ=None) -> TextRewards:
        tp = config.train.train_policy
        names, weights = tuple(tp.lm_grpo.rewards), tuple(tp.lm_grpo.reward_weights)
        rewards = cls(names, weights)  # the names are text rewards, before any connection
        if not tp.use_remote_reward:
            return rewards
        rr = tp.remote_reward
        remote = {k: v for k, v in (("enqueue_url", rr.enqueue_url), ("fetch_url", rr.fetch_url),
                                    ("token", rr.token)) if v}
        remote["budget_s"] = float(rr.budget_s)
        try:
            cfg = resolve_remote_config(remote, environ)
            if cfg is None:
                raise RewardConfigError(
                    "train.train_policy.use_remote_reward is true but no reward service is set: set "
                    "train.train_policy.remote_reward.enqueue_url / fetch_url (or "
                    "REMOTE_REWARD_ENQUEUE_URL / REMOTE_REWARD_FETCH_URL)")
            # each reward pulled by its own name; weights sent as the protocol asks (> 0: compute it)
            computer = RewardComputer([{"name": n, "weight": w, "local": False, "clip": None, "score_key": n}
                                       for n, w in zip(names, weights, strict=True)],
                                      remote=cfg, clip=None, on_failure="raise")
        except RewardConfigError as e:
            raise VLMRewardError(f"train.train_policy.remote_reward: {e}") from None
        rewards.computer = computer
        return rewards

    @property
    def remote(self) -> bool:
        return self.computer is not None

    def check_reachable(self) -> None:
        """Ping the service and check it serves these names (a RewardError line otherwise)."""
        if self.computer is not None:
            self.computer.check_reachable()

    def score(self, texts: Sequence[str], prompts: Sequence[str],
              references: Sequence[str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """-> ({name: float64 [B]}, float64 [B] = sum(weight * reward))."""
        extras = {"references": [str(r) for r in references]}
        if self.computer is None:
            per_reward = {n: np.asarray(get_reward(n).fn(list(texts), list(prompts), extras), np.float64)
                          for n in self.names}
        else:
            result = self.computer.score(protocol.text_media(texts), [str(p) for p in prompts],
                                         extras=extras, media_type="text")
            per_reward = {n: np.asarray(result.per_fn[n], np.float64) for n in self.names}
        total = sum(w * per_reward[n] for n, w in zip(self.names, self.weights, strict=True))
        return per_reward, np.asarray(total, np.float64)

    def close(self) -> None:
        if self.computer is not None:
            self.computer.close()
