"""wfm_jax.bench: the FLOP formulas against traced jaxprs, the peak table, the report, the CLI's
bad-input paths, and one in-process run of the tiny suite whose JSON must carry every figure for
both stacks. Figures are never asserted (they are measurements); only their presence and type,
and that both stacks trained the same parameters from the same weights."""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from wfm_jax.bench import flops, report, runner, timing
from wfm_jax.bench.__main__ import main
from wfm_jax.bench.devices import peak_flops_for
from wfm_jax.bench.suites import CPU_VAE, LORA_TARGETS, TINY_TRANSFORMER, Options, get_suite
from wfm_jax.core.abstract import abstract_module
from wfm_jax.models.layers.embeddings import Buffer
from wfm_jax.models.lora import attach_lora
from wfm_jax.models.sd3.transformer import SD3Transformer
from wfm_jax.models.vae import AutoencoderKL

# 3 blocks: dual + plain + last (context_pre_only), non-square latents
T_CFG = dict(TINY_TRANSFORMER, num_layers=3, dual_attention_layers=(0,))
B, H, W, L = 2, 8, 12, 5


def _abstract_transformer(lora_rank: int = 0):
    def make():
        m = SD3Transformer(T_CFG, rngs=nnx.Rngs(0))
        if lora_rank:
            attach_lora(m, LORA_TARGETS, lora_rank, 2.0 * lora_rank)
        return m
    return abstract_module(make)


def _inputs():
    return (jax.ShapeDtypeStruct((B, T_CFG["in_channels"], H, W), jnp.float32),
            jax.ShapeDtypeStruct((B, L, T_CFG["joint_attention_dim"]), jnp.float32),
            jax.ShapeDtypeStruct((B, T_CFG["pooled_projection_dim"]), jnp.float32),
            jax.ShapeDtypeStruct((B,), jnp.float32))


def _jaxpr_flops(fn, *args) -> float:
    return flops.count_jaxpr_flops(jax.make_jaxpr(fn)(*args))


@pytest.mark.parametrize("rank", [0, 4], ids=["base", "lora"])
def test_mmdit_forward_flops_match_jaxpr(rank):
    graph, state = nnx.split(_abstract_transformer(rank))
    got = _jaxpr_flops(lambda s, *a: nnx.merge(graph, s)(*a), state, *_inputs())
    want = flops.mmdit_forward(T_CFG, H, W, L)["total"]
    if rank:
        want += flops.lora_forward(T_CFG, H, W, L, LORA_TARGETS, rank)
    assert got == B * want


def test_full_finetune_flops_match_autodiff():
    trainable = nnx.All(nnx.Param, nnx.Not(Buffer))
    graph, params, rest = nnx.split(_abstract_transformer(), trainable, ...)
    args = [jnp.zeros(a.shape, a.dtype) for a in _inputs()]

    def loss(p, r):
        return jnp.mean(nnx.merge(graph, p, r)(*args).astype(jnp.float32) ** 2)

    got = _jaxpr_flops(jax.grad(loss), params, rest)
    want = flops.train_step(T_CFG, B, H, W, L)
    assert got == want["autodiff"]
    assert want["model"] == 3 * want["forward"]


def test_lora_flops_convention_bounds_autodiff():
    graph, lora, rest = nnx.split(_abstract_transformer(4), nnx.LoRAParam, ...)
    args = [jnp.zeros(a.shape, a.dtype) for a in _inputs()]
    got = _jaxpr_flops(jax.grad(lambda p, r: jnp.mean(nnx.merge(graph, p, r)(*args) ** 2)), lora,
                       rest)
    want = flops.train_step(T_CFG, B, H, W, L, lora_targets_=LORA_TARGETS, lora_rank=4)
    # the convention counts every frozen input gradient; autodiff prunes those nothing needs
    assert want["forward"] < got <= want["model"]


