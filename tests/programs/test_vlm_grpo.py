"""The VLM GRPO update (programs/vlm_grpo.py) on a tiny Qwen3-VL, fp32: its loss against the numpy
reference of cosmos-rl's formulas (tests/algorithms/test_lm_grpo.py) fed the log-probs of
transformers' model on identical weights, and its parameter gradient against torch autograd of
sum(dL/dlogp * logp) with dL/dlogp from that numpy reference. The batch is built by hand: VQA
conversations, the answer turn as the completion (prompt, visual and padding tokens outside the
mask), three groups of two, the last one (all rewards equal) dropped as variant "dapo" drops it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from converters.qwen3_vl import build_table
from converters.table import convert_to_diffusers
from tests.algorithms.test_lm_grpo import np_advantages, np_reference
from tests.models.qwen3_vl._oracle import flax_model, torch_model
from wfm_jax.algorithms import lm_grpo
from wfm_jax.core.mesh import make_mesh
from wfm_jax.data.conversations import ConversationDataset, collate
from wfm_jax.families.qwen3_vl.preprocess import Qwen3VLProcessor
from wfm_jax.families.qwen3_vl.tiny import write_processor_files
from wfm_jax.programs import vlm_grpo, vlm_sft
from wfm_jax.programs.optim import make_optimizer
from wfm_jax.programs.state import TrainState
from wfm_jax.worlds.vqa.dataset import build_vqa_dataset, load_records
from wfm_jax.worlds.vqa.scenes import vocabulary

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.slow,  # three compiles of a forward + backward: minutes on 2 busy cores
    pytest.mark.compile_bound,  # its time is compiling: CPU programs at LLVM -O0 (tests/_support/xla.py)
]
REWARDS = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], np.float32)  # group 2: filtered


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    proc_dir = tmp_path_factory.mktemp("proc")
    write_processor_files(str(proc_dir), vocabulary())
    processor = Qwen3VLProcessor.from_pretrained(str(proc_dir))
    data = build_vqa_dataset(str(tmp_path_factory.mktemp("vqa") / "d"), count=6, split="train", seed=5)
    ds = ConversationDataset(data, processor, records=load_records(data))
    tok = processor.tokenizer
    out = collate([ds[i] for i in range(6)], tok.pad_token_id, processor.image_token_id,
                  processor.video_token_id)
    assert out["attention_mask"].min() == 0  # right padding is in the batch
    keep = np.repeat(REWARDS.max(1) != REWARDS.min(1), 2)
    out["completion_mask"] = (out["loss_mask"] & keep[:, None]).astype(np.int64)
    assert not (out["completion_mask"] & (out["mm_token_type_ids"] > 0)).any()
    out["advantages"] = np_advantages(REWARDS).reshape(-1)
    return out


@pytest.fixture(scope="module")
def models():
    tm = torch_model(seed=2)
    return tm, flax_model(tm)


def _torch_logp(tm, b, temperature):
    def t(a):
        return torch.tensor(np.asarray(a))
    logits = tm(input_ids=t(b["input_ids"]), attention_mask=t(b["attention_mask"]),
                pixel_values=t(b["pixel_values"]), image_grid_thw=t(b["image_grid_thw"]),
                mm_token_type_ids=t(b["mm_token_type_ids"])).logits[:, :-1]
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    return torch.gather(logp, -1, t(b["input_ids"][:, 1:, None]))[..., 0]


def _ragged(values, mask):
    """[B, L-1] at the mask -> prefix layout [B, T] and lengths (the numpy reference's layout)."""
    lengths = mask.sum(1).astype(int)
    out = np.zeros((len(values), max(lengths.max(), 1)))
    for i, row in enumerate(values):
        out[i, :lengths[i]] = row[mask[i] > 0]
    return out, lengths


# the loss types' own averaging is checked against numpy in tests/algorithms/test_lm_grpo.py;
# here the program's wiring: with KL and the old policy, and at ratio 1 without them
@pytest.mark.parametrize(("loss_type", "kl_beta", "use_old"), [("token-mean", 0.05, True),
                                                                ("token-mean", 0.0, False)])
def test_loss_and_gradient_match_numpy_reference(models, batch, loss_type, kl_beta, use_old):
    tm, fm = models
    # the batch drops its equal-reward group as variant "dapo" does (its rows carry no mask)
    cfg = lm_grpo.LMGRPOConfig(n_generation=2, temperature=0.9, loss_type=loss_type, kl_beta=kl_beta,
                               mini_batch=2, epsilon_low=0.2, epsilon_high=0.28, variant="dapo")
    tm.zero_grad()
    logp_t = _torch_logp(tm, batch, cfg.temperature)
    x = logp_t.detach().numpy()
    mask = batch["completion_mask"][:, 1:].astype(np.float64)  # positions whose next token is completion
    rng = np.random.default_rng(0)
    old = x + rng.normal(0, 0.3, x.shape) if use_old else x  # ratios ~0.5-2: some clipped
    ref = x + rng.normal(0, 0.3, x.shape)

    ragged = [_ragged(a, mask) for a in (x, old, ref)]
    lengths = ragged[0][1]
    want_loss, dx_ragged = np_reference(ragged[0][0], ragged[1][0], ragged[2][0], REWARDS, lengths, cfg)
    dx = np.zeros_like(x)
    for i in range(len(x)):
        dx[i, mask[i] > 0] = dx_ragged[i, :lengths[i]]
    assert np.abs(dx[4:]).max() == 0 and np.abs(dx[:4]).max() > 0  # filtered group: no gradient
    (torch.from_numpy(dx) * logp_t).sum().backward()
    want_grads = {k: p.grad.numpy().astype(np.float64) for k, p in tm.named_parameters() if p.grad is not None}

    jb = {k: jnp.asarray(batch[k]) for k in vlm_grpo.BATCH_KEYS if k in batch}
    jb["old_logp"], jb["ref_logp"] = jnp.asarray(old, jnp.float32), jnp.asarray(ref, jnp.float32)
    grid = vlm_sft.grid_key(batch["image_grid_thw"])
    graphdef, params, rest = nnx.split(fm, nnx.Param, ...)

    def loss_fn(p):
        return vlm_grpo.grpo_loss(nnx.merge(graphdef, p, rest), jb, cfg, grid, use_old=use_old)

    # jitted: run eagerly, each primitive of the forward and backward compiles on its own
    (loss, aux), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
    assert int(aux["tokens"]) == int(mask.sum())
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5, atol=2e-6)
    flat = {".".join(str(k) for k in path): np.asarray(v.get_value()) for path, v in grads.flat_state()}
    got = convert_to_diffusers(build_table(fm.config), flat)
    assert set(got) == set(want_grads)
    scale = max(np.abs(g).max() for g in want_grads.values())
    for key, want in want_grads.items():
        np.testing.assert_allclose(got[key], want, atol=2e-5 * max(scale, 1.0), rtol=0, err_msg=key)
    assert np.abs(want_grads["model.visual.patch_embed.proj.weight"]).max() > 0  # through the image


