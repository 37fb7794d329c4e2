"""`python -m wfm_jax.plan --topology v5p:2x2x1`: the tiny recipes' programs compiled by the real
TPU compiler (libtpu) for a 4-chip v5p slice described in software, on this CPU-only machine, run
through the command's own entry (main, --json): every program compiled, the Pallas kernel in
the compiled HLO, the sequence split over `context` (Ulysses' all-to-all), donated state, and a fit
verdict that agrees with the compiled bytes against the chip's HBM. A program the compiler
refuses for memory is a result, and the other programs are still planned.

The TPU compiles need libtpu (the `tpu` extra): skipped without it.
"""
from __future__ import annotations

import json

import jax
import pytest

from wfm_jax import plan as plan_lib
from wfm_jax.plan import topology

GiB = 2 ** 30
V5P_HBM = 95 * GiB
# what the TPU compiler said when the sd35_nft update did not fit 4 v5p chips (tpu_aot.md)
OOM = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
       "temporaries (108.42G) exceeds available HBM (95.74G).\nmore lines")


def _libtpu():
    pytest.importorskip("libtpu", reason="libtpu (the TPU compiler) is not installed: "
                                         "pip install 'jax[tpu]==0.10.2'")


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    path = str(tmp_path_factory.mktemp("topology") / "tiny_sd3")
    build_tiny_pipeline(path, seed=0, family="sd3")
    return path


def _tiny(config, directory, *extra):
    # the tiny pipeline built by the fixture (configs only are read); no dataset build
    return ["--config", config, f"--config.policy.model_name_or_path={directory}",
            "--config.policy.build_tiny=False", "--config.policy.build_tiny_pretrained=False",
            "--config.train.train_policy.dataset.build_tiny=False", *extra]


def _main_json(argv, capsys) -> dict:
    assert plan_lib.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _check_program(name, p, r):
    assert p["compiled"], (name, p.get("error"))
    assert p["attention_kernel"] == "pallas", (name, p["custom_calls"])
    assert p["custom_calls"]["pallas_tpu"] > 0
    b = p["bytes_per_device"]
    assert b["temp"] == p["temp_bytes"] > 0 and b["argument"] > 0 and b["generated_code"] > 0
    # the verdict is the compiled bytes against the chip's HBM (v5p: 95 GiB, one device a chip)
    assert p["hbm_bytes"] == V5P_HBM
    assert p["fits"] == (p["peak_bytes"] <= p["hbm_bytes"])
    assert p["peak_bytes"] >= b["temp"] + b["output"] - b["alias"] + b["generated_code"]
    assert p["flops_per_device"] == pytest.approx(p["flops"] / r["devices"])
    # the cost model's time (labelled an estimate), and MFU against v5p's 459 TFLOP/s
    t = p["estimated_step_seconds"]
    if p["optimal_seconds"] <= 0:  # the cost model's "no estimate" (-1: Ulysses' all-to-all)
        assert t is None and p["estimated_mfu"] is None and "no estimate" in p["estimate_note"]
        return
    assert t >= p["optimal_seconds"] > 0
    assert p["estimated_mfu"] == pytest.approx(p["flops_per_device"] / (t * 459e12))
    # loop bodies x their trip counts, read off the compiled HLO (test_estimate.py)
    # plus the flash attention backward's kernels, whose cost neither XLA nor the kernels give
    assert p["estimate_method"] == "hlo_loops" and t == pytest.approx(
        p["optimal_seconds"] * p["loop_scale"] + p.get("kernel_seconds", 0.0))
    # where the time goes: shares of the roofline that add up, the model's matmuls among the
    # largest, traced back to this project's source lines (the HLO's stack-frame tables)
    b = p["hlo"]["breakdown"]
    shares = b["share_by_kind"]
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares.get("matmul", 0) + shares.get("matmul_memory_bound", 0) > 0
    assert any(x["source"].startswith("layers/") for x in b["top_sources"]), b["top_sources"]
    assert "roofline time by kind: " in plan_lib.describe(r)


