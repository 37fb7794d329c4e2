"""The Qwen3-VL SFT loss and its gradient against transformers' Qwen3VLForConditionalGeneration
(labels -100 where the loss mask is 0) on identical tiny random weights, fp32; the compiled step
on a 2-device mesh; the frozen-vision and LoRA filters."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from converters.qwen3_vl import build_table
from converters.table import convert_to_diffusers
from tests.models.qwen3_vl._oracle import IMAGE, flax_model, torch_model
from wfm_jax.core.mesh import make_mesh
from wfm_jax.data.conversations import ConversationDataset, collate
from wfm_jax.families.qwen3_vl.preprocess import Qwen3VLProcessor
from wfm_jax.families.qwen3_vl.tiny import write_processor_files
from wfm_jax.models.lora import attach_lora
from wfm_jax.programs import vlm_sft
from wfm_jax.programs.optim import make_optimizer
from wfm_jax.programs.state import TrainState
from wfm_jax.worlds.vqa.dataset import build_vqa_dataset, load_records
from wfm_jax.worlds.vqa.scenes import vocabulary

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    proc_dir = tmp_path_factory.mktemp("proc")
    write_processor_files(str(proc_dir), vocabulary())
    processor = Qwen3VLProcessor.from_pretrained(str(proc_dir))
    data = build_vqa_dataset(str(tmp_path_factory.mktemp("vqa") / "d"), count=4, split="train", seed=3)
    ds = ConversationDataset(data, processor, records=load_records(data))
    tok = processor.tokenizer
    out = collate([ds[i] for i in range(4)], tok.pad_token_id, processor.image_token_id,
                  processor.video_token_id)
    assert out["attention_mask"].min() == 0  # questions of different lengths: padding is covered
    return out


@pytest.fixture(scope="module")
def models():
    tm = torch_model(seed=1)
    return tm, flax_model(tm)


def _torch_loss_and_grads(tm, b):
    def t(a):
        return torch.tensor(np.asarray(a))
    labels = np.where(b["loss_mask"], b["input_ids"], -100)
    tm.zero_grad()
    out = tm(input_ids=t(b["input_ids"]), attention_mask=t(b["attention_mask"]),
             pixel_values=t(b["pixel_values"]), image_grid_thw=t(b["image_grid_thw"]),
             mm_token_type_ids=t(b["mm_token_type_ids"]), labels=t(labels))
    out.loss.backward()
    grads = {k: p.grad.numpy().copy() for k, p in tm.named_parameters() if p.grad is not None}
    return float(out.loss.detach()), grads


def _numpy_loss(logits, ids, mask):
    """Independent: shifted log-softmax picked at the labels, averaged over label tokens."""
    logits = np.asarray(logits, np.float64)[:, :-1]
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0]
    m = mask[:, 1:]
    return -(picked * m).sum() / m.sum()


def test_loss_and_gradient_match_transformers(models, batch):
    tm, fm = models
    ref_loss, ref_grads = _torch_loss_and_grads(tm, batch)
    jb = {k: jnp.asarray(batch[k]) for k in vlm_sft.BATCH_KEYS if k in batch}
    grid = vlm_sft.grid_key(batch["image_grid_thw"])
    graphdef, params, rest = nnx.split(fm, nnx.Param, ...)

    def loss_fn(p):
        return vlm_sft.sft_loss(nnx.merge(graphdef, p, rest), jb, grid)

    def logits_fn(p):
        return nnx.merge(graphdef, p, rest)(jb["input_ids"], jb["attention_mask"], jb["position_ids"],
                                            jb["pixel_values"], np.asarray(grid))["logits"]

    # jitted: run eagerly, each primitive of the forward and backward compiles on its own
    (loss, count), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
    assert int(count) == int(batch["loss_mask"][:, 1:].sum())
    np.testing.assert_allclose(float(loss), ref_loss, rtol=1e-5, atol=2e-5)
    logits = jax.jit(logits_fn)(params)
    np.testing.assert_allclose(float(loss), _numpy_loss(logits, batch["input_ids"], batch["loss_mask"]),
                               rtol=1e-5, atol=1e-6)
    flat = {".".join(str(k) for k in path): np.asarray(v.get_value()) for path, v in grads.flat_state()}
    hf = convert_to_diffusers(build_table(fm.config), flat)  # linear maps: grads convert as weights do
    assert set(hf) == set(ref_grads)
    scale = max(np.abs(g).max() for g in ref_grads.values())
    for key, ref in ref_grads.items():
        np.testing.assert_allclose(hf[key], ref, atol=2e-5 * max(scale, 1.0), rtol=0, err_msg=key)
    assert np.abs(ref_grads["model.visual.patch_embed.proj.weight"]).max() > 0  # vision gets gradient


def test_filters_freeze_vision_and_select_lora(models):
    _, fm = models
    frozen_vision = nnx.state(fm, vlm_sft.trainable_filter(lora=False, train_vision=False))
    paths = [".".join(map(str, p)) for p, _ in frozen_vision.flat_state()]
    assert paths and not any(".visual." in f".{p}." for p in paths)
    assert any("language_model" in p for p in paths)
    full = nnx.state(fm, vlm_sft.trainable_filter(lora=False, train_vision=True))
    assert any(p[1] == "visual" for p, _ in full.flat_state())
    lora_model = flax_model(torch_model(seed=1))
    attach_lora(lora_model, ["q_proj", "v_proj", "qkv"], r=2, lora_alpha=4)
    lora = nnx.state(lora_model, vlm_sft.trainable_filter(lora=True, train_vision=False))
    leaves = [".".join(map(str, p)) for p, _ in lora.flat_state()]
    assert leaves and all(p.endswith(("lora_a", "lora_b")) and "visual" not in p for p in leaves)
    assert len(leaves) == 2 * 2 * fm.config.text.num_hidden_layers


def test_compiled_step_on_mesh(models, batch):
    _, fm = models
    mesh = make_mesh(data=2, devices=jax.devices()[:2]) if len(jax.devices()) >= 2 else make_mesh()
    model = flax_model(torch_model(seed=1))
    graphdef, params, frozen = nnx.split(model, vlm_sft.trainable_filter(False, False), ...)
    params = vlm_sft.place_params(params, mesh)
    frozen = vlm_sft.place_params(frozen, mesh)
    tx = make_optimizer(1e-3, grad_norm_clip=1.0)
    state = TrainState.create(params, tx, jax.random.key(0))
    placed = vlm_sft.place_batch(batch, mesh)
    grid = batch["image_grid_thw"]
    # jitted: eager, each primitive of the forward compiled on its own (~200 programs)
    before = jax.jit(lambda p, f, b: vlm_sft.sft_loss(nnx.merge(graphdef, p, f), b, vlm_sft.grid_key(grid))[0])(
        params, frozen, placed)
    step = vlm_sft.VLMSFTStep(graphdef, tx, mesh)
    state, out = step(state, frozen, placed, grid)
    np.testing.assert_allclose(float(out["loss"]), float(before), rtol=1e-6)
    assert int(state.step) == 1
    for _ in range(3):
        state, out = step(state, frozen, placed, grid)
    assert float(out["loss"]) < float(before)
    assert len(step._programs) == 1
    assert (batch["input_ids"] == IMAGE).sum() == 4 * 9
