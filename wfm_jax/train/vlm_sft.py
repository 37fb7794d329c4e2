"""Supervised fine-tuning of a vision-language model (Qwen3-VL / Cosmos-Reason2), as cosmos-rl's
SFT trainer does it (specs/reason2.md §4.1): LLaVA conversations (data/conversations.py),
length-bucketed batches, loss on assistant tokens and their `<|im_end|>`, full fine-tune or LoRA,
the vision tower trained or frozen (policy.vlm.train_vision).

One loop step = train.grad_accum_steps micro-batches of train.train_batch_per_replica
conversations, each through the compiled step (programs/vlm_sft.py). The batch order is a
function of (train.seed, epoch) only, so a resumed run reads the same batches as an
uninterrupted one; the checkpoint (train/checkpoint.py) holds the whole train state (params,
optimizer, rng, step) and the number of batches read. Short last batches of an epoch are
skipped (one shape per bucket). The run lasts train.max_steps steps, or train.epoch passes of
floor(conversations / (batch x grad_accum_steps)) steps, or the smaller (config/run_length.py).

metrics.jsonl: train/loss, train/learning_rate, optimizer/grad_norm, train/loss_tokens,
train/iteration_time per step; val/accuracy (and per question type) on the held-out set
(validation.dataset.local_dir) before the first step (step 0) and with the last step. The end:
a checkpoint and an export in transformers' layout at output_dir/safetensors/step_N (LoRA merged
into the weights) that `Qwen3VLForConditionalGeneration.from_pretrained` loads.
"""
from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from wfm_jax.config.run_length import resolve_max_steps
from wfm_jax.core.abstract import abstract_module
from wfm_jax.core.console import say
from wfm_jax.core.errors import UserError
from wfm_jax.core.mesh import MeshConfig, check_batch, make_mesh
from wfm_jax.data.conversations import ConversationDataset, bucket_batches, collate, read_records
from wfm_jax.families.qwen3_vl.answer import load_processor, vlm_config
from wfm_jax.models.lora import attach_lora
from wfm_jax.programs import vlm_sft
from wfm_jax.programs.setup import make_tx
from wfm_jax.programs.state import TrainState
from wfm_jax.train import preempt
from wfm_jax.train.checkpoint import Checkpointer, abstract_of
from wfm_jax.train.export import step_dir
from wfm_jax.train.metrics import MetricsLogger, check_finite
from wfm_jax.train.setup import checkpoints_path
from wfm_jax.train.vlm_eval import read_images, val_metrics

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class VLMSetupError(UserError, ValueError):
    """A VLM run that cannot start: the model dir, the data, the batch."""


def build_tiny_assets(config) -> None:
    """policy.vlm.build_tiny_vqa: the tiny VQA world's base model at policy.model_name_or_path
    (pretrain_tiny_base) and its train / held-out sets at the dataset dirs, each built once and
    reused (a dir that holds a set built with other settings is one clear error)."""
    v = config.policy.vlm
    if not v.build_tiny_vqa:
        return
    from wfm_jax.worlds.vqa.dataset import ensure_vqa_dataset

    types, style = tuple(v.vqa_types), dict(target=str(v.vqa_target), options=str(v.vqa_options),
                                            fixed_think_fraction=float(v.vqa_fixed_think_fraction))
    pretrain_tiny_base(config.policy.model_name_or_path, seed=int(v.vqa_seed), steps=int(v.vqa_pretrain_steps),
                       pictures=int(v.vqa_train_count))
    try:
        ensure_vqa_dataset(config.train.train_policy.dataset.local_dir, count=int(v.vqa_train_count),
                           split="train", seed=int(v.vqa_seed), types=types, **style)
        if config.validation.dataset.local_dir:
            ensure_vqa_dataset(config.validation.dataset.local_dir, count=int(v.vqa_val_count),
                               split="heldout", seed=int(v.vqa_seed), types=types, **style)
    except ValueError as e:  # a set built with other settings
        raise VLMSetupError(str(e)) from None


# The tiny base's pre-training run: the SFT recipe's optimiser (configs/tiny_vlm_sft.py), the
# vision tower frozen (trained, it collapses to the background colour before the decoder reads
# the cells), every description padded to 96 tokens (one program).
PRETRAIN = {"train.train_batch_per_replica": 16, "train.optm_lr": 3e-3, "train.lr_schedule": "cosine",
            "train.optm_warmup_steps": 20, "train.optm_weight_decay": 0.01, "train.compute_dtype": "float32",
            "policy.vlm.train_vision": False, "policy.vlm.pad_to_multiple": 96}