def test_compiled_step_and_logprobs_on_mesh(models, batch):
    _, fm = models
    mesh = make_mesh(data=2, devices=jax.devices()[:2]) if len(jax.devices()) >= 2 else make_mesh()
    model = flax_model(torch_model(seed=2))
    graphdef, params, frozen = nnx.split(model, vlm_sft.trainable_filter(False, True), ...)
    params, frozen = vlm_sft.place_params(params, mesh), vlm_sft.place_params(frozen, mesh)
    cfg = lm_grpo.LMGRPOConfig(n_generation=2, mini_batch=2)
    grid = batch["image_grid_thw"]
    placed = vlm_grpo.place(batch, mesh)
    logp = vlm_grpo.VLMLogprobs(graphdef, mesh)(params, frozen, placed, grid)
    direct = jax.jit(lambda p, f, b: vlm_grpo.sequence_logprobs(
        nnx.merge(graphdef, p, f), b, vlm_sft.grid_key(grid)))(params, frozen, placed)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(direct), rtol=1e-5, atol=1e-5)
    # jitted: eager, each primitive of the forward compiled on its own (~250 programs)
    before, _ = jax.jit(lambda p, f, b: vlm_grpo.grpo_loss(nnx.merge(graphdef, p, f), b, cfg, vlm_sft.grid_key(grid)))(
        params, frozen, placed)
    tx = make_optimizer(1e-3, grad_norm_clip=1.0)
    state = TrainState.create(params, tx, jax.random.key(0))
    step = vlm_grpo.VLMGRPOStep(graphdef, tx, mesh, cfg)
    state, out = step(state, frozen, placed, False, grid)
    np.testing.assert_allclose(float(out["loss"]), float(before), rtol=1e-5, atol=1e-7)
    assert float(out["grad_norm"]) > 0 and int(state.step) == 1
    # with the pre-update log-probs as the old ones, the second update's ratios move off 1
    state, out = step(state, frozen, {**placed, "old_logp": logp}, True, grid)
    assert int(state.step) == 2 and np.isfinite(float(out["loss"]))
    assert len(step._programs) == 1  # use_old is traced: one program for both


