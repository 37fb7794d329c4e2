"""wfm_jax.plan on the vision-language family (Qwen3-VL / Cosmos-Reason2 SFT): the parameter count
of the abstract 2B / 8B models against an independent count from the architecture (and the sizes
the released checkpoints have), the tiny VLM recipe planned through the command at 8 CPU devices
(bytes per device against the model's own count, replicated and fully sharded, and the verdict),
the few-vision-block scaling, and one TPU-topology compile of a few-layer Reason2-2B shape."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests._support.paths import REPO_ROOT
from wfm_jax.programs import vlm_abstract
from wfm_jax.programs.released import QWEN3_VL_2B, QWEN3_VL_8B
from wfm_jax.worlds.vqa.model import pretrain_dir


def architecture_count(config: dict) -> int:
    """Qwen3-VL's parameters as transformers lays them out (specs/reason2.md §1), by hand."""
    t, v = config["text_config"], config["vision_config"]
    d, inter, hd = t["hidden_size"], t["intermediate_size"], t["head_dim"]
    heads, kv = t["num_attention_heads"], t["num_key_value_heads"]
    layer = (d * heads * hd + 2 * d * kv * hd + heads * hd * d  # q, k, v, o (no bias)
             + 2 * hd + 2 * d + 3 * d * inter)  # q/k norms, two RMSNorms, gated MLP
    text = t["vocab_size"] * d + t["num_hidden_layers"] * layer + d
    if not config["tie_word_embeddings"]:
        text += t["vocab_size"] * d
    dv, iv, out = v["hidden_size"], v["intermediate_size"], v["out_hidden_size"]
    merged = dv * v["spatial_merge_size"] ** 2
    block = 4 * dv + (dv * 3 * dv + 3 * dv) + (dv * dv + dv) + (dv * iv + iv) + (iv * dv + dv)
    fc = merged * merged + merged + merged * out + out
    vision = (v["in_channels"] * v["temporal_patch_size"] * v["patch_size"] ** 2 * dv + dv
              + v["num_position_embeddings"] * dv + v["depth"] * block
              + 2 * dv + fc  # the merger: LayerNorm over one patch, then the 2x2 block's MLP
              + len(v["deepstack_visual_indexes"]) * (2 * merged + fc))  # DeepStack: LN after
    return text + vision


@pytest.mark.parametrize("config, released", [(QWEN3_VL_2B, 2.13e9), (QWEN3_VL_8B, 8.77e9)])
def test_parameter_count_of_the_released_sizes(config, released):
    count = vlm_abstract.parameter_count(config)
    assert count == architecture_count(config)
    # the Hub's parameter counts of Qwen3-VL-2B / -8B-Instruct (Cosmos-Reason2-2B / -8B)
    assert count == pytest.approx(released, abs=0.005e9)


def test_few_layer_scaling_is_linear_in_depth():
    from wfm_jax.plan.compiled import scale_linear
    from wfm_jax.plan.vlm import SCALE_METHOD

    def compiled(layers):  # a program whose figures grow by a fixed amount per layer
        return {"compiled": True, "temp_bytes": 100 + 7 * layers, "generated_code_bytes": 5 * layers,
                "argument_bytes": 50 + 3 * layers, "output_bytes": 2 * layers, "alias_bytes": 2 * layers,
                "flops": 3.0 * layers, "xla_flops_per_device": 2.0 * layers,
                "optimal_seconds": 0.5 * layers, "xla_bytes_accessed": 11.0 * layers,
                "collective_bytes": {"all-reduce": 13 * layers}, "compile_seconds": 1.0}
    full = scale_linear([compiled(3), compiled(6)], (3, 6), 24, "vision_blocks", SCALE_METHOD)
    want = compiled(24)
    for key in ("temp_bytes", "generated_code_bytes", "argument_bytes", "output_bytes", "alias_bytes",
                "flops", "optimal_seconds", "collective_bytes"):
        assert full[key] == want[key], key
    assert [m["vision_blocks"] for m in full["scaled_from"]] == [3, 6]
    assert full["scale_factor"] == 24 / 3 - 1 and full["scale_method"] == SCALE_METHOD
    failed = {"compiled": False, "error": "RESOURCE_EXHAUSTED", "compile_seconds": 1.0}
    assert scale_linear([compiled(2), failed], (2, 4), 28, "vision_blocks", "")["compiled"] is False


_SCRIPT = """
import json, sys
from wfm_jax.plan import cli
cli.virtual_devices(8)
from wfm_jax.plan import describe, plan
for argv in json.loads(sys.argv[1]):
    r = plan(cli.parse_args(argv))
    print(describe(r), file=sys.stderr)
    print(json.dumps(r))
"""


def _plans(jobs: list[list[str]]) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(jobs)], cwd=REPO_ROOT,
                         env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.count("  peak (") == len(jobs), out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow  # two compiles of the tiny VLM step at 8 devices (~1 min on 2 loaded cores)