def pretrain_tiny_base(base: str, *, seed: int, steps: int, pictures: int) -> str:
    """The tiny VQA world's base model at `base`, unless one is there: the random tiny Qwen3-VL
    (worlds/vqa/model.py) SFT-trained `steps` steps (0: none) to describe `pictures` training
    pictures (worlds/vqa/dataset.py build_description_dataset). The work happens in
    model.pretrain_dir(base) and the finished export is renamed into place; an interrupted build
    resumes from its last checkpoint."""
    from wfm_jax.config.base import set_value
    from wfm_jax.config.schema import default_config
    from wfm_jax.worlds.vqa.dataset import ANNOTATIONS, build_description_dataset
    from wfm_jax.worlds.vqa.model import ensure_random_model, pretrain_dir

    base = os.path.abspath(base)
    if os.path.isfile(os.path.join(base, "config.json")):
        return base
    work = pretrain_dir(base)
    random_dir = ensure_random_model(base, seed=seed)
    if steps <= 0:  # the random model is the base: copied whole, then renamed into place
        staging = os.path.join(work, "copy")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(random_dir, staging)
        os.replace(staging, base)
        shutil.rmtree(work, ignore_errors=True)
        return base
    data = os.path.join(work, "describe")
    if not os.path.isfile(os.path.join(data, ANNOTATIONS)):
        build_description_dataset(data, count=pictures, seed=seed, overwrite=True)
    c = default_config()
    c.policy.family, c.policy.model_name_or_path = "qwen3_vl", random_dir
    c.train.train_policy.dataset.layout, c.train.train_policy.dataset.local_dir = "conversations", data
    c.train.output_dir, c.train.max_steps, c.train.seed = os.path.join(work, "run"), steps, seed
    c.train.resume, c.train.ckpt.save_freq, c.train.ckpt.max_keep = True, 100, 1
    c.train.ckpt.export_safetensors = True
    for key, value in PRETRAIN.items():
        set_value(c, key, value)
    say(f"pre-training the tiny VQA base model: {steps} steps of describing {pictures} pictures "
        f"(once; cached at {base})")
    VLMSFTTrainer(c).run()
    os.replace(step_dir(c.train.output_dir, steps), base)
    shutil.rmtree(work, ignore_errors=True)
    return base


def check_model_dir(path: str) -> None:
    if not path or not os.path.isdir(path):
        raise VLMSetupError(f"policy.model_name_or_path: no model directory at {path or '(empty)'} "
                            f"(wfm_jax downloads nothing: fetch the Qwen3-VL / Cosmos-Reason2 "
                            f"checkpoint and give its local directory)")
    if vlm_config(path) is None:
        raise VLMSetupError(f"policy.model_name_or_path: {path} is not a Qwen3-VL model dir "
                            f"(config.json with model_type qwen3_vl)")


def open_dataset(location: str, processor, **options) -> ConversationDataset:
    """A LLaVA JSON dir / file, or WebDataset shards (s3:// or a dir of .tar files)."""
    if not location:
        raise VLMSetupError("train.train_policy.dataset.local_dir is empty: give the conversations")
    tars = os.path.isdir(location) and any(n.endswith(".tar") for n in os.listdir(location))
    try:
        if location.startswith("s3://") or tars:
            return ConversationDataset.from_webdataset(location, processor, **options)
        return ConversationDataset(location, processor, **options)
    except (FileNotFoundError, ValueError) as e:
        raise VLMSetupError(f"train.train_policy.dataset.local_dir: {e}") from None


def lora_merged(model) -> dict[str, np.ndarray]:
    """Every base parameter (dotted path -> array) with LoRA folded in: kernel + scale A @ B."""
    from wfm_jax.models.layers.linear import Linear

    out = {".".join(map(str, p)): np.asarray(v.get_value())
           for p, v in nnx.state(model, nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))).flat_state()}
    for path, layer in nnx.iter_modules(model):
        if isinstance(layer, Linear) and layer.lora_a is not None:
            key = ".".join(map(str, path)) + ".kernel"
            delta = np.asarray(layer.lora_a[...]) @ np.asarray(layer.lora_b[...]) * layer.lora_scale
            out[key] = out[key] + delta.astype(out[key].dtype)
    return out


def load_base(config):
    """The Flax model of the run's Qwen3-VL model dir (its safetensors through
    converters.qwen3_vl), built as the planner builds it: the decoder's blocks rematerialised
    per policy.remat and run as one lax.scan when policy.scan_layers (same weights layout)."""
    from converters.loading import load_model

    t, p = config.train, config.policy
    return load_model(p.model_name_or_path, dtype=DTYPES[t.compute_dtype],
                      param_dtype=DTYPES[t.param_dtype], remat=str(p.remat),
                      scan_layers=bool(p.scan_layers))[0]


