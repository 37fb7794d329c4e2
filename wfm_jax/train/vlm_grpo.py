"""GRPO post-training of a vision-language model (Qwen3-VL / Cosmos-Reason2), as cosmos-rl runs
it for language models (specs/reason2.md §4.2): rollouts by the KV-cache sampler, groups of
rollout.n_generation completions per prompt, weighted text rewards, group-normalised advantages,
cosmos-rl's "grpo" or "dapo" variant for groups of equal rewards, the dual-clip loss
(programs/vlm_grpo.py).

One loop step:
  1. G = train_batch_per_replica / n_generation prompts, drawn from (train.seed, step) alone;
     each prompt is its record's first human turn (media + question) with the generation prompt;
  2. N completions each: `generate` with seed (train.seed, step), at lm_grpo.temperature / top_p /
     top_k, up to lm_grpo.max_response_length tokens, rollout.batch_size prompts per call (None:
     all); a completion is its tokens up to and with its end token (`<|im_end|>`), decoded
     without special tokens for the rewards;
  3. rewards: sum of weight * reward (reward_client's text rewards, the record's `answer` the
     reference; here, or by the reward service with use_remote_reward: train/vlm_rewards.py),
     advantages per group (0 for a group of equal rewards). A group is valid when its filter
     rewards (the sum of lm_grpo.filter_reward_metric's) are not all equal. lm_grpo.variant
     "grpo" (cosmos-rl's default) trains on every group; "dapo" (cosmos-rl's dynamic sampling)
     keeps the valid groups and draws G more prompts from (train.seed, step, draw) until it has
     G valid groups, at most lm_grpo.max_retry_for_on_policy draws (<= 0: until every prompt has
     been drawn once this step), else one line and exit; with lm_grpo.min_filter_prefix_tokens,
     in a valid group (without a filter metric: one of differing rewards) a prefix shared by
     completions of differing rewards carries no loss (lm_grpo.ignore_prefix_lengths);
  4. the update batch: prompt + completion rows in group order, left-padded prompts to a
     multiple of policy.vlm.pad_to_multiple and completions to max_response_length (fixed shapes:
     one program), M-RoPE position ids from the rows' own masks; mu_iterations passes, each of
     one optimizer update per batch_size_per_optimize rows (None: one over the whole batch), each
     update in train.grad_accum_steps micro-batches (the update's memory is one micro-batch's).

Run length: train.max_steps steps, or train.epoch passes of the prompts
(prompts x n_generation x epoch // train_batch_per_replica steps), or the smaller of the two
(config/run_length.py, cosmos-rl's rule).

Resume: the state (params, optimizer, step) is checkpointed and every draw is a function of
(seed, step), so kill -9 and resume logs the same metrics step for step. metrics.jsonl:
train/reward_mean, train/reward/<name>, train/loss, train/policy_loss, train/kl_loss,
train/clip_fraction, train/kept_groups (groups trained on), train/mixed_groups (of them, those of
differing rewards: the ones with a gradient), train/sampled_groups (groups rolled out; "dapo"
draws more), train/completion_length, optimizer/grad_norm,
train/learning_rate, train/iteration_time; val/accuracy (greedy, held-out) at step 0 and with
the last step. The end: a checkpoint and an export as the SFT trainer's.
"""
from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np
from flax import nnx

from wfm_jax.algorithms import lm_grpo
from wfm_jax.config.run_length import resolve_max_steps
from wfm_jax.core.mesh import MeshConfig, check_batch, make_mesh
from wfm_jax.data.conversations import read_records, to_messages
from wfm_jax.families.qwen3_vl.answer import load_processor
from wfm_jax.models.qwen3_vl.generate import Sampling, generate
from wfm_jax.models.qwen3_vl.rope_index import position_ids
from wfm_jax.programs import vlm_grpo
from wfm_jax.train import preempt
from wfm_jax.train import vlm_sft as sft_trainer
from wfm_jax.train.metrics import MetricsLogger, check_finite
from wfm_jax.train.vlm_eval import end_tokens, read_images, val_metrics
from wfm_jax.train.vlm_rewards import TextRewards, VLMRewardError
from wfm_jax.train.vlm_sft import VLMSetupError, build_tiny_assets, check_model_dir, load_base