def test_tiny_vlm_sft_planned_at_8_devices(tmp_path):
    model = str(tmp_path / "tiny_vlm")
    # every weight trained (the recipe freezes the vision tower): params_bytes counts them all
    base = ["--config", "configs/tiny_vlm_sft.py", f"--config.policy.model_name_or_path={model}",
            "--config.policy.vlm.train_vision=True",
            "--devices", "8", "--seq-len", "128", "--size", "96", "--batch-per-device", "2"]
    replicated, sharded = _plans([base, [*base, "--config.policy.parallelism.data=1",
                                         "--config.policy.parallelism.fsdp=8", "--hbm-gib", "0.001"]])
    # planning builds only the base's random stage (same shapes), never a stand-in for the
    # pre-trained base the recipe's run builds at `model`
    random_stage = os.path.join(pretrain_dir(model), "random")
    assert not os.path.exists(model)
    with open(os.path.join(random_stage, "config.json")) as f:
        count = vlm_abstract.parameter_count(json.load(f))
    for r in (replicated, sharded):
        assert r["family"] == "qwen3_vl" and r["model_configs"] == random_stage
        assert r["parameters"] == count and set(r["programs"]) == {"step"}
        assert r["sequence_length"] == 128 and r["visual_tokens_per_row"] == 9  # 96 px: 6x6 patches / 4
        assert r["global_batch"] == 16
        step = r["programs"]["step"]
        assert step["compiled"] and r["activation_bytes"] == step["temp_bytes"] > 0
        assert r["total_bytes"] == step["peak_bytes"] >= r["train_state_bytes"] + step["temp_bytes"]
        assert r["flops_per_step"] > 0
    # fp32 weights, whole on every device when replicated; AdamW's two moments beside them
    assert replicated["params_bytes"] == 4 * count
    assert replicated["optimizer_bytes"] >= 2 * replicated["params_bytes"]
    assert replicated["fits"] is True
    # fsdp=8 splits the weights whose fsdp axis divides by 8 (the tiny model's norms, biases and
    # a few small tables stay whole): between an eighth and half of them on each device
    assert replicated["params_bytes"] / 8 <= sharded["params_bytes"] < replicated["params_bytes"] / 2
    assert sharded["mesh"]["fsdp"] == 8
    assert sharded["fits"] is False and sharded["device_memory_bytes"] == int(0.001 * 2 ** 30)


@pytest.mark.slow  # four compiles of the tiny VLM (rollout prefill and decode, update, log-probs)
def test_tiny_vlm_grpo_planned_at_8_devices(tmp_path):
    """The GRPO step's programs as the trainer runs them: the rollout's KV cache (split by rows
    over 8 devices, donated to the decode loop), the update on prompt + response rows, the
    log-prob pass mu_iterations > 1 needs, and the KL reference kept beside the train state."""
    model = str(tmp_path / "tiny_vlm")
    (r,) = _plans([["--config", "configs/tiny_vlm_grpo.py", f"--config.policy.model_name_or_path={model}",
                    "--devices", "8", "--seq-len", "32", "--size", "96",
                    "--config.train.train_policy.lm_grpo.kl_beta=0.01",
                    "--config.train.train_policy.mu_iterations=2", "--config.rollout.batch_size=2"]])
    with open(os.path.join(pretrain_dir(model), "random", "config.json")) as f:
        text = json.load(f)["text_config"]
    progs = r["programs"]
    assert set(progs) == {"rollout_prefill", "rollout_decode", "update", "logprobs"}
    assert all(p["compiled"] for p in progs.values())
    new = 24  # the recipe's lm_grpo.max_response_length
    assert (r["prompt_tokens"], r["response_tokens"], r["sequence_length"]) == (32, new, 32 + new)
    # rollout.batch_size 2: two generate calls of 2 prompts x 8 completions; one update of all 32
    assert (r["global_batch"], r["rollout_rows"], r["update_rows"], r["n_generation"]) == (32, 16, 32, 8)
    rows = 16 // 8  # per device: one call's rows split over data=8
    total = 32 + new
    cache = 2 * text["num_hidden_layers"] * rows * total * text["num_key_value_heads"] * text["head_dim"] * 4
    vocab = text["vocab_size"]
    # decode's own inputs: the cache, first tokens, their logits, the kv mask, last positions, the key
    decode = progs["rollout_decode"]
    assert decode["batch_bytes"] == cache + 4 * rows + 4 * rows * vocab + 4 * rows * total + 4 * 4 * rows + 8
    assert decode["alias_bytes"] >= cache  # donated: the loop writes the prefill's cache in place
    assert progs["rollout_prefill"]["output_bytes"] >= cache
    # the update's batch: ids, mask, positions, completion mask, advantages, old and reference log-probs
    upd = progs["update"]
    rows = 32 // 8  # the update's
    patches = 96 // 16
    assert upd["batch_bytes"] == 4 * rows * (total * 3 + 4 * total + 1 + 2 * (total - 1)) + \
        4 * rows * patches * patches * 3 * 2 * 16 * 16
    assert r["ref_bytes"] == r["params_bytes"] > 0  # kl_beta: the starting policy's params
    peaks = {k: p["peak_bytes"] for k, p in progs.items()}
    assert r["peak_program"] == max(peaks, key=peaks.get) and r["total_bytes"] == max(peaks.values())
    assert all(p >= r["train_state_bytes"] + r["ref_bytes"] for p in peaks.values())
    assert r["fits"] is True and r["activation_bytes"] == upd["temp_bytes"]