def test_micro_batches_sum_to_the_whole_update(batch):
    """train.grad_accum_steps: the update's rows in k micro-batches (whole mini-batches), each
    loss weighted by micro_scales, accumulated by optax.MultiSteps, move the weights as the one
    update over all rows does; the filtered group's micro-batch (no completion token) weighs 0."""
    mesh = make_mesh(data=2, devices=jax.devices()[:2]) if len(jax.devices()) >= 2 else make_mesh()
    graphdef, params, frozen = nnx.split(flax_model(torch_model(seed=2)), vlm_sft.trainable_filter(False, True), ...)
    params, frozen = vlm_sft.place_params(params, mesh), vlm_sft.place_params(frozen, mesh)
    cfg = lm_grpo.LMGRPOConfig(n_generation=2, mini_batch=2)
    host = {k: v for k, v in batch.items() if k in vlm_grpo.BATCH_KEYS or k == "image_grid_thw"}
    grid = host["image_grid_thw"]

    def update(k):
        # plain SGD: the weights move by the (averaged) gradient itself, so equal moves are
        # equal gradients (Adam's first step is about lr * sign(g), blind to its size)
        tx = optax.sgd(1.0) if k == 1 else optax.MultiSteps(optax.sgd(1.0), k).gradient_transformation()
        state = TrainState.create(jax.tree.map(jnp.copy, params), tx, jax.random.key(0))
        step = vlm_grpo.VLMGRPOStep(graphdef, tx, mesh, cfg)
        rows = len(host["advantages"]) // k
        def part(key, v, c):  # rows c*rows.. of each array: positions (4, B, L) on axis 1, patches by image
            if key == "position_ids":
                return v[:, c * rows:(c + 1) * rows]
            if key == "pixel_values":
                return v[c * len(v) // k:(c + 1) * len(v) // k]
            return v[c * rows:(c + 1) * rows]
        parts = [{key: part(key, v, c) for key, v in host.items()} for c in range(k)]
        scales = vlm_grpo.micro_scales([int((p["completion_mask"].sum(1) > 0).sum()) for p in parts])
        losses = []
        for part, scale in zip(parts, scales, strict=True):
            state, out = step(state, frozen, vlm_grpo.place(part, mesh), False, part["image_grid_thw"], scale=scale)
            losses.append(float(out["loss"]))
        return state, float(np.mean(losses)), scales

    whole, loss, _ = update(1)
    micro, micro_loss, scales = update(3)
    assert scales == [1.5, 1.5, 0.0] and int(whole.step) == int(micro.step) == 1
    np.testing.assert_allclose(micro_loss, loss, rtol=1e-5, atol=1e-7)
    moves = [(np.asarray(a) - np.asarray(p), np.asarray(b) - np.asarray(p)) for a, b, p in zip(
        jax.tree.leaves(whole.params), jax.tree.leaves(micro.params), jax.tree.leaves(params), strict=True)]
    largest = max(float(np.abs(a).max()) for a, _ in moves)
    assert largest > 1e-4 and grid.shape[0] == 6  # the update moved the weights
    for a, b in moves:
        np.testing.assert_allclose(b, a, atol=1e-5 * largest, rtol=0)