def grpo_config(config) -> lm_grpo.LMGRPOConfig:
    try:
        return vlm_grpo.grpo_config(config)
    except ValueError as e:
        raise VLMSetupError(str(e)) from None


def prompt_text(processor, record: dict, system_prompt: str | None) -> str:
    """The record's first human turn (and system prompt) with the assistant header to generate after."""
    messages, _, _ = to_messages(record, system_prompt)
    first_user = next(k for k, m in enumerate(messages) if m["role"] == "user")
    return processor.apply_chat_template(messages[:first_user + 1], add_generation_prompt=True)


def left_pad(ids: np.ndarray, mask: np.ndarray, multiple: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded (B, L) rows widened on the left to a multiple of `multiple`."""
    extra = -(-ids.shape[1] // multiple) * multiple - ids.shape[1]
    return (np.pad(ids, ((0, 0), (extra, 0)), constant_values=pad_id),
            np.pad(mask, ((0, 0), (extra, 0)), constant_values=0))


def completion_masks(tokens: np.ndarray, eos: Sequence[int], banned: Sequence[int] = ()) -> np.ndarray:
    """(B, T) int64: each row's tokens up to and with its first end token (all T if it has none),
    and before its first `banned` token: a sampled visual placeholder (<|image_pad|>, ...) would
    claim pixels the row does not have, so the completion stops short of it."""
    is_end = np.isin(tokens, list(eos))
    after_end = np.cumsum(is_end, axis=1) - is_end > 0
    cut = np.cumsum(np.isin(tokens, list(banned)), axis=1) > 0
    return (~after_end & ~cut).astype(np.int64)


def filter_metric(config, reward_names: Sequence[str], variant: str) -> tuple[str, ...]:
    """lm_grpo.filter_reward_metric, checked: names among lm_grpo.rewards; "dapo" needs one (with
    none, cosmos-rl's filter rewards are all 0, every group is dropped and it draws forever)."""
    key = "train.train_policy.lm_grpo.filter_reward_metric"
    raw = config.train.train_policy.lm_grpo.filter_reward_metric
    names = (raw,) if isinstance(raw, str) else tuple(str(n) for n in raw)
    unknown = [n for n in names if n not in reward_names]
    if unknown:
        raise VLMSetupError(f"{key} {unknown} are not among lm_grpo.rewards {tuple(reward_names)}: a filter "
                            f"reward is one of the rewards the step computes")
    if variant == "dapo" and not names:
        raise VLMSetupError(f"train.train_policy.lm_grpo.variant 'dapo' keeps the groups whose filter rewards "
                            f"differ: set {key}, e.g. ('single_choice',)")
    return names


class VLMGRPOTrainer:
    def __init__(self, config, *, on_step: Callable[[int, dict], None] | None = None):
        self.config, self.on_step = config, on_step
        t, p, v = config.train, config.policy, config.policy.vlm
        self.cfg = grpo_config(config)
        try:
            self.rewards = TextRewards.from_config(config)
        except VLMRewardError as e:
            raise VLMSetupError(str(e)) from None
        self.rewards.check_reachable()  # an unreachable service fails here, before the model loads
        self.filter_names = filter_metric(config, self.rewards.names, self.cfg.variant)
        try:
            split = vlm_grpo.grpo_rows(config, self.cfg)
        except ValueError as e:
            raise VLMSetupError(str(e)) from None
        self.rows, self.groups, self.per_optimize = split.step, split.groups, split.per_update
        self.micro_rows, self.rollout_rows = split.micro, split.per_call
        build_tiny_assets(config)
        check_model_dir(p.model_name_or_path)
        self.processor = load_processor(p.model_name_or_path)
        self.system_prompt = v.system_prompt or None
        self.records, self.images = self._read(t.train_policy.dataset.local_dir, "train.train_policy.dataset.local_dir")
        if self.groups > len(self.records):
            raise VLMSetupError(f"{self.groups} prompts per step (train_batch_per_replica / n_generation) but "
                                f"the dataset has {len(self.records)}")
        # before the optimizer: the LR schedule and config.json take the resolved length
        resolve_max_steps(config, len(self.records), "prompts")
        self.val = None
        if config.validation.enable or config.validation.dataset.local_dir:
            self.val = self._read(config.validation.dataset.local_dir, "validation.dataset.local_dir")
        self.mesh = make_mesh(MeshConfig.from_any(p.parallelism))
        try:
            check_batch(self.mesh, self.micro_rows)
            check_batch(self.mesh, self.rollout_rows)  # the rollout splits its rows over the mesh too
        except ValueError as e:
            raise VLMSetupError(f"train.train_batch_per_replica / batch_size_per_optimize / grad_accum_steps / "
                                f"rollout.batch_size: {e}") from None
        model = load_base(config)
        self.eos, self.pad = end_tokens(model.config)
        self.merge_size = int(model.config.vision.spatial_merge_size)
        mc = model.config
        self.visual_ids = tuple(int(i) for i in (mc.image_token_id, mc.video_token_id, mc.vision_start_token_id,
                                                 mc.vision_end_token_id) if i is not None)
        trained = sft_trainer.TrainedModel(config, model, self.mesh)
        self.lora, self.graphdef, self.frozen = trained.lora, trained.graphdef, trained.frozen
        self.tx, self.lr = trained.tx, trained.lr
        # the KL reference: the starting policy (rebuilt the same way on resume)
        self.ref_params = (jax.tree.map(lambda x: x.copy(), trained.state.params)
                           if self.cfg.kl_beta else None)
        self.step_fn = vlm_grpo.VLMGRPOStep(self.graphdef, self.tx, self.mesh, self.cfg)
        self.logprobs = vlm_grpo.VLMLogprobs(self.graphdef, self.mesh, self.cfg.temperature)
        self.ckpt, self.state, self.start_step = sft_trainer.checkpointer_and_start(config, trained.state)

    def _read(self, location: str, key: str):
        try:
            records = read_records(location)
        except (FileNotFoundError, ValueError) as e:
            raise VLMSetupError(f"{key}: {e}") from None
        if not records:
            raise VLMSetupError(f"{key}: {location} holds no records")
        missing = [r.get("id", i) for i, r in enumerate(records) if "answer" not in r]
        if missing and key.startswith("train"):
            raise VLMSetupError(f"{key}: records {missing[:3]} have no 'answer' (the rewards' reference)")
        root = location if os.path.isdir(location) else os.path.dirname(os.path.abspath(location))
        if key.startswith("train") and self.config.policy.vlm.media_root:
            root = self.config.policy.vlm.media_root
        try:
            return records, read_images(records, root)
        except OSError as e:
            raise VLMSetupError(f"{key}: {e}") from None

    def model(self):
        return nnx.merge(self.graphdef, self.state.params, self.frozen)

    # -- one step's rollout, rewards and update batch --
    def prompts(self, step: int) -> list[int]:
        rng = np.random.default_rng([int(self.config.train.seed), step])
        return rng.choice(len(self.records), self.groups, replace=False).tolist()

    def encode_prompts(self, indices: Sequence[int]) -> dict[str, np.ndarray]:
        """Left-padded prompt rows of these records (pixels in row order), widened to the pad multiple."""
        texts = [prompt_text(self.processor, self.records[i], self.system_prompt) for i in indices]
        flat = [im for i in indices for im in self.images[i]]
        out = dict(self.processor(texts, images=flat or None, padding_side="left"))
        out["input_ids"], out["attention_mask"] = left_pad(
            np.asarray(out["input_ids"]), np.asarray(out["attention_mask"]),
            int(self.config.policy.vlm.pad_to_multiple), int(self.processor.tokenizer.pad_token_id))
        return out

    def draw(self, step: int, draw: int, used: set[int]) -> list[int]:
        """Variant "dapo"'s draw `draw` >= 1 of step `step` (draw 0 is `prompts(step)`): G more
        prompts from (seed, step, draw) among those not drawn yet this step (fewer left: topped up
        with drawn ones, so that every draw is one rollout program's shape)."""
        left = np.asarray(sorted(set(range(len(self.records))) - used), np.int64)
        rng = np.random.default_rng([int(self.config.train.seed), step, 2, draw])
        pick = left[rng.permutation(len(left))[:self.groups]]
        if len(pick) < self.groups:
            again = np.asarray(sorted(used), np.int64)
            pick = np.concatenate([pick, again[rng.permutation(len(again))[:self.groups - len(pick)]]])
        return pick.tolist()

    def sample(self, indices: Sequence[int], step: int, draw: int = 0) -> dict:
        """N completions of each prompt in `indices`, their rewards, and which groups are valid
        (their filter rewards differ; None without a filter metric)."""
        n = self.cfg.n_generation
        rows = [i for i in indices for _ in range(n)]
        sampling = Sampling(self.cfg.rollout_temperature, max(self.cfg.top_k, 0), self.cfg.top_p)
        model, parts = self.model(), []
        # rollout.batch_size prompts (x n completions) per generate call: the cache and the
        # prefill's activations are one call's; each call's draw from (seed, step, call[, draw])
        for call, start in enumerate(range(0, len(rows), self.rollout_rows)):
            prompt = self.encode_prompts(rows[start:start + self.rollout_rows])
            key = [int(self.config.train.seed), step, 1, *([call] if call or draw else []), *([draw] if draw else [])]
            seed = int(np.random.default_rng(key).integers(2**31))
            tokens = generate(model, prompt["input_ids"], prompt["attention_mask"],
                              pixel_values=prompt.get("pixel_values"), image_grid_thw=prompt.get("image_grid_thw"),
                              max_new_tokens=self.cfg.max_response_length, sampling=sampling, seed=seed,
                              eos_token_ids=self.eos, pad_token_id=self.pad, mesh=self.mesh)
            parts.append(np.pad(tokens, ((0, 0), (0, self.cfg.max_response_length - tokens.shape[1])),
                                constant_values=self.pad))
        tokens = np.concatenate(parts)
        cmask = completion_masks(tokens, self.eos, self.visual_ids)
        tokens = np.where(cmask > 0, tokens, self.pad)
        tok = self.processor.tokenizer
        # each completion's tokens without padding and end token: decoded for the rewards, and
        # the trie min_filter_prefix_tokens walks
        ids = [r[(m > 0) & ~np.isin(r, self.eos)].tolist() for r, m in zip(tokens, cmask, strict=True)]
        texts = [tok.decode(seq, skip_special_tokens=True) for seq in ids]
        # the prompts the rewards see: each row's question as the model saw it
        questions = {i: prompt_text(self.processor, self.records[i], self.system_prompt) for i in set(rows)}
        prompts = [questions[i] for i in rows]
        per_reward, total = self.rewards.score(texts, prompts, [str(self.records[i]["answer"]) for i in rows])
        groups = len(indices)
        rewards = np.asarray(total, np.float32).reshape(groups, n)
        # cosmos-rl's filter reward: the filter metric's rewards summed (weight 1 each)
        valid = (np.asarray(lm_grpo.group_keep(sum(per_reward[k] for k in self.filter_names).reshape(groups, n)))
                 if self.filter_names else None)
        return {"rows": rows, "tokens": tokens, "completion_mask": cmask, "ids": ids, "texts": texts,
                "rewards": rewards, "valid": valid, "per_reward": per_reward}

    def valid_groups(self, step: int, sampled: list[dict]) -> list[tuple[dict, int]]:
        """Variant "dapo": the valid groups of the step's draw (sampled[0]), then of more draws
        (appended to `sampled`) until there are G, as (draw's sample, group index in it)."""
        used, limit, kept = set(sampled[0]["rows"]), self.cfg.max_retry_for_on_policy, []
        for draw in itertools.count(1):
            part = sampled[-1]
            kept += [(part, int(k)) for k in np.flatnonzero(part["valid"])]
            if len(kept) >= self.groups:
                return kept[:self.groups]
            if 0 < limit <= draw or len(used) >= len(self.records):
                why = (f"lm_grpo.max_retry_for_on_policy={limit} draws" if 0 < limit <= draw
                       else f"drawing all {len(self.records)} prompts")
                raise VLMSetupError(f"step {step}: after {why}, {len(kept)} of the {self.groups} groups a step "
                                    f"needs have differing {'+'.join(self.filter_names)} rewards (variant "
                                    f"'dapo'): the prompts are too easy or too hard for the policy")
            indices = self.draw(step, draw, used)
            used.update(indices)
            sampled.append(self.sample(indices, step, draw))
        raise AssertionError("unreachable")

    def rollout(self, step: int) -> dict:
        """Prompts, completions, rewards and advantages of step `step`: its G groups ("dapo": G
        valid ones, from as many draws as that takes), with the rewards of every group sampled."""
        n, g = self.cfg.n_generation, self.groups
        sampled = [self.sample(self.prompts(step), step)]
        kept = ([(sampled[0], k) for k in range(g)] if self.cfg.variant == "grpo"
                else self.valid_groups(step, sampled))
        listed = lambda key: [x for part, k in kept for x in part[key][k * n:(k + 1) * n]]  # the kept rows'
        pick = lambda key: np.concatenate([part[key][k * n:(k + 1) * n] for part, k in kept])
        rewards = np.stack([part["rewards"][k] for part, k in kept])
        ids = listed("ids")
        adv = np.asarray(lm_grpo.group_advantages(rewards, unbiased=self.cfg.unbiased_advantage,
                                                  eps=self.cfg.advantage_eps)).reshape(-1)
        # the prefix rule walks the filter's valid groups (without a filter metric: those of
        # differing rewards, as cosmos-rl before its filter metric; it now walks none then)
        prefix = [self.cfg.min_filter_prefix_tokens if part["valid"] is None or part["valid"][k] else None
                  for part, k in kept]
        ignore = [x for j in range(g) for x in lm_grpo.ignore_prefix_lengths(
            ids[j * n:(j + 1) * n], rewards[j].tolist(), prefix[j])]
        per_reward = {name: np.concatenate([p["per_reward"][name] for p in sampled])
                      for name in sampled[0]["per_reward"]}
        return {"rows": listed("rows"), "tokens": pick("tokens"), "completion_mask": pick("completion_mask"),
                "texts": listed("texts"),
                "rewards": rewards, "advantages": adv, "ignore": np.asarray(ignore),
                # the step's reward curve: every sampled completion, not only the kept groups
                "sampled_rewards": np.concatenate([p["rewards"] for p in sampled]), "per_reward": per_reward,
                "sampled_groups": sum(len(p["rows"]) // n for p in sampled),
                "mixed_groups": int(np.asarray(lm_grpo.group_keep(rewards)).sum())}

    def update_batch(self, roll: dict, order: Sequence[int]) -> dict[str, np.ndarray]:
        """Prompt + completion rows `order` of a rollout (prompt pixels re-encoded in that order)."""
        prompt = self.encode_prompts([roll["rows"][k] for k in order])
        ids = np.concatenate([prompt["input_ids"], roll["tokens"][order]], axis=1)
        cmask = roll["completion_mask"][order]
        # min_filter_prefix_tokens: the shared prefix carries no loss (lm_grpo.ignore_prefix_lengths)
        cmask = cmask * (np.arange(cmask.shape[1])[None, :] >= roll["ignore"][order, None])
        attention = np.concatenate([prompt["attention_mask"], roll["completion_mask"][order]], axis=1)
        proc = self.processor
        pos, _ = position_ids(ids, attention, image_grid_thw=prompt.get("image_grid_thw"),
                              video_grid_thw=prompt.get("video_grid_thw"), image_token_id=proc.image_token_id,
                              video_token_id=proc.video_token_id,
                              spatial_merge_size=self.merge_size)
        return {"input_ids": ids, "attention_mask": attention, "position_ids": pos,
                "completion_mask": np.concatenate([np.zeros_like(prompt["attention_mask"]), cmask], axis=1),
                "advantages": roll["advantages"][order].astype(np.float32),
                "pixel_values": prompt.get("pixel_values"), "image_grid_thw": prompt.get("image_grid_thw")}

    def update(self, roll: dict) -> dict[str, float]:
        """mu_iterations passes over the rows, one optimizer update per batch_size_per_optimize
        rows, each in train.grad_accum_steps micro-batches (one program's rows, so the update's
        memory is a micro-batch's), weighted by vlm_grpo.micro_scales so that together they are
        the whole update's gradient."""
        order = np.arange(self.rows)
        chunks = []  # per optimizer update: [(batch, grid, scale)] of its micro-batches
        for start in range(0, self.rows, self.per_optimize):
            rows = order[start:start + self.per_optimize]
            hosts = [self.update_batch(roll, rows[m:m + self.micro_rows])
                     for m in range(0, len(rows), self.micro_rows)]
            real = [int((h["completion_mask"].sum(axis=1) > 0).sum()) for h in hosts]
            if not sum(real):
                continue  # only prefix-masked rows: nothing to train on
            micro = []
            for host, scale in zip(hosts, vlm_grpo.micro_scales(real), strict=True):
                batch = vlm_grpo.place(host, self.mesh)
                if self.ref_params is not None:
                    batch["ref_logp"] = self.logprobs(self.ref_params, self.frozen, batch, host["image_grid_thw"])
                if self.cfg.mu_iterations > 1 or len(order) > self.per_optimize:
                    batch["old_logp"] = self.logprobs(self.state.params, self.frozen, batch, host["image_grid_thw"])
                micro.append((batch, host["image_grid_thw"], scale))
            chunks.append(micro)
        outs = []
        for mu in range(self.cfg.mu_iterations):
            for c, micro in enumerate(chunks):
                use_old = not (mu == 0 and c == 0)  # the first update: ratio exactly 1
                for batch, grid, scale in micro:
                    self.state, out = self.step_fn(self.state, self.frozen, batch, use_old, grid, scale=scale)
                    outs.append(out)
        if not outs:
            return {"train/loss": 0.0, "train/policy_loss": 0.0, "train/kl_loss": 0.0, "train/clip_fraction": 0.0,
                    "optimizer/grad_norm": 0.0}
        outs = jax.device_get(outs)
        mean = lambda k: float(np.mean([o[k] for o in outs]))
        return {"train/loss": mean("loss"), "train/policy_loss": mean("policy_loss"),
                "train/kl_loss": mean("kl_loss"), "train/clip_fraction": mean("clip_fraction"),
                "optimizer/grad_norm": float(outs[-1]["grad_norm"])}

    def validate(self) -> dict[str, float]:
        if self.val is None:
            return {}
        v = self.config.policy.vlm
        return val_metrics(self.model(), self.processor, *self.val, max_new_tokens=int(v.max_new_tokens),
                           batch_size=int(self.config.validation.batch_size), system_prompt=self.system_prompt,
                           mesh=self.mesh)

    def export(self, step: int) -> str:
        # the SFT trainer's export (LoRA merged; transformers' layout) reads only config, lora and model()
        return sft_trainer.VLMSFTTrainer.export(self, step)  # type: ignore[arg-type]

    def run(self) -> int:
        t = self.config.train
        logger = MetricsLogger(t.output_dir, total_steps=t.max_steps, wandb_cfg=dict(t.wandb),
                               start_step=self.start_step)
        step, saved = self.start_step, self.start_step or None
        try:
            if self.start_step == 0 and self.val is not None:
                logger.log(0, self.validate())
            for step in range(self.start_step + 1, t.max_steps + 1):
                start = time.perf_counter()
                roll = self.rollout(step)
                metrics = {"train/reward_mean": float(roll["sampled_rewards"].mean()),
                           **{f"train/reward/{k}": float(v.mean()) for k, v in roll["per_reward"].items()},
                           "train/kept_groups": float(self.groups),
                           "train/mixed_groups": float(roll["mixed_groups"]),
                           "train/sampled_groups": float(roll["sampled_groups"]),
                           "train/completion_length": float(roll["completion_mask"].sum(1).mean()),
                           "train/learning_rate": float(self.lr(int(self.state.step)))}
                metrics.update(self.update(roll))
                metrics["train/iteration_time"] = time.perf_counter() - start
                check_finite(step, metrics, keys=("train/loss", "train/reward_mean", "optimizer/grad_norm"))
                if step == t.max_steps:
                    metrics.update(self.validate())
                if step % t.log_freq == 0 or step == t.max_steps:
                    logger.log(step, metrics)
                if self.ckpt.save(step, self.state, data_state={"steps": step}):
                    saved = step
                if self.on_step is not None:
                    self.on_step(step, metrics)
                if step < t.max_steps and preempt.requested():
                    if saved != step:
                        self.ckpt.save(step, self.state, data_state={"steps": step}, force=True)
                    raise preempt.Stopped(step)
            if step > self.start_step:
                if saved != step:
                    self.ckpt.save(step, self.state, data_state={"steps": step}, force=True)
                if t.ckpt.export_safetensors and jax.process_index() == 0:
                    self.export(step)
        finally:
            logger.close()
            self.ckpt.close()
            self.rewards.close()
        return step


def run(config, *, on_step: Callable[[int, dict], None] | None = None) -> int:
    """Train with `config` (policy.family a VLM family, train.train_policy.type "grpo")."""
    return VLMGRPOTrainer(config, on_step=on_step).run()