@pytest.mark.parametrize("post_quant", [False, True])
def test_vae_decode_flops_match_jaxpr(post_quant):
    cfg = dict(CPU_VAE, use_post_quant_conv=post_quant)
    graph, state = nnx.split(abstract_module(lambda: AutoencoderKL(cfg, rngs=nnx.Rngs(0))))
    z = jax.ShapeDtypeStruct((1, cfg["latent_channels"], 6, 4), jnp.float32)
    got = _jaxpr_flops(lambda s, z: nnx.merge(graph, s).decode(z), state, z)
    assert got == flops.vae_decode(cfg, 6, 4)


def test_lora_targets_are_the_recipe_targets():
    from wfm_jax.config.schema import SD3_LORA_TARGETS
    assert tuple(SD3_LORA_TARGETS) == LORA_TARGETS


def test_peak_table_lookup():
    assert peak_flops_for("NVIDIA H100 80GB HBM3") == 989.4e12
    assert peak_flops_for("NVIDIA H100 PCIe") == 756e12
    assert peak_flops_for("NVIDIA H200") == 989.4e12
    assert peak_flops_for("TPU v5 lite") == 197e12
    assert peak_flops_for("TPU v5p") == 459e12
    assert peak_flops_for("cpu") is None


def test_bytes_read_as_gib_the_same_everywhere():
    assert timing.gib(3 * 2 ** 30) == "3.00"
    assert timing.gib(1536 * 2 ** 20) == timing.gib(np.int64(1536 * 2 ** 20)) == "1.50"
    assert timing.gib(None) == timing.gib(float("nan")) == "n/a"


def test_ratios_and_markdown_with_a_failed_stack():
    ok = {"stack": "wfm_jax", "status": "ok", "step_time_s": 0.5, "samples_per_s": 4.0,
          "flops_per_step": 1e9, "tflops_per_s": 2e-3, "mfu": None, "peak_memory_bytes": None,
          "compile_time_s": 3.0, "notes": {"mfu": "x", "peak_memory_bytes": "y"}}
    bad = timing.failed("torch", "train_full", MemoryError("out of memory\nsecond line"))
    r = report.ratios(ok, bad)
    assert set(r) == set(timing.FIGURES) | {"speedup"}
    assert all(v is None for v in r.values())
    assert bad["error"] == "MemoryError: out of memory"
    assert all(bad["notes"][k] for k in timing.FIGURES)
    good = dict(ok, stack="torch", step_time_s=1.0)
    assert report.ratios(ok, good)["speedup"] == 2.0


