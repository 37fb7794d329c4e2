"""wfm_jax.plan's frozen-component figure: SD3.5's released CLIP-L + CLIP-G + T5-XXL + VAE per
device, from abstract models and the mesh's parameter shardings (nothing allocated or compiled)."""
from __future__ import annotations

import jax.numpy as jnp
import pytest

from wfm_jax.core import mesh as wmesh
from wfm_jax.programs.abstract import frozen_component_bytes
from wfm_jax.programs.released import released_configs


@pytest.mark.slow  # eval_shape of T5-XXL / CLIP-G: ~30 s of tracing on 2 cores
def test_frozen_components_bytes_per_device():
    sd3 = released_configs("sd3", "stabilityai/stable-diffusion-3.5-medium")
    parts = sd3["text_encoders"] + [sd3["vae"]]
    replicated_fp32 = frozen_component_bytes(parts, wmesh.make_mesh(data=8),
                                             wmesh.active_rules(), jnp.float32)
    sharded_bf16 = frozen_component_bytes(parts, wmesh.make_mesh(data=1, fsdp=8),
                                          wmesh.active_rules(), jnp.bfloat16)
    # T5-XXL's encoder alone is 4.76 B parameters: ~19 GB in fp32 on every device
    assert 22e9 < replicated_fp32 < 23.5e9, replicated_fp32
    assert sharded_bf16 < replicated_fp32 / 12, sharded_bf16


def test_json_mode_keeps_stdout_for_the_json(monkeypatch, capsys):
    """--json: what the planner says on the way (a tiny asset built on first use, through the
    console) goes to stderr, so stdout parses as the report alone."""
    import json

    from wfm_jax.core.console import say
    from wfm_jax.plan import cli, report

    def fake_plan(args):
        say("building the tiny random pipeline at /x (it does not exist yet)")
        return {"config": args.config, "fits": True}

    monkeypatch.setattr(report, "plan", fake_plan)
    monkeypatch.setattr(cli, "virtual_devices", lambda n: None)
    assert cli.main(["--config", "configs/tiny_sft.py", "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"config": "configs/tiny_sft.py", "fits": True}
    assert "building the tiny random pipeline" in err