class TrainedModel:
    """What both VLM trainers train: the model's split (LoRA attached when policy.lora.enable;
    the vision tower trained per policy.vlm.train_vision), the frozen part on the mesh, the
    optimizer and its learning-rate schedule, and the train state with every leaf on the mesh
    (step, rng and optimizer counters replicated, so a restore into abstract_of(state) lands
    there too, not on one device)."""

    def __init__(self, config, model, mesh):
        t, p = config.train, config.policy
        self.lora = bool(p.lora.enable)
        if self.lora:
            attach_lora(model, list(p.lora.target_modules), int(p.lora.r), float(p.lora.lora_alpha),
                        seed=int(t.seed), init=str(p.lora.init_lora_weights))
        trainable = vlm_sft.trainable_filter(self.lora, bool(p.vlm.train_vision))
        self.graphdef, params, frozen = nnx.split(model, trainable, ...)
        self.frozen = vlm_sft.place_params(frozen, mesh)
        params = vlm_sft.place_params(params, mesh)
        self.tx, self.lr = make_tx(config)
        state = TrainState.create(params, self.tx, jax.random.key(int(t.seed)))
        rep = NamedSharding(mesh, P())
        self.state = jax.tree.map(lambda x: x if isinstance(x.sharding, NamedSharding) else jax.device_put(x, rep),
                                  state)


def checkpointer_and_start(config, state) -> tuple[Checkpointer, object, int]:
    """(checkpointer, state, start step): the latest checkpoint's state and step when
    train.resume finds one, else the given state at step 0; the resolved config is written to
    the output dir (process 0)."""
    t = config.train
    ckpt = Checkpointer(checkpoints_path(config), max_keep=t.ckpt.max_keep,
                        save_freq=t.ckpt.save_freq, async_=t.ckpt.save_mode == "async")
    start = 0
    if t.resume:
        restored = ckpt.restore_latest(abstract_of(state))
        if restored is not None:
            state, start = restored.state, restored.step
            say(f"resumed from checkpoint step {restored.step}")
    if jax.process_index() == 0:
        from wfm_jax.config.recipe import save_resolved
        save_resolved(config, os.path.join(t.output_dir, "config.json"))
    return ckpt, state, start


