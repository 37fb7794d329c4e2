"""Compile time of the Wan2.1 VAE decode (released config, abstract fp32 weights) for a TPU
topology, by latent shape, without a TPU (docs/recipe_targets.md, sessions 30 and 32):

    python tools/wan_decode_compile.py ROWS LATENT_FRAMES H W [TOPOLOGY] [--encode]

e.g. `4 2 60 104` is one 480x832 clip of 5 frames a chip on v5p:2x2x1 (the default). With
`--encode`, the encode of ROWS clips of FRAMES x H x W pixels instead (`4 81 480 832`). Prints
one JSON line: lowering and compile seconds and the compiled program's temporaries a chip."""
from __future__ import annotations

import json
import sys
import time

from wfm_jax.plan.topology import topology_devices


def main(argv: list[str]) -> None:
    encoding = "--encode" in argv
    argv = [a for a in argv if a != "--encode"]
    rows, frames, h, w = (int(v) for v in argv[:4])
    devices, _ = topology_devices(argv[4] if len(argv) > 4 else "v5p:2x2x1")
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from wfm_jax.core.abstract import abstract_module
    from wfm_jax.core.mesh import make_mesh, mesh_jit
    from wfm_jax.models.wan.vae import AutoencoderKLWan
    from wfm_jax.programs.rl import pixels_to_uint8

    mesh = make_mesh({"data": 1, "fsdp": -1}, devices=devices)
    graph, state = nnx.split(abstract_module(lambda: AutoencoderKLWan({}, rngs=nnx.Rngs(0))))
    whole = NamedSharding(mesh, P())
    state = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=whole), state)
    split_rows = NamedSharding(mesh, P(("data", "fsdp")))
    channels = 3 if encoding else 16
    x = jax.ShapeDtypeStruct((rows, channels, frames, h, w), jnp.float32, sharding=split_rows)

    @mesh_jit(mesh=mesh, out_shardings=split_rows)
    def run(s, x):
        if encoding:
            return nnx.merge(graph, s).encode_moments(x)  # pixels in [-1, 1] -> mean, log-var
        pixels = nnx.merge(graph, s).decode(x)  # [-1, 1]
        return pixels_to_uint8(pixels * 0.5 + 0.5)  # the rollout's uint8 pixels

    start = time.time()
    lowered = run.lower(state, x)
    lowered_at = time.time()
    compiled = lowered.compile()
    done = time.time()
    temp = compiled.memory_analysis().temp_size_in_bytes
    shape = {"frames": frames, "hw": [h, w]} if encoding else {"latent_frames": frames,
                                                                "latent_hw": [h, w]}
    print(json.dumps({"program": "encode" if encoding else "decode", "rows": rows, **shape,
                      "lower_s": round(lowered_at - start, 1), "compile_s": round(done - lowered_at, 1),
                      "temp_gb_a_chip": round(temp / 1e9, 2)}))


if __name__ == "__main__":
    main(sys.argv[1:])
