"""The SFT step of the vision-language model (Qwen3-VL / Cosmos-Reason2), as cosmos-rl's SFT
trainer computes it (specs/reason2.md §4.1): one jitted program of (state, frozen, batch) ->
(state, metrics), the state donated.

    loss = sum over loss tokens of CE(logits[:, t], ids[:, t + 1]) / number of loss tokens

The loss mask marks target tokens (cosmos-rl's unshifted labels: assistant content and its
`<|im_end|>`), so position t's logits are scored against token t + 1 where mask[t + 1] is set;
the average runs over the whole batch's loss tokens (one mini-batch, no balancing over ranks).

What is trained: every parameter, or the LoRA adapters only (models/lora.py); the vision tower
(`model.visual`) is frozen unless `train_vision`. The images' `grid_thw` shape the vision tower's
layout on the host, so each distinct grid set is its own program (`VLMSFTStep` keeps them).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from wfm_jax.core import mesh as wmesh
from wfm_jax.core.mesh import mesh_jit
from wfm_jax.models.layers.embeddings import Buffer
from wfm_jax.programs.state import TrainState, train_state_update

VISION_MODULE = "visual"  # path element of the vision tower: model.visual.*
BATCH_KEYS = ("input_ids", "attention_mask", "loss_mask", "position_ids", "pixel_values",
              "pixel_values_videos")


def trainable_filter(lora: bool, train_vision: bool):
    """LoRA params only, or every Param but persistent buffers; never the vision tower's unless
    `train_vision`."""
    base = nnx.LoRAParam if lora else nnx.All(nnx.Param, nnx.Not(Buffer))
    return base if train_vision else nnx.All(base, nnx.Not(nnx.PathContains(VISION_MODULE)))


def masked_token_ce(logits: jax.Array, input_ids: jax.Array, loss_mask: jax.Array
                    ) -> tuple[jax.Array, jax.Array]:
    """(sum of the cross-entropies at the loss tokens, how many there are), in float32.
    logits (B, L, V) unshifted; the mask (B, L) marks target tokens."""
    logits = logits[:, :-1].astype(jnp.float32)
    targets = input_ids[:, 1:].astype(jnp.int32)
    weight = loss_mask[:, 1:].astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jnp.sum((log_z - picked) * weight), jnp.sum(weight)


def grid_key(grid) -> tuple | None:
    """A grid_thw array as a hashable tuple of (t, h, w) rows (None stays None)."""
    return None if grid is None else tuple(tuple(int(v) for v in r) for r in np.asarray(grid).reshape(-1, 3))


def sft_loss(model, batch: Mapping[str, jax.Array], image_grid: tuple | None = None,
             video_grid: tuple | None = None) -> tuple[jax.Array, jax.Array]:
    """(mean CE over the batch's loss tokens, number of loss tokens) of `model` on one collated
    batch (data.conversations.collate); the grids are concrete (grid_key)."""
    out = model(batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                batch.get("pixel_values"), None if image_grid is None else np.asarray(image_grid),
                batch.get("pixel_values_videos"), None if video_grid is None else np.asarray(video_grid))
    total, count = masked_token_ce(out["logits"], batch["input_ids"], batch["loss_mask"])
    return total / jnp.maximum(count, 1.0), count


def batch_shardings(batch: Mapping[str, Any], mesh, rules=None) -> dict[str, NamedSharding]:
    """Rows over the data x fsdp axes: (B, L) arrays on their first axis, position ids
    (4, B, L) on their second, patch rows (N, D) on their first (whole images per shard when
    every image has the same grid)."""
    spec = wmesh.logical_to_spec(("act_batch",), rules)
    out = {}
    for key in batch:
        if key == "position_ids":
            out[key] = NamedSharding(mesh, P(None, *spec))
        else:
            out[key] = NamedSharding(mesh, spec)
    return out


def place_batch(batch: Mapping[str, Any], mesh, rules=None) -> dict[str, jax.Array]:
    """The model inputs of a collated host batch as global arrays split over the mesh."""
    arrays = {k: np.asarray(batch[k]) for k in BATCH_KEYS if batch.get(k) is not None}
    shardings = batch_shardings(arrays, mesh, rules)
    return {k: jax.device_put(v, shardings[k]) for k, v in arrays.items()}


def place_params(state: nnx.State, mesh, rules=None) -> nnx.State:
    """Parameters onto the mesh by their logical axis names (models name them; rules map them)."""
    rules = tuple(rules if rules is not None else wmesh.active_rules())
    with nnx.logical_axis_rules(rules):
        specs = nnx.get_partition_spec(state)
    return jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s if isinstance(s, P) else P())),
                        state, specs, is_leaf=lambda x: isinstance(x, P))


class VLMSFTStep:
    """step(state, frozen, batch, image_grid=None, video_grid=None) -> (state, {"loss",
    "grad_norm", "tokens"}): one optimizer update (or accumulation micro-step) on the batch.
    One compiled program per grid set and batch shape."""

    def __init__(self, graphdef, tx: optax.GradientTransformation, mesh, rules=None):
        self.graphdef, self.tx, self.mesh, self.rules = graphdef, tx, mesh, rules
        self._programs: dict = {}

    def _build(self, image_grid, video_grid):
        graphdef, tx = self.graphdef, self.tx

        def step(state: TrainState, frozen, batch):
            def loss_fn(params):
                model = nnx.merge(graphdef, params, frozen)
                return sft_loss(model, batch, image_grid, video_grid)

            (loss, count), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
            state, info = train_state_update(state, grads, tx)
            return state, {"loss": loss, "grad_norm": info["grad_norm"], "tokens": count}

        return mesh_jit(step, mesh=self.mesh, rules=self.rules, donate_argnums=0)

    def program(self, image_grid=None, video_grid=None):
        key = (grid_key(image_grid), grid_key(video_grid))
        if key not in self._programs:
            self._programs[key] = self._build(*key)
        return self._programs[key]

    def __call__(self, state, frozen, batch, image_grid=None, video_grid=None):
        return self.program(image_grid, video_grid)(state, frozen, batch)