class VLMSFTTrainer:
    def __init__(self, config, *, on_step: Callable[[int, dict], None] | None = None):
        self.config, self.on_step = config, on_step
        t, p, v = config.train, config.policy, config.policy.vlm
        build_tiny_assets(config)
        check_model_dir(p.model_name_or_path)
        self.processor = load_processor(p.model_name_or_path)
        options = dict(system_prompt=v.system_prompt or None, max_length=int(v.model_max_length),
                       media_root=v.media_root or None)
        self.data = open_dataset(t.train_policy.dataset.local_dir, self.processor, **options)
        self.batch_size = int(t.train_batch_per_replica)
        if self.batch_size > len(self.data):
            raise VLMSetupError(f"train.train_batch_per_replica={self.batch_size} is more than the "
                                f"{len(self.data)} conversations of the dataset")
        # before the optimizer: the LR schedule and config.json take the resolved length
        resolve_max_steps(config, len(self.data), "conversations")
        self.val = None
        if config.validation.enable or config.validation.dataset.local_dir:
            val_dir = config.validation.dataset.local_dir
            try:
                records = read_records(val_dir)
            except (FileNotFoundError, ValueError) as e:
                raise VLMSetupError(f"validation.dataset.local_dir: {e}") from None
            root = val_dir if os.path.isdir(val_dir) else os.path.dirname(os.path.abspath(val_dir))
            self.val = (records, read_images(records, root))
        self.mesh = make_mesh(MeshConfig.from_any(p.parallelism))
        try:
            check_batch(self.mesh, self.batch_size)
        except ValueError as e:
            raise VLMSetupError(f"train.train_batch_per_replica: {e}") from None
        model = load_base(config)
        trained = TrainedModel(config, model, self.mesh)
        self.lora, self.graphdef, self.frozen = trained.lora, trained.graphdef, trained.frozen
        self.tx, self.lr = trained.tx, trained.lr
        self.step_fn = vlm_sft.VLMSFTStep(self.graphdef, self.tx, self.mesh)
        self.ckpt, self.state, self.start_step = checkpointer_and_start(config, trained.state)
        self._epochs: dict[int, list[list[int]]] = {}

    # -- data: batch k of the run, from (seed, epoch) alone --
    def batch_indices(self, k: int) -> list[int]:
        lengths = None
        epoch = 0
        while True:
            if epoch not in self._epochs:
                lengths = lengths or self.data.lengths()
                full = [b for b in bucket_batches(lengths, self.batch_size, int(self.config.train.seed), epoch,
                                                  pad_to_multiple=int(self.config.policy.vlm.pad_to_multiple))
                        if len(b) == self.batch_size]
                self._epochs[epoch] = full
            if k < len(self._epochs[epoch]):
                return self._epochs[epoch][k]
            k -= len(self._epochs[epoch])
            epoch += 1

    def host_batch(self, k: int) -> dict[str, np.ndarray]:
        tok = self.processor.tokenizer
        return collate([self.data[i] for i in self.batch_indices(k)], tok.pad_token_id,
                       self.processor.image_token_id, self.processor.video_token_id,
                       int(self.config.policy.vlm.pad_to_multiple))

    def model(self):
        return nnx.merge(self.graphdef, self.state.params, self.frozen)

    def validate(self) -> dict[str, float]:
        if self.val is None:
            return {}
        v = self.config.policy.vlm
        return val_metrics(self.model(), self.processor, *self.val, max_new_tokens=int(v.max_new_tokens),
                           batch_size=int(self.config.validation.batch_size),
                           system_prompt=v.system_prompt or None, mesh=self.mesh)

    def export(self, step: int) -> str:
        from converters.qwen3_vl import export
        from wfm_jax.models.qwen3_vl.model import make_model

        model = self.model()
        if self.lora:
            merged = lora_merged(model)
            base = abstract_module(lambda: make_model(model.config.to_dict(), rngs=nnx.Rngs(0)))
            for path, var in nnx.state(base, nnx.Param).flat_state():
                var.set_value(jnp.asarray(merged[".".join(map(str, path))]))
            model = base
        dst = step_dir(self.config.train.output_dir, step)
        export(model, dst, processor_dir=self.config.policy.model_name_or_path)
        say(f"exported step {step} to {dst} (transformers Qwen3VLForConditionalGeneration layout)")
        return dst

    def run(self) -> int:
        t = self.config.train
        accum = int(t.grad_accum_steps)
        logger = MetricsLogger(t.output_dir, total_steps=t.max_steps, wandb_cfg=dict(t.wandb),
                               start_step=self.start_step)
        step, saved = self.start_step, self.start_step or None
        try:
            if self.start_step == 0 and self.val is not None:
                logger.log(0, self.validate())
            for step in range(self.start_step + 1, t.max_steps + 1):
                start = time.perf_counter()
                outs = []
                for micro in range(accum):
                    host = self.host_batch((step - 1) * accum + micro)
                    batch = vlm_sft.place_batch(host, self.mesh)
                    self.state, out = self.step_fn(self.state, self.frozen, batch, host.get("image_grid_thw"),
                                                   host.get("video_grid_thw"))
                    outs.append(out)
                outs = jax.device_get(outs)
                loss = float(np.mean([o["loss"] for o in outs]))
                metrics = {"train/loss": loss, "train/learning_rate": float(self.lr(step - 1)),
                           "optimizer/grad_norm": float(outs[-1]["grad_norm"]),
                           "train/loss_tokens": float(sum(o["tokens"] for o in outs)),
                           "train/iteration_time": time.perf_counter() - start}
                check_finite(step, metrics, keys=("train/loss", "optimizer/grad_norm"))
                if step == t.max_steps:
                    metrics.update(self.validate())
                if step % t.log_freq == 0 or step == t.max_steps:
                    logger.log(step, metrics)
                if self.ckpt.save(step, self.state, extra={"loss": loss}, data_state={"batches": step * accum}):
                    saved = step
                if self.on_step is not None:
                    self.on_step(step, metrics)
                if step < t.max_steps and preempt.requested():
                    if saved != step:
                        self.ckpt.save(step, self.state, data_state={"batches": step * accum}, force=True)
                    raise preempt.Stopped(step)
            if step > self.start_step:
                if saved != step:
                    self.ckpt.save(step, self.state, data_state={"batches": step * accum}, force=True)
                if t.ckpt.export_safetensors and jax.process_index() == 0:
                    self.export(step)
        finally:
            logger.close()
            self.ckpt.close()
        return step


def run(config, *, on_step: Callable[[int, dict], None] | None = None) -> int:
    """Train with `config` (policy.family a VLM family, train.train_policy.type "sft")."""
    return VLMSFTTrainer(config, on_step=on_step).run()