@pytest.mark.slow  # one libtpu compile of a Reason2-2B step cut to 2 layers and 3 vision blocks
def test_reason2_shape_compiles_for_a_tpu_topology(tmp_path, capsys):
    pytest.importorskip("libtpu", reason="libtpu (the TPU compiler) is not installed")
    from wfm_jax import plan as plan_lib
    model = tmp_path / "reason2_2b_two_layers"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(vlm_abstract.with_depth(QWEN3_VL_2B, 2, 3)))
    argv = ["--config", "configs/reason2_2b_sft.py", f"--config.policy.model_name_or_path={model}",
            # 128 tokens, 64 px (16 patches, 4 visual tokens): the compile takes half the time of
            # 512 / 256 px (24 against 44 s alone) with every weight of the released shape kept
            "--topology", "v5p:2x2x1", "--seq-len", "128", "--size", "64", "--batch-per-device", "1",
            "--config.policy.parallelism.data=1", "--config.policy.parallelism.fsdp=4", "--json"]
    assert plan_lib.main(argv) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    step = r["programs"]["step"]
    assert r["topology"] == "v5p:2x2x1" and r["devices"] == 4 and r["text_layers"] == 2
    assert step["compiled"], step.get("error")
    assert step["bytes_per_device"]["temp"] == step["temp_bytes"] > 0 and step["donated"]
    assert step["fits"] == (step["peak_bytes"] <= step["hbm_bytes"]) and r["fits"] is True
    # bf16 compute, fp32 master weights split four ways
    assert r["params_bytes"] < 4 * r["parameters"] / 2


def test_cut_model_keeps_its_deepstack_taps():
    for config in (QWEN3_VL_2B, QWEN3_VL_8B):
        taps = len(config["vision_config"]["deepstack_visual_indexes"])
        for blocks in (3, 6):
            cut = vlm_abstract.with_depth(config, None, blocks)
            kept = cut["vision_config"]["deepstack_visual_indexes"]
            assert len(set(kept)) == taps and max(kept) < blocks == cut["vision_config"]["depth"]
            assert cut["text_config"] == config["text_config"]


def test_main_refuses_a_vlm_run_that_cannot_fit_before_loading_weights(tmp_path, monkeypatch, capsys):
    """main plans a VLM run as it does a DiT one: on a 1 MiB device the tiny model's train
    state alone does not fit, refused from its shapes in one line before any compile or weight;
    the same for the GRPO recipe."""
    from wfm_jax.cli.main import EXIT_BAD_INPUT, main
    from wfm_jax.config.recipe import load_config
    from wfm_jax.families.qwen3_vl.tiny import ensure_tiny_qwen3_vl
    from wfm_jax.plan import MEMORY_ENV, check_fits
    from wfm_jax.programs import SetupError
    from wfm_jax.worlds.vqa.scenes import vocabulary
    model = ensure_tiny_qwen3_vl(str(tmp_path / "model"), vocabulary(), size="spec")
    monkeypatch.setenv(MEMORY_ENV, str(1 << 20))
    out = tmp_path / "run"
    code = main(["--config", "configs/tiny_vlm_sft.py", f"--config.policy.model_name_or_path={model}",
                 f"--config.train.output_dir={out}", "--config.policy.vlm.build_tiny_vqa=False",
                 "--config.policy.vlm.train_vision=True",  # every weight trained, as counted below
                 f"--config.train.train_policy.dataset.local_dir={tmp_path / 'none'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_BAD_INPUT
    assert len(err) == 1 and "what stays on each device needs" in err[0] and "has 1048576 bytes" in err[0], err
    with open(os.path.join(model, "config.json")) as f:
        count = vlm_abstract.parameter_count(json.load(f))
    # the recipe replicates the model: fp32 weights and AdamW's two moments whole on each device
    assert int(err[0].split(" needs ")[1].split(" bytes")[0]) >= 12 * count > 1 << 20
    assert not (out / "checkpoints").exists()
    grpo = load_config("configs/tiny_vlm_grpo.py", [("policy.model_name_or_path", model)])
    with pytest.raises(SetupError, match="what stays on each device needs"):
        check_fits(grpo)
