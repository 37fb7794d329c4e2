"""One of two CPU processes (4 devices each, one fsdp=8 mesh) running the RL loop's
chunk_conditions (and rollout_conditions' table) on the tiny NFT recipe's first batch.

`python -m tests._two_process_conditions PROCESS_ID PORT PIPE_DIR OUT_DIR` (XLA_FLAGS set by
the caller). Writes OUT_DIR/process_<id>.npz: this process's prompts and, per rollout chunk and
conditioning key, the rows this process holds; tests/train/test_loop_overlap.py compares them with
one process's encoding of the same prompts, and the SFT encode cache's any_process vote.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np


def main(process_id: int, port: int, pipe_dir: str, out_dir: str) -> None:
    import jax
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id)
    from tests._rl_toy import PROMPTS
    from wfm_jax.config.recipe import load_config
    from wfm_jax.train import rl_setup
    from wfm_jax.train.encode_cache import any_process, local_rows

    config = load_config(os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "configs", "tiny_nft.py"), [(k, str(v)) for k, v in {
            "policy.model_name_or_path": pipe_dir, "train.output_dir": f"{out_dir}/run",
            "policy.parallelism.data": 1, "policy.parallelism.fsdp": 8,
            "policy.diffusers.inference_size": "(16, 16)", "train.train_batch_per_replica": 16,
            "train.train_policy.mini_batch": 1, "rollout.n_generation": 4,
            "train.train_policy.dataset.local_dir": PROMPTS, "validation.enable": False,
            "train.train_policy.remote_reward.reward_fns":
                '[{"name": "jpeg_compressibility", "weight": 1.0, "score_key": ""}]'}.items()])
    run = rl_setup.build(config)
    try:
        prompts = list(run.batcher.batch_at(0)["prompt"])
        conds = run.chunk_conditions(prompts)
        arrays = {f"{k}/{name}": local_rows(v) for k, c in enumerate(conds)
                  for name, v in c.items()}
        _, kept = run.rollout_conditions(prompts)  # the update's table and each row's index
        arrays.update({f"table/{name}": local_rows(v) for name, v in kept["prompt_cond"].items()})
        arrays["cond_index"] = local_rows(kept["cond_index"])
        slots = run.layout.cond_slots
    finally:
        run.close()
    np.savez(os.path.join(out_dir, f"process_{process_id}.npz"), **arrays)
    with open(os.path.join(out_dir, f"process_{process_id}.json"), "w") as f:
        json.dump({"prompts": prompts, "chunk": run.rollout_chunk, "slots": slots,
                   # the SFT cache's agreement:
                   "any": [any_process(process_id == 0), any_process(False)]}, f)
    jax.distributed.shutdown()  # the barrier before either process tears its backend down


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])
