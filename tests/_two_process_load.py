"""One of two CPU processes (4 devices each) loading the toy checkpoint onto an fsdp=8 mesh.

`python -m tests._two_process_load PROCESS_ID PORT CHECKPOINT_DIR OUT_JSON` (XLA_FLAGS set by the
caller). Writes the slices this process read and any shard that differs from the checkpoint;
tests/converters/test_loading.py runs two of these and compares. Also holds the read recorder the
in-process loader tests use.
"""
from __future__ import annotations

import contextlib
import json
import sys

import numpy as np


def bounds(index: tuple) -> tuple:
    """A read's index as ((start, stop), ...): hashable and comparable (slices are not in 3.11)."""
    return tuple((s.start, s.stop) for s in index)


def recording_opener(real, reads: list):
    """Wrap loading.open_checkpoint_slices so every read appends (key, bounds, elements)."""

    @contextlib.contextmanager
    def opener(path):
        with real(path) as readers:
            def recorded(key, read):
                def read_and_log(index):
                    out = read(index)
                    reads.append((key, bounds(index), int(out.size)))
                    return out
                return read_and_log
            yield {k: recorded(k, r) for k, r in readers.items()}

    return opener


def main(process_id: int, port: int, checkpoint: str, out: str) -> None:
    import jax
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)
    from safetensors.numpy import load_file

    from converters import loading
    from converters.table import TRANSFORMS
    from tests import _toy_model as toy
    from wfm_jax.core import mesh as wmesh
    from wfm_jax.core.tree import flat_params

    reads: list = []
    loading.open_checkpoint_slices = recording_opener(loading.open_checkpoint_slices, reads)
    model, _ = loading.load_model(checkpoint, mesh=wmesh.make_mesh(fsdp=8))
    tensors = load_file(f"{checkpoint}/diffusion_pytorch_model.safetensors")
    wrong = []
    for rule in toy.build_table(toy.CONFIG):
        want = TRANSFORMS[rule.transform][0](tensors[rule.hf])
        for shard in flat_params(model)[rule.jax][...].addressable_shards:
            if not np.array_equal(np.asarray(shard.data), want[shard.index]):
                wrong.append(f"{rule.jax} {shard.index}")
    with open(out, "w") as f:
        json.dump({"reads": reads, "wrong": wrong,
                   "devices": [d.id for d in jax.local_devices()]}, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
