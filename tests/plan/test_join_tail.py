"""plan.compiled.join_tail: the sampler and the RL rollout planned as the program up to their
VAE decode (programs.build's `split`) plus the decode compiled once, against the whole program
compiled as the trainer runs it: the tiny SD3's NFT rollout and evaluation on 8 CPU devices (the
evaluation is the SFT sampler's program: programs.build makes both with one `sampler_split`).
Arguments, outputs and FLOPs are the whole's; temporaries within 0.1% (measured: under 0.01%,
the larger of the two parts' as the body's buffers are dead when the decode runs).
The planner's use on a TPU topology (one decode for the rollout and the evaluation):
tests/plan/test_layers.py."""
from __future__ import annotations

import jax
import pytest

from tests.plan._tiny_sd3 import tiny_sd3_plan_argv
from wfm_jax.algorithms.registry import algorithm_named
from wfm_jax.config.recipe import load_config
from wfm_jax.core import mesh as wmesh
from wfm_jax.plan import cli
from wfm_jax.plan.compiled import compile_program, join_tail, plan_mesh
from wfm_jax.plan.report import program_signature
from wfm_jax.programs import abstract_setup, build
from wfm_jax.programs.stats import per_device_bytes

pytestmark = pytest.mark.compile_bound  # its time is compiling: CPU programs at LLVM -O0 (tests/_support/xla.py)


def _programs(argv: list[str]):
    args = cli.parse_args([*argv[:1], "configs/tiny_nft.py", *argv[2:], "--devices", "8",
                           "--config.train.train_batch_per_replica=64"])
    config = load_config(args.config, [tuple(kv.split("=", 1)) for kv in args.set])
    mesh, _ = plan_mesh(args, config)
    algo = algorithm_named("nft")
    algo_config = algo.Config.from_recipe(config)
    setup = abstract_setup(config, mesh, wmesh.active_rules(),
                           aux_fn=algo.aux_fn(algo_config, bool(config.policy.lora.enable)))
    return build(setup, algo(algo_config, setup.pipe.shell()))


def test_body_joined_to_its_decode_is_the_whole_program(tmp_path):
    if jax.device_count() < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    programs = _programs(tiny_sd3_plan_argv(str(tmp_path / "tiny_sd3"), 2))
    assert set(programs.split) == {"rollout", "evaluate"}
    decodes: dict = {}  # one compile per decode signature, as the planner does
    for name, (body, decode) in programs.split.items():
        whole = compile_program(getattr(programs, name), False)
        key = program_signature(decode)
        if key not in decodes:
            decodes[key] = compile_program(decode, False)
        parts = [compile_program(body, False), decodes[key]]
        joined = join_tail(*parts, per_device_bytes(decode.abstract_args()[1]))
        assert joined["compiled"] and joined["argument_bytes"] == whole["argument_bytes"], name
        # (a tuple result's index table: a few bytes per output)
        assert abs(joined["output_bytes"] - whole["output_bytes"]) <= 64, name
        assert joined["flops"] == whole["flops"] and joined["flops"] > parts[0]["flops"] > 0, name
        assert joined["xla_flops_per_device"] == pytest.approx(whole["xla_flops_per_device"],
                                                               rel=1e-6), name
        assert joined["temp_bytes"] == pytest.approx(whole["temp_bytes"], rel=1e-3), name
        assert joined["compile_seconds"] == pytest.approx(
            parts[0]["compile_seconds"] + parts[1]["compile_seconds"], abs=0.11)
    assert len(decodes) == 1  # the rollout's and the evaluation's decode: one program


def test_a_refused_part_refuses_the_whole():
    body = {"compiled": True, "compile_seconds": 3.0, "temp_bytes": 10}
    tail = {"compiled": False, "compile_seconds": 2.0, "temp_bytes": 99, "required_bytes": 99,
            "error": "RESOURCE_EXHAUSTED"}
    joined = join_tail(body, tail, 0)
    assert joined["compiled"] is False and joined["required_bytes"] == 99
    assert joined["compile_seconds"] == 5.0



def test_split_decode_plans_the_model_itself_with_its_decode_apart(tmp_path, capsys):
    """--split-decode: no cut models (the model's own depth, nothing scaled), the rollout as its
    body and its decode joined; the figures are the whole rollout's as the plain plan compiles
    it (FLOPs equal, bytes within the join's few bytes), and the update is compiled as it is."""
    import json

    if jax.device_count() < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    argv = tiny_sd3_plan_argv(str(tmp_path / "tiny_sd3"), 2)
    argv = [*argv[:1], "configs/tiny_nft.py", *argv[2:], "--devices", "8", "--no-cache", "--json",
            "--config.train.train_batch_per_replica=64"]
    reports = []
    for extra in ([], ["--split-decode"]):
        assert cli.main([*argv, *extra]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    plain, split = (r["programs"] for r in reports)
    assert "decode" not in plain["rollout"] and "scaled_from" not in split["rollout"]
    assert split["rollout"]["decode"]["compiled"] and "split_method" in split["rollout"]
    assert split["rollout"]["flops"] == plain["rollout"]["flops"] > 0
    for key in ("argument_bytes", "output_bytes"):
        assert abs(split["rollout"][key] - plain["rollout"][key]) <= 64, key
    assert split["rollout"]["temp_bytes"] == pytest.approx(plain["rollout"]["temp_bytes"], rel=1e-3)
    assert "decode" not in split["update"]
    assert split["update"]["temp_bytes"] == plain["update"]["temp_bytes"]
    assert reports[1]["layers"] == reports[0]["layers"] == 2 and reports[1]["layer_scaling"] is None


def test_split_decode_with_layers_is_one_line(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(["--config", "configs/tiny_nft.py", "--layers", "1", "--split-decode"])
    assert "--layers K already compiles the decode once" in capsys.readouterr().err