@pytest.mark.slow  # two programs through the TPU compiler: ~1-2 min on 2 loaded cores
def test_tiny_sft_planned_for_v5p_with_the_sequence_split(sd3_dir, capsys):
    _libtpu()
    r = _main_json(["--topology", "v5p:2x2x1", "--batch-per-device", "2",
                    *_tiny("configs/tiny_sft.py", sd3_dir, "--config.policy.parallelism.data=2",
                           "--config.policy.parallelism.context=2")], capsys)
    assert r["topology"] == "v5p:2x2x1" and r["device_kind"] == "TPU v5" and r["chip"] == "v5p"
    assert r["devices"] == 4 and r["mesh"] == {"data": 2, "fsdp": 1, "context": 2}
    assert set(r["programs"]) == {"step", "sample"} and r["failed_programs"] == []
    for name, p in r["programs"].items():
        _check_program(name, p, r)
    step = r["programs"]["step"]
    # the sequence split over context=2: Ulysses moves it onto the heads (all-to-all); the
    # gradients are reduced over the data axis; the train state is donated (outputs alias it)
    assert step["collective_bytes"]["all-to-all"] > 0
    assert step["collective_bytes"]["all-reduce"] > 0
    assert step["donated"] and step["alias_bytes"] >= r["train_state_bytes"]
    assert r["fits"] and r["total_bytes"] == max(p["peak_bytes"] for p in r["programs"].values())


@pytest.mark.slow  # three programs (rollout chunk, update, evaluate) through the TPU compiler
def test_tiny_nft_planned_for_v5p(sd3_dir, tmp_path, capsys):
    """Then with the recipe's validation off: the run compiles no evaluate program, so neither
    does the plan, and it says why (the rollout and update from the first plan's cache)."""
    _libtpu()
    argv = ["--topology", "v5p:2x2x1", "--cache-dir", str(tmp_path / "cache"),
            *_tiny("configs/tiny_nft.py", sd3_dir, "--config.train.train_batch_per_replica=8",
                   "--config.train.train_policy.mini_batch=2")]
    r = _main_json(argv, capsys)
    assert r["algorithm"] == "nft" and r["devices"] == 4
    assert set(r["programs"]) == {"rollout", "update", "evaluate"}
    assert r["validation"]["planned"] and "validation.enable" in r["validation"]["why"]
    off = _main_json([*argv, "--config.validation.enable=False"], capsys)
    assert set(off["programs"]) == {"rollout", "update"} and not off["validation"]["planned"]
    assert "--config.validation.enable=True" in off["validation"]["why"]
    assert {k: off["programs"][k]["peak_bytes"] for k in off["programs"]} == {
        k: r["programs"][k]["peak_bytes"] for k in off["programs"]}
    # the text form (what main prints without --json) says it too
    assert "validation: not planned: the recipe's validation.enable is False" \
        in plan_lib.describe(off)
    for name, p in r["programs"].items():
        _check_program(name, p, r)
    assert r["programs"]["update"]["donated"]
    rollout = r["programs"]["rollout"]
    assert rollout["chunks_per_step"] == 8 // r["rollout_chunk"]
    assert rollout["estimated_seconds_per_step"] == pytest.approx(
        rollout["estimated_step_seconds"] * rollout["chunks_per_step"])