def test_cli_rejects_bad_arguments(tmp_path, capsys):
    for argv in (["--only", "nope"], ["--repeats", "0"], ["--suite", "tpu"],
                 ["--suite", "cosmos_tiny", "--xla-memory", "--xla-devices", "0"],
                 ["--config.train.seed=1"],  # an override belongs to --recipe
                 ["--recipe", "configs/tiny_sft.py", "--devices", "0"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    capsys.readouterr()
    (tmp_path / "blocker").write_text("")
    assert main(["--tiny", "--out", str(tmp_path / "blocker" / "r.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "blocker" in err[0]


def test_worker_entry_writes_a_record(tmp_path):
    """The isolated-process path in-process: the spec round-trips the suite (reward: no jit)."""
    suite = get_suite("tiny")
    out = tmp_path / "rec.json"
    spec = {"suite": dataclasses.asdict(suite), "options": dataclasses.asdict(Options()),
            "workload": "reward", "stack": "torch", "peak": {}, "out": str(out)}
    assert runner.worker_main(json.dumps(spec)) == 0
    rec = json.loads(out.read_text())
    assert rec["status"] == "ok" and rec["stack"] == "torch"
    _check_figures(rec)


def _check_figures(rec: dict):
    for key in timing.FIGURES:
        assert key in rec, key
        value = rec[key]
        if value is None:
            assert isinstance(rec["notes"].get(key), str) and rec["notes"][key], key
        else:
            assert isinstance(value, (int, float)) and math.isfinite(value), (key, value)
    assert isinstance(rec["step_times_s"], list) and rec["step_times_s"]
    assert all(isinstance(t, float) for t in rec["step_times_s"])
    assert isinstance(rec["first_call_s"], float)


@pytest.fixture(scope="module")
def tiny_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "results.json"
    profile = str(out.parent / "profile")  # attention "auto"; traces after the timed steps
    result = runner.run_suite(get_suite("tiny"), options=Options(profile=profile))
    report.write(result, str(out))
    return json.loads(out.read_text()), out.with_suffix(".md").read_text()


@pytest.mark.slow
def test_tiny_suite_json_has_every_figure_for_both_stacks(tiny_result):
    result, md = tiny_result
    assert result["suite"] == "tiny"
    for key in ("jax", "torch", "diffusers", "peft", "date"):
        assert isinstance(result["environment"][key], str) and result["environment"][key]
    assert isinstance(result["device"]["device_kind"], str)
    assert isinstance(result["peak"]["peak_source"], str)
    assert result["shapes"]["transformer"]["num_layers"] == TINY_TRANSFORMER["num_layers"]
    assert set(result["workloads"]) == set(runner.WORKLOADS)
    for name, w in result["workloads"].items():
        assert set(w["stacks"]) == {"wfm_jax", "torch"}, name
        for stack, rec in w["stacks"].items():
            assert rec["status"] == "ok", (name, stack, rec.get("error"))
            _check_figures(rec)
        ratio = w["ratio_wfm_jax_over_torch"]
        assert set(ratio) == set(timing.FIGURES) | {"speedup"}
        assert all(v is None or isinstance(v, float) for v in ratio.values())
        assert name in md
        if name != "reward":  # --profile: a trace per wfm_jax workload, where it says
            trace = w["stacks"]["wfm_jax"]["profile_dir"]
            assert trace.endswith(name) and list(pathlib.Path(trace).rglob("*.xplane.pb")), name
    assert "wfm_jax / torch" in md


@pytest.mark.slow
def test_tiny_suite_stacks_trained_the_same_model(tiny_result):
    """Same weights, same inputs: both stacks train the same parameters (the position Buffer
    excluded) and start from the same loss, to bf16 precision."""
    result, _ = tiny_result
    for name in ("train_full", "train_lora"):
        s = result["workloads"][name]["stacks"]
        assert s["wfm_jax"]["trained_params"] == s["torch"]["trained_params"], name
        assert s["wfm_jax"]["attention_impl"] == "xla", name  # "auto" on a CPU
        # bf16 compute in both, different op order: a few bf16 roundings apart
        np.testing.assert_allclose(s["wfm_jax"]["first_loss"], s["torch"]["first_loss"], rtol=5e-2)
    r = result["workloads"]["rollout"]["stacks"]
    np.testing.assert_allclose(r["wfm_jax"]["output_mean"], r["torch"]["output_mean"], atol=2e-2)
    w = result["workloads"]["reward"]["stacks"]
    assert w["wfm_jax"]["first_score"] == w["torch"]["first_score"]


# ----------------------------------------------------------------------------- rl suite

def _ctx(load: float, jax_rate: float, torch_rate: float) -> dict:
    return {"environment": {"date": "d", "jax": "j", "torch": "t", "diffusers": "d", "peft": "p",
                            "load_average_1m": load},
            "device": {"platform": "cpu", "device_kind": "cpu", "cpu_count": 2},
            "peak": {"peak_flops": max(jax_rate, torch_rate), "peak_source": "measured",
                     "matmul_flops": {"jax": jax_rate, "torch": torch_rate}}}


def test_busy_machine_withholds_ratios():
    # under load torch's matmul rate collapsed and the table claimed wfm_jax 8-16x faster
    rec = {"status": "ok", "step_time_s": 0.5, "samples_per_s": 4.0, "flops_per_step": 1e9,
           "tflops_per_s": 2e-3, "mfu": 0.3, "peak_memory_bytes": None, "compile_time_s": 3.0,
           "notes": {"peak_memory_bytes": "n/a"}}
    records = {"train_full": {"wfm_jax": dict(rec, stack="wfm_jax"),
                              "torch": dict(rec, stack="torch", step_time_s=4.0)}}
    suite = get_suite("cpu")

    def result(ctx):
        return report.assemble(suite, Options(), False, ctx, records, runner.WORKLOADS)

    idle = result(_ctx(0.2, 105e9, 83e9))
    assert idle["busy"] == [] and idle["workloads"]["train_full"]["ratio_wfm_jax_over_torch"][
        "speedup"] == 8.0
    assert "Warning" not in report.markdown(idle) and "0.12x" in report.markdown(idle)
    for ctx, reason in ((_ctx(1.8, 105e9, 83e9), "load average 1.8 on 2 cores at start"),
                        (_ctx(0.2, 105e9, 12e9), "the same bf16 matmul ran 8.8x slower in torch "
                                                 "than in jax")):
        busy = result(ctx)
        assert busy["busy"] == [reason]
        ratio = busy["workloads"]["train_full"]["ratio_wfm_jax_over_torch"]
        assert set(ratio) == set(timing.FIGURES) | {"speedup"}
        assert all(v is None for v in ratio.values())
        md = report.markdown(busy)
        assert f"**Warning: machine busy ({reason}): wfm_jax / torch ratios withheld" in md
        assert "0.12x" not in md  # the step-time ratio row is blank


# ----------------------------------------------------------------------------- Cosmos workload

from wfm_jax.bench.suites import COSMOS_LORA_TARGETS, COSMOS_TINY  # noqa: E402
from wfm_jax.models.cosmos import CosmosTransformer  # noqa: E402

# 3 blocks, T = 2 latent frames, non-square latents, no padding-mask channel in one variant
C_CFG = dict(COSMOS_TINY, num_layers=3)
CT, CH, CW, CL = 2, 4, 6, 5


def _abstract_cosmos(cfg, lora_rank: int = 0):
    def make():
        m = CosmosTransformer(cfg, rngs=nnx.Rngs(0))
        if lora_rank:
            attach_lora(m, COSMOS_LORA_TARGETS, lora_rank, 2.0 * lora_rank)
        return m
    return abstract_module(make)


def _cosmos_call(cfg):
    """The family's call: per-frame sigma (B, 1, T, 1, 1) and a zero condition mask."""
    x = jnp.zeros((B, cfg["out_channels"], CT, CH, CW), jnp.float32)
    t = jnp.full((B, 1, CT, 1, 1), 0.5, jnp.float32)
    text = jnp.zeros((B, CL, cfg["crossattn_proj_in_channels"]), jnp.float32)
    mask = jnp.zeros((B, 1, CT, CH, CW), jnp.float32)
    return lambda model: model(x, t, text, condition_mask=mask)


@pytest.mark.parametrize("variant", ["base", "lora", "no_proj"])
def test_cosmos_forward_flops_match_jaxpr(variant):
    cfg = dict(C_CFG, use_crossattn_projection=False, crossattn_proj_in_channels=16) \
        if variant == "no_proj" else C_CFG
    rank = 4 if variant == "lora" else 0
    graph, state = nnx.split(_abstract_cosmos(cfg, rank))
    call = _cosmos_call(cfg)
    got = _jaxpr_flops(lambda s: call(nnx.merge(graph, s)), state)
    want = flops.cosmos_forward(cfg, CT, CH, CW, CL)["total"]
    if rank:
        want += flops.cosmos_lora_forward(cfg, CT, CH, CW, CL, COSMOS_LORA_TARGETS, rank)
    assert got == B * want


def test_cosmos_full_finetune_flops_match_autodiff():
    graph, params, rest = nnx.split(_abstract_cosmos(C_CFG), nnx.Param, ...)
    call = _cosmos_call(C_CFG)

    def loss(p, r):
        return jnp.mean(call(nnx.merge(graph, p, r)).astype(jnp.float32) ** 2)

    got = _jaxpr_flops(jax.grad(loss), params, rest)
    fwd = flops.cosmos_forward(C_CFG, CT, CH, CW, CL)
    want = flops.train_step_from(fwd, None, fwd["outside_blocks"], B)
    assert got == want["autodiff"]
    lora = flops.cosmos_lora_forward(C_CFG, CT, CH, CW, CL, COSMOS_LORA_TARGETS, 4)
    graph, adapters, rest = nnx.split(_abstract_cosmos(C_CFG, 4), nnx.LoRAParam, ...)
    got = _jaxpr_flops(jax.grad(lambda p, r: jnp.mean(call(nnx.merge(graph, p, r)) ** 2)),
                       adapters, rest)
    want = flops.train_step_from(fwd, lora, fwd["outside_blocks"], B)
    assert want["forward"] < got <= want["model"]


def test_cosmos_suites_shapes():
    """The real suite is the NFT recipe's shape: 93 x 512^2 -> 24 x 64 x 64 latents, 24,576
    tokens, 512 Reason1 tokens of crossattn_proj's width; LoRA on the recipe's targets."""
    from wfm_jax.config.schema import COSMOS_LORA_TARGETS as recipe_targets
    from wfm_jax.models.cosmos import COSMOS25_PREDICT_2B
    s = get_suite("cosmos_gpu").shapes()
    assert s["transformer"]["num_layers"] == COSMOS25_PREDICT_2B["num_layers"]
    assert (s["video_frames"], s["image_size"], s["latent"]) == (93, 512, [16, 24, 64, 64])
    assert s["tokens"] == 24 * 32 * 32 and s["text_len"] == 512
    assert s["text_width"] == COSMOS25_PREDICT_2B["crossattn_proj_in_channels"]
    assert tuple(s["lora_targets"]) == tuple(recipe_targets)
    assert (s["lora_rank"], s["lora_alpha"], s["train_batch"]) == (32, 64.0, 1)
    assert "family" not in get_suite("gpu").shapes()  # the SD3 JSON keeps its keys


def test_cosmos_xla_memory_compiles_on_a_mesh():
    """The abstract compile behind --xla-memory, on the tiny shape: fsdp splits the weights
    (2 devices where there are several: the 8-device partitioning costs compile time only)."""
    from wfm_jax.bench import xla_memory
    n = min(len(jax.devices()), 2)
    rec = xla_memory.compile_step(get_suite("cosmos_tiny"), "full", Options(), devices=n)
    model = _abstract_cosmos(COSMOS_TINY)
    total = sum(x.size * 4 for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert rec["mesh"]["fsdp"] == n and rec["global_batch"] == 2 * n
    assert rec["params_bytes"] <= total and rec["params_bytes"] * n >= total
    if n > 1:
        assert rec["params_bytes"] < total
    # AdamW mu, nu in fp32 like the params, plus replicated step counts
    assert 2 * rec["params_bytes"] <= rec["optimizer_bytes"] < 2 * rec["params_bytes"] + 64
    for key in ("argument_bytes", "temp_bytes", "output_bytes", "plan_bytes"):
        assert isinstance(rec[key], int) and rec[key] > 0, key


@pytest.fixture(scope="module")
def cosmos_tiny_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "cosmos.json"
    result = runner.run_suite(get_suite("cosmos_tiny"),
                              only=("train_full", "train_lora", "rollout"))
    report.write(result, str(out))
    return json.loads(out.read_text()), out.with_suffix(".md").read_text()


@pytest.mark.slow
def test_cosmos_tiny_suite_both_stacks(cosmos_tiny_result):
    """Every figure for both stacks; same weights and inputs: the same trained parameter count,
    the same first loss (to bf16 precision) and the same decoded rollout (mean)."""
    result, md = cosmos_tiny_result
    assert result["shapes"]["family"] == "cosmos"
    assert set(result["workloads"]) == {"train_full", "train_lora", "rollout"}
    for name, w in result["workloads"].items():
        assert set(w["stacks"]) == {"wfm_jax", "torch"}, name
        for stack, rec in w["stacks"].items():
            assert rec["status"] == "ok", (name, stack, rec.get("error"))
            _check_figures(rec)
            assert "Cosmos" in rec["impl"], rec["impl"]
        assert name in md
        assert w["flops"]["forward_per_sample"]["total"] > 0
    for name in ("train_full", "train_lora"):
        s = result["workloads"][name]["stacks"]
        assert s["wfm_jax"]["trained_params"] == s["torch"]["trained_params"], name
        np.testing.assert_allclose(s["wfm_jax"]["first_loss"], s["torch"]["first_loss"], rtol=5e-2)
    r = result["workloads"]["rollout"]["stacks"]
    np.testing.assert_allclose(r["wfm_jax"]["output_mean"], r["torch"]["output_mean"], atol=2e-2)


def test_train_batch_draws_sigmas_from_each_familys_own_training_table():
    """Both stacks train on the sigmas the family's SFT draws: SD3 its shifted table, Cosmos its
    own range inside the Karras sampler's [0.0099, 0.995] (never SD3's sigma 1)."""
    from wfm_jax.bench.inputs import SHIFT, train_batch
    from wfm_jax.sampling.schedule import training_table
    sd3 = train_batch(get_suite("tiny", train_batch=64))
    assert set(sd3["sigmas"].tolist()) <= set(training_table(SHIFT)[1].tolist())
    suite = get_suite("cosmos_tiny", train_batch=64)
    cosmos = train_batch(suite)
    table_t, table_s = suite.workload.pipeline(suite).train_sigma_table(SHIFT)
    assert set(cosmos["sigmas"].tolist()) <= set(table_s.tolist())
    assert cosmos["sigmas"].min() > 0.0099 and cosmos["sigmas"].max() < 0.996
    np.testing.assert_array_equal(cosmos["timesteps"], np.float32(1000) * cosmos["sigmas"])


def test_time_back_to_back_syncs_once_after_every_call():
    calls, synced = [], []
    per_call = timing.time_back_to_back(lambda: calls.append(1) or len(calls), synced.append,
                                        repeats=4)
    assert len(calls) == 4 and synced == [4]  # one wait, on the last call's result
    assert isinstance(per_call, float) and per_call >= 0.0


def test_gpu_suite_unrolls_as_its_recipe_trains():
    """The gpu suite times SD3.5-M with its blocks unrolled, as configs/sd35_sft.py trains it
    (faster and smaller on an H200); --scan-layers still decides, and a suite that says nothing
    keeps the model class's default."""
    from wfm_jax.bench import jax_side
    gpu, tiny = get_suite("gpu"), get_suite("tiny")
    assert jax_side.bench_recipe(gpu, "full", Options()).policy.scan_layers is False
    assert jax_side.bench_recipe(gpu, "full", Options(scan_layers=True)).policy.scan_layers is True
    assert Options().scan_layers_for(tiny) is None
    assert Options(scan_layers=False).scan_layers_for(tiny) is False


@pytest.mark.slow
def test_tiny_full_step_unrolled_on_request(tiny_result):
    """--scan-layers off builds the SD3 blocks unrolled (the model's default is scanned, as the
    shared tiny run records); both record the back-to-back step next to the waited one, and the
    unrolled step trains the same numbers (same weights, same batch: same first loss)."""
    result = runner.run_suite(get_suite("tiny"), only=["train_full"], stacks=("wfm_jax",),
                              options=Options(scan_layers=False))
    rec = result["workloads"]["train_full"]["stacks"]["wfm_jax"]
    scanned = tiny_result[0]["workloads"]["train_full"]["stacks"]["wfm_jax"]
    assert rec["status"] == "ok", rec.get("error")
    assert (rec["scan_layers"], scanned["scan_layers"]) == (False, True)
    for r in (rec, scanned):
        assert isinstance(r["step_time_back_to_back_s"], float) and r["step_time_back_to_back_s"] > 0
    assert rec["first_loss"] == pytest.approx(scanned["first_loss"], rel=1e-5, abs=1e-6)
