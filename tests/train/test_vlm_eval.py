"""Held-out answers on the trainers' mesh (train/vlm_eval.py): a batch that does not divide the
mesh's batch shards is padded with copies of its last record (generate sees whole shards) and
their answers dropped: the answers equal the single-device ones, one per record."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from converters.loading import load_model
from wfm_jax.core.mesh import MeshConfig, make_mesh
from wfm_jax.data.conversations import read_records
from wfm_jax.families.qwen3_vl.answer import load_processor
from wfm_jax.families.qwen3_vl.tiny import ensure_tiny_qwen3_vl
from wfm_jax.models.qwen3_vl.generate import generate
from wfm_jax.train import vlm_eval
from wfm_jax.train.vlm_eval import answers, read_images
from wfm_jax.worlds.vqa.dataset import build_vqa_dataset
from wfm_jax.worlds.vqa.scenes import vocabulary


def test_answers_on_a_mesh_equal_single_device_answers(tmp_path, monkeypatch):
    model_dir = ensure_tiny_qwen3_vl(str(tmp_path / "model"), vocabulary(), size="spec")
    data = build_vqa_dataset(str(tmp_path / "val"), count=5, split="heldout", seed=3)
    records = read_records(data)
    images = read_images(records, data)
    processor = load_processor(model_dir)
    model = load_model(model_dir, dtype=jnp.float32, param_dtype=jnp.float32)[0]
    kw = dict(max_new_tokens=6, batch_size=3)  # batches of 3 and 2 rows
    alone = answers(model, processor, records, images, **kw)
    mesh = make_mesh(MeshConfig())  # every device on the data axis
    nnx.update(model, jax.device_put(nnx.state(model), NamedSharding(mesh, P())))  # weights replicated
    rows = []

    def counting_generate(model, input_ids, *args, **kwargs):
        rows.append(len(input_ids))
        return generate(model, input_ids, *args, **kwargs)

    monkeypatch.setattr(vlm_eval, "generate", counting_generate)
    on_mesh = answers(model, processor, records, images, mesh=mesh, **kw)
    assert len(alone) == len(records) == 5
    assert on_mesh == alone
    shards = mesh.shape["data"]
    assert rows == [3 + -3 % shards, 2 + -2 % shards]  # each batch widened to the shards