@pytest.mark.slow  # the tiny NFT rollout compiled on CPU: ~40-60 s on 2 loaded cores
def test_a_program_out_of_memory_is_a_result_and_the_others_are_planned(sd3_dir, monkeypatch,
                                                                        capsys):
    """The TPU compiler's RESOURCE_EXHAUSTED for one program (the update here, raised where
    compile would raise it; compiled on CPU devices to stay fast): that program is reported
    not compiled and not fitting, with the bytes from the message; the rollout is planned."""
    from wfm_jax.programs.build import Program
    real = Program.lowering

    def lowering(self, *args):  # inside compile_program's guard, as the compile is
        if self.name == "update":
            raise jax.errors.JaxRuntimeError(OOM)
        return real(self, *args)
    monkeypatch.setattr(Program, "lowering", lowering)
    r = _main_json(["--devices", "2", "--device-kind", "v5p",
                    *_tiny("configs/tiny_nft.py", sd3_dir,
                           "--config.train.train_batch_per_replica=8",
                           "--config.train.train_policy.mini_batch=4")], capsys)
    update, rollout = r["programs"]["update"], r["programs"]["rollout"]
    assert not update["compiled"] and update["fits"] is False
    assert update["error"] == OOM.splitlines()[0]
    assert update["required_bytes"] == int(108.42 * GiB) == update["temp_bytes"]
    assert update["compiler_hbm_bytes"] == int(95.74 * GiB)
    assert update["argument_bytes"] > r["train_state_bytes"]  # from the abstract arguments
    assert rollout["compiled"] and rollout["peak_bytes"] > 0 and rollout["flops"] > 0
    assert r["failed_programs"] == ["update"] and r["fits"] is False
    assert r["peak_program"] == "rollout"
    text = plan_lib.describe(r)
    assert "update: not compiled: RESOURCE_EXHAUSTED" in text and "does not fit" in text


@pytest.mark.slow  # a CPU compile of the tiny SFT step: 30-120 s on 2 loaded cores
def test_hbm_override_decides_the_verdict(sd3_dir, capsys):
    r = _main_json(["--devices", "2", "--batch-per-device", "1", "--hbm-gib", "0.001",
                    *_tiny("configs/tiny_sft.py", sd3_dir, "--config.policy.parallelism.data=2")],
                   capsys)
    assert r["device_memory_bytes"] == int(0.001 * GiB)
    assert r["total_bytes"] > r["device_memory_bytes"] and r["fits"] is False
    assert "does not fit" in plan_lib.describe(r)


def test_compile_failure_messages():
    other = topology.compile_failure(jax.errors.JaxRuntimeError("INTERNAL: boom\ntrace"))
    assert other == {"compiled": False, "error": "INTERNAL: boom", "fits": None}
    used = topology.compile_failure(jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 20.50G of 15.75G hbm."))
    assert used["fits"] is False and used["required_bytes"] == int(20.5 * GiB)


def test_estimate_is_loop_corrected_and_refuses_a_meaningless_cost_model():
    # without the HLO's loops (stats["hlo"]: test_estimate.py): XLA counted the scanned body
    # once (1/4 of the jaxpr's FLOPs per device), the whole program x 4
    stats = {"flops": 8e12, "xla_flops_per_device": 0.5e12, "optimal_seconds": 0.01}
    e = topology.estimate(stats, devices=4, peak_flops=459e12)
    assert e["estimate_method"] == "flop_ratio"
    assert e["loop_scale"] == 4 and e["estimated_step_seconds"] == pytest.approx(0.04)
    assert e["estimated_mfu"] == pytest.approx(2e12 / (0.04 * 459e12))
    for seconds in (0.0, -14.8):  # CPU: none; v5e's cost model once gave a negative time
        e = topology.estimate(dict(stats, optimal_seconds=seconds), 4, 459e12)
        assert e["estimated_step_seconds"] is None and e["estimated_mfu"] is None
        assert e["estimate_method"] == "none"


def test_topologies_it_cannot_compile_for_refuse_in_one_line():
    _libtpu()
    with pytest.raises(SystemExit, match=r"--topology 'v5p-8'.*does not match regex"):
        topology.topology_devices("v5p-8")
    with pytest.raises(SystemExit, match="JAX cannot compile for a GPU without one"):
        topology.topology_devices("h100:8")


def test_chip_tables_per_device():
    _libtpu()
    _, v4 = topology.topology_devices("v4:2x2x1")  # 4 chips, one device per TensorCore
    assert v4["devices"] == 8 and v4["chips"] == 4 and v4["hbm_bytes"] == 16 * GiB
    _, v5e = topology.topology_devices("v5e:2x2")
    assert v5e["devices"] == 4 and v5e["hbm_bytes"] == 16 * GiB
    assert v5e["peak_flops_per_device"] == 197e12
    devices, two = topology.topology_devices("v5p:2x2x1", num_slices=2)  # multi-slice
    assert two["devices"] == 8 and two["chips"] == 8 and len({d.slice_index for d in devices}) == 2
