"""The cost model's step time of a program with loops (topology.estimate, plan/hlo_cost.py).
XLA's `optimal_seconds` counts every while body once. The estimate multiplies it by the HLO's
loop factor: each loop body x its trip count, the rest of the program once. The old correction
scaled the whole program by jaxpr FLOPs / XLA FLOPs, which multiplied the non-loop part (an
optimizer sweep, memory-bound, no FLOPs) by the loop's trip count too.

Without libtpu: the HLO reading on a hand-written module (trip counts, a loop it cannot count,
what a fusion reads of a stacked operand, tiled bytes, the batched-matmul convolution). With
libtpu (skipped otherwise; seconds each): a stack of layers compiled for v5p:2x2x1 scanned and
unrolled gives estimates within 10% of each other (measured 2026-11-27: -4.7% forward, +3.6%
forward and backward, -7.2% beside a large non-loop sweep, which the old correction
over-states 5.9x)."""
from __future__ import annotations

import pytest

from wfm_jax.plan import hlo_cost, topology

pytestmark = pytest.mark.compile_bound  # its time is compiling: CPU programs at LLVM -O0 (tests/_support/xla.py)

MM, HBM = topology.COST_MODEL_RATES["TPU v5"]

_TUPLE = "(s32[]{:T(128)}, bf16[1024,1024]{1,0:T(8,128)(2,1)}, bf16[8,1024,1024]{2,1,0:T(8,128)(2,1)})"
# a scan of 8 matmuls over stacked weights, and beside it a sweep over 2^26 f32 (an optimizer's)
_MODULE = f"""HloModule jit_step, is_scheduled=true, entry_computation_layout={{()->()}}

%fused_mm (param_0: bf16[1024,1024], param_1: bf16[8,1024,1024], param_2: s32[]) -> bf16[1024,1024] {{
  %param_1 = bf16[8,1024,1024]{{2,1,0:T(8,128)(2,1)}} parameter(1)
  %param_2 = s32[]{{:T(128)}} parameter(2)
  %constant.0 = s32[]{{:T(128)}} constant(0)
  %dynamic-slice.0 = bf16[1,1024,1024]{{2,1,0:T(8,128)(2,1)}} dynamic-slice(%param_1, %param_2, %constant.0, %constant.0), dynamic_slice_sizes={{1,1024,1024}}
  %bitcast.0 = bf16[1024,1024]{{1,0:T(8,128)(2,1)}} bitcast(%dynamic-slice.0)
  %param_0 = bf16[1024,1024]{{1,0:T(8,128)(2,1)}} parameter(0)
  ROOT %convolution.0 = bf16[1024,1024]{{1,0:T(8,128)(2,1)}} convolution(%param_0, %bitcast.0), dim_labels=bf_io->bf
}}

%body (p: (s32[], bf16[1024,1024], bf16[8,1024,1024])) -> (s32[], bf16[1024,1024], bf16[8,1024,1024]) {{
  %p = {_TUPLE} parameter(0)
  %i = s32[]{{:T(128)}} get-tuple-element(%p), index=0
  %x = bf16[1024,1024]{{1,0:T(8,128)(2,1)}} get-tuple-element(%p), index=1
  %w = bf16[8,1024,1024]{{2,1,0:T(8,128)(2,1)}} get-tuple-element(%p), index=2
  %one = s32[]{{:T(128)}} constant(1)
  %next = s32[]{{:T(128)}} add(%i, %one)
  %y = bf16[1024,1024]{{1,0:T(8,128)(2,1)}} fusion(%x, %w, %i), kind=kOutput, calls=%fused_mm
  %y.copy = bf16[1024,1024]{{1,0:T(8,128)(2,1)}} copy(%y)
  ROOT %t = {_TUPLE} tuple(%next, %y.copy, %w)
}}

%cond (p.1: (s32[], bf16[1024,1024], bf16[8,1024,1024])) -> pred[] {{
  %p.1 = {_TUPLE} parameter(0)
  %i.1 = s32[]{{:T(128)}} get-tuple-element(%p.1), index=0
  %n = s32[]{{:T(128)}} constant(8)
  ROOT %lt = pred[]{{:T(512)}} compare(%i.1, %n), direction=LT
}}

%fused_update (param_0.1: f32[67108864]) -> f32[67108864] {{
  %param_0.1 = f32[67108864]{{0:T(1024)}} parameter(0)
  %half = f32[]{{:T(128)}} constant(0.5)
  %b = f32[67108864]{{0:T(1024)}} broadcast(%half), dimensions={{}}
  ROOT %m = f32[67108864]{{0:T(1024)}} multiply(%param_0.1, %b)
}}

ENTRY %main (x.0: bf16[1024,1024], w.0: bf16[8,1024,1024], big: f32[67108864], start: s32[]) -> (bf16[1024,1024], f32[67108864]) {{
  %x.0 = bf16[1024,1024]{{1,0:T(8,128)(2,1)}} parameter(0)
  %w.0 = bf16[8,1024,1024]{{2,1,0:T(8,128)(2,1)}} parameter(1)
  %big = f32[67108864]{{0:T(1024)}} parameter(2)
  %start = s32[]{{:T(128)}} parameter(3)
  %zero = s32[]{{:T(128)}} constant(0)
  %zero.copy = s32[]{{:T(128)}} copy(%zero)
  %init = {_TUPLE} tuple(%zero.copy, %x.0, %w.0)
  %loop = {_TUPLE} while(%init), condition=%cond, body=%body
  %out = bf16[1024,1024]{{1,0:T(8,128)(2,1)}} get-tuple-element(%loop), index=1
  %upd = f32[67108864]{{0:T(1024)}} fusion(%big), kind=kLoop, calls=%fused_update
  ROOT %r = (bf16[1024,1024]{{1,0:T(8,128)(2,1)}}, f32[67108864]{{0:T(1024)}}) tuple(%out, %upd)
}}
"""
# one iteration: 2 x 1024^3 matmul FLOPs; reads x and one block of the stacked weights (a
# dynamic slice: 2 MiB, not the 16 MiB stack), writes 2 MiB; the copy keeps its layout (a DMA)
_ITER = max(2 * 1024 ** 3 / MM, 3 * 2 * 1024 * 1024 / HBM)
_SWEEP = 2 * 4 * 2 ** 26 / HBM  # read and write 2^26 f32


def test_loop_bodies_count_once_per_trip_and_the_rest_once():
    r = hlo_cost.analyze(_MODULE, MM, HBM)
    assert [(x["trips"], x["runs"], x["nested"]) for x in r["loops"]] == [(8, 8.0, 0)]
    assert r["unknown_loops"] == 0
    assert r["loop_factor"] == pytest.approx((8 * _ITER + _SWEEP) / (_ITER + _SWEEP))
    assert r["loops"][0]["share"] == pytest.approx(_ITER / (_ITER + _SWEEP))
    assert r["flops_once"] == 2 * 1024 ** 3 and r["flops"] == 8 * 2 * 1024 ** 3


def test_the_breakdown_says_which_instructions_bound_the_time():
    """The loop's matmul, 8 runs at the matmul rate (1024^3 x 2 FLOPs against 6 MiB moved), and
    the sweep, once at the HBM rate: the two kinds and the top rows add up to the roofline."""
    r = hlo_cost.analyze(_MODULE.replace("kind=kLoop, calls=%fused_update",
                                         'kind=kLoop, calls=%fused_update, metadata={op_name='
                                         '"jit(step)/adam/mul" source_file="/x/wfm_jax/train/'
                                         'optim.py" source_line=12}'), MM, HBM)
    b = r["breakdown"]
    assert 2 * 1024 ** 3 / MM > 3 * 2 * 1024 * 1024 / HBM  # the matmul is compute-bound here
    assert b["seconds_by_kind"] == pytest.approx({"matmul": 8 * _ITER, "memory": _SWEEP})
    assert sum(b["share_by_kind"].values()) == pytest.approx(1.0)
    top = {row["name"]: row for row in b["top"]}
    assert top["y"]["kind"] == "matmul" and top["y"]["runs"] == 8
    assert top["y"]["seconds"] == pytest.approx(8 * _ITER)
    assert top["upd"]["kind"] == "memory" and top["upd"]["op_name"] == "jit(step)/adam/mul"
    assert top["upd"]["type"] == "f32[67108864]" and top["upd"]["runs"] == 1
    assert top["upd"]["source"] == "train/optim.py:12"
    assert {"kind": "memory", "source": "train/optim.py:12", "seconds": pytest.approx(_SWEEP),
            "share": pytest.approx(_SWEEP / (8 * _ITER + _SWEEP))} in b["top_sources"]
    # a matmul that moves more than it computes is held back by its bytes
    slow = hlo_cost.analyze(_MODULE, MM, HBM / 1000)["breakdown"]
    assert {row["name"]: row["kind"] for row in slow["top"]}["y"] == "matmul_memory_bound"


def test_a_large_non_loop_part_is_not_multiplied_by_the_loop():
    """The estimate: optimal_seconds x the HLO's loop factor (1.19 here), where the old FLOP
    ratio (8: every FLOP is in the loop) multiplied the sweep by 8 as well."""
    hlo = hlo_cost.analyze(_MODULE, MM, HBM)
    seconds = _ITER + _SWEEP  # what the cost model says, loop body once
    stats = {"flops": 4 * 8 * 2 * 1024 ** 3, "xla_flops_per_device": 2 * 1024 ** 3,
             "optimal_seconds": seconds, "hlo": hlo}
    e = topology.estimate(stats, devices=4, peak_flops=459e12)
    assert e["estimate_method"] == "hlo_loops" and "estimate_note" not in e
    assert e["estimated_step_seconds"] == pytest.approx(8 * _ITER + _SWEEP)
    assert e["loop_scale"] == pytest.approx(1.19, abs=0.01)
    assert e["estimated_mfu"] == pytest.approx(8 * 2 * 1024 ** 3 / ((8 * _ITER + _SWEEP) * 459e12))
    old = topology.estimate(dict(stats, hlo=None), devices=4, peak_flops=459e12)
    assert old["estimate_method"] == "flop_ratio" and old["loop_scale"] == 8
    assert old["estimated_step_seconds"] > 6 * e["estimated_step_seconds"]
    # an HLO the reader could not read: the FLOP ratio, said so
    e = topology.estimate(dict(stats, hlo={"error": "ValueError: x"}), 4, 459e12)
    assert e["estimate_method"] == "flop_ratio" and "not read" in e["estimate_note"]


def test_a_loop_of_unknown_trip_count_is_counted_once_and_said():
    # the counter starts at a parameter (a fori_loop from a traced bound): no trip count
    text = _MODULE.replace("tuple(%zero.copy, %x.0, %w.0)", "tuple(%start, %x.0, %w.0)")
    r = hlo_cost.analyze(text, MM, HBM)
    assert r["loops"][0]["trips"] is None and r["unknown_loops"] == 1
    assert r["loop_factor"] == pytest.approx(1.0)
    e = topology.estimate({"flops": 1.0, "xla_flops_per_device": 1.0, "optimal_seconds": 1.0,
                           "hlo": r}, 4, 459e12)
    assert "counted once" in e["estimate_note"]
    # the compiler's own count, where it writes one, is taken as it is
    known = text.replace("body=%body", 'body=%body, backend_config={"known_trip_count":{"n":"5"}}')
    assert hlo_cost.analyze(known, MM, HBM)["loops"][0]["trips"] == 5
    # the bound on the left: 8 > i
    flipped = _MODULE.replace("compare(%i.1, %n), direction=LT", "compare(%n, %i.1), direction=GT")
    assert hlo_cost.analyze(flipped, MM, HBM)["loops"][0]["trips"] == 8


def test_bytes_and_flops_as_the_tpu_compiler_writes_them():
    # tiles pad the minor dims: f32[4,4,384,8] with T(8,128) holds 128 lanes for each 8
    assert hlo_cost.type_bytes("f32[4,4,384,8]{3,2,1,0:T(8,128)}") == 4 * 4 * 384 * 128 * 4
    assert hlo_cost.type_bytes("f32[3,5]{0,1:T(8,128)}") == 128 * 8 * 4  # dim 0 is minor
    assert hlo_cost.type_bytes("(s32[], bf16[2,3])") == 4 + 12  # no layout: as written
    # a batched matmul over 24 heads written as a convolution whose head dim is a window of 24
    # padded by 23 on each side: one valid position per output, not 24 (SD3.5's attention grads)
    module = hlo_cost.parse("""HloModule m
ENTRY %main (a: bf16[4,1024,64,1], b: bf16[24,64,64,1]) -> bf16[4,1024,24,64] {
  %a = bf16[4,1024,64,1]{3,2,1,0} parameter(0)
  %b = bf16[24,64,64,1]{3,2,1,0} parameter(1)
  ROOT %c = bf16[4,1024,24,64]{3,1,2,0} convolution(%a, %b), window={size=1x24 pad=0_0x23_23 rhs_reversal=0x1}, dim_labels=0bf1_1oi0->0b1f
}
""")
    conv = module.computations["main"][-1]
    assert hlo_cost.matmul_flops(conv, module) == 2 * 4 * 1024 * 24 * 64 * 64


def _kernel_module(name: str, config: str) -> str:
    return f"""HloModule jit_k, entry_computation_layout={{()->()}}

ENTRY %main (p0: f32[2,2,256,64], p1: f32[2,2,384,64]) -> f32[2,2,256,64] {{
  %p0 = f32[2,2,256,64]{{3,2,1,0}} parameter(0)
  %p1 = f32[2,2,384,64]{{3,2,1,0}} parameter(1)
  ROOT %{name} = f32[2,2,256,64]{{3,2,1,0}} custom-call(%p0, %p1), custom_call_target="tpu_custom_call", backend_config={config}
}}
"""


def test_undeclared_kernels_by_name_and_the_rest_said():
    """A flash backward kernel's FLOPs from its Q and K operands; a kernel that declares its cost
    is left to it; an unknown undeclared kernel is counted, and the estimate says it is low."""
    body = '{"custom_call_config":{"body":"TUzv"}}'
    dq = hlo_cost.analyze(_kernel_module("flash_mha_bwd_dq_block_q_major_128.1", body), MM, HBM)
    assert dq["kernel_flops"] == 6 * 2 * 2 * 256 * 384 * 64 and dq["undeclared_kernels"] == 0
    assert dq["kernel_seconds"] == pytest.approx(dq["kernel_flops"] / MM)
    declared = '{"custom_call_config":{"body":"TUzv","cost_estimate":{"flops":100}}}'
    assert hlo_cost.analyze(_kernel_module("flash_mha_bwd_dq.2", declared), MM, HBM)[
        "kernel_flops"] == 0
    other = hlo_cost.analyze(_kernel_module("my_kernel.1", body), MM, HBM)
    assert other["kernel_flops"] == 0 and other["undeclared_kernels"] == 1
    stats = {"flops": 4e9, "optimal_seconds": 1e-3, "xla_flops_per_device": 1e9, "hlo": other}
    e = topology.estimate(stats, 1, 459e12)
    assert "1 Pallas kernel call(s) that declare no cost" in e["estimate_note"]


@pytest.fixture(scope="module")
def v5p():
    pytest.importorskip("libtpu", reason="libtpu (the TPU compiler) is not installed: "
                                         "pip install 'jax[tpu]==0.10.2'")
    import jax
    devices, topo = topology.topology_devices("v5p:2x2x1")
    mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=devices)
    return mesh, topo


def test_flash_attention_backward_kernels_are_costed_on_v5p(v5p):
    """jax's flash attention declares the cost of its forward kernel only, so XLA's FLOPs and
    seconds hold nothing of the backward's two kernels (dK/dV, dQ: 14 FLOPs per batch x head x
    query x key x head dim, against the forward's 4). The HLO reading counts them from their
    operands (padded to the kernel's 128-row blocks) and the estimate adds their matmul time."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from wfm_jax.core.mesh import MeshJit
    from wfm_jax.models.layers.pallas_attention import pallas_tpu_attention
    from wfm_jax.programs.stats import compile_stats
    mesh, topo = v5p
    b, t, s, n, h = 2, 200, 300, 2, 64  # queries pad to 256, keys to 384 (a padded segment)

    def grads(q, k, v):
        return jax.grad(lambda *a: jnp.sum(pallas_tpu_attention(*a).astype(jnp.float32) ** 2),
                        argnums=(0, 1, 2))(q, k, v)
    chip = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=mesh.devices.flat[:1])
    args = [jax.ShapeDtypeStruct((b, m, n, h), jnp.bfloat16, sharding=NamedSharding(chip, P()))
            for m in (t, s, s)]
    stats = compile_stats(MeshJit(grads, chip), *args,
                          analyze_hlo=topology.hlo_reader(chip.devices.flat[0]))
    hlo = stats["hlo"]
    backward = 14 * b * n * 256 * 384 * h
    assert hlo["kernel_flops"] == backward and hlo["undeclared_kernels"] == 0
    assert hlo["kernel_seconds"] == pytest.approx(backward / MM)
    assert stats["xla_flops_per_device"] < backward / 3  # the forward's 4 and little else
    e = topology.estimate(stats, 1, topo["peak_flops_per_device"])
    assert e["kernel_seconds"] == hlo["kernel_seconds"]
    assert e["estimated_step_seconds"] == pytest.approx(
        stats["optimal_seconds"] * e["loop_scale"] + hlo["kernel_seconds"])


def _stack_estimates(mesh, topo, layers: int, width: int, rows: int, sweep: int, backward: bool):
    """A stack of `layers` tanh(x @ w) layers (bf16, rows split over 4 v5p chips) beside an
    elementwise sweep over `sweep` f32 (the non-loop part), compiled scanned and unrolled:
    {scanned: (estimate, the FLOP-ratio estimate)}."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from wfm_jax.core.mesh import MeshJit
    from wfm_jax.programs.stats import compile_stats

    def program(scan: bool):
        def stack(ws, x):
            if scan:
                return jax.lax.scan(lambda c, w: (jnp.tanh(c @ w), None), x, ws)[0]
            for i in range(layers):
                x = jnp.tanh(x @ ws[i])
            return x

        def step(ws, x, big):
            if backward:
                out = jax.grad(lambda w: jnp.mean(stack(w, x).astype(jnp.float32) ** 2))(ws)
            else:
                out = stack(ws, x)
            return out, big * 0.5 + 1.0
        return MeshJit(step, mesh)
    args = (jax.ShapeDtypeStruct((layers, width, width), jnp.bfloat16,
                                 sharding=NamedSharding(mesh, P())),
            jax.ShapeDtypeStruct((rows, width), jnp.bfloat16,
                                 sharding=NamedSharding(mesh, P("data"))),
            jax.ShapeDtypeStruct((sweep,), jnp.float32, sharding=NamedSharding(mesh, P("data"))))
    reader = topology.hlo_reader(mesh.devices.flat[0])
    out = {}
    for scan in (True, False):
        stats = compile_stats(program(scan), *args, analyze_hlo=reader)
        assert stats["hlo"]["unknown_loops"] == 0
        # the trips are right: the HLO's matmul FLOPs x trips are the jaxpr's (per device)
        assert stats["hlo"]["flops"] == pytest.approx(stats["flops"] / 4, rel=0.05)
        e = topology.estimate(stats, 4, topo["peak_flops_per_device"])
        old = topology.estimate(dict(stats, hlo=None), 4, topo["peak_flops_per_device"])
        assert e["estimate_method"] == "hlo_loops"
        out[scan] = (e["estimated_step_seconds"], old["estimated_step_seconds"])
    return out


@pytest.mark.parametrize("sweep, backward", [(1024, False), (2 ** 28, False), (2 ** 26, True)],
                         ids=["forward", "forward+sweep", "backward+sweep"])
def test_scanned_and_unrolled_stacks_agree_on_v5p(v5p, sweep, backward):
    """Measured (scanned / unrolled - 1): forward -4.7%, beside a 1 GiB sweep -7.2%, forward and
    backward of 12 narrower layers beside a 256 MiB sweep +3.6%; the FLOP ratio's estimate of
    the scanned programs with a sweep: 5.9x and 6.9x the unrolled one's."""
    mesh, topo = v5p
    layers, width, rows = (12, 512, 2048) if backward else (8, 1024, 4096)
    est = _stack_estimates(mesh, topo, layers, width, rows, sweep, backward)
    (scanned, old), (unrolled, _) = est[True], est[False]
    assert scanned == pytest.approx(unrolled, rel=0.10)
    if sweep > 1024:  # the old correction multiplied the sweep by the loop's trip count
        assert old > 4 * unrolled


@pytest.mark.slow  # four small libtpu compiles of the tiny SD3 programs (~1-2 min on 2 loaded cores)
def test_tiny_sd3_scanned_and_unrolled_through_the_plan(tmp_path, capsys):
    """`python -m wfm_jax.plan --topology v5p:2x2x1` on the tiny SD3 at 4 blocks (3 scanned +
    the last), with and without --no-scan: every estimate from the HLO's loops, the loops read
    (the blocks' forward and backward scans, 3 trips each; the sampler's 40 steps around them),
    the HLO's FLOPs with their trips the same either way, and the sampler's estimates within 10%.
    Measured 2026-11-27 at 6 blocks (4 since 2026-11-28: 32 s alone against 47 s): the
    sampler's +2.5%; the steps are not the same program: the scanned one stacks every block's
    saved activations (temp 170 MB against 129 MB) and its HLO moves about half as many bytes
    again, so its estimate is +51% (the cost model's loop-once seconds and the roofline agree
    within 0.9-1.0x on both); that is said, not asserted."""
    pytest.importorskip("libtpu", reason="libtpu (the TPU compiler) is not installed")
    import json

    from tests.plan._tiny_sd3 import tiny_sd3_plan_argv
    from wfm_jax import plan as plan_lib
    argv = [*tiny_sd3_plan_argv(str(tmp_path / "tiny_sd3"), 4), "--topology", "v5p:2x2x1"]
    plans = {}
    for extra in ([], ["--no-scan"]):
        assert plan_lib.main([*argv, *extra, "--json"]) == 0
        r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert r["estimate_method"] == topology.ESTIMATE_METHOD
        for name, p in r["programs"].items():
            assert p["estimate_method"] == "hlo_loops", name
            assert p["estimated_step_seconds"] == pytest.approx(
                p["optimal_seconds"] * p["loop_scale"] + p.get("kernel_seconds", 0.0))
            assert p["hlo"]["unknown_loops"] == 0 and "estimate_note" not in p
        assert "by hlo_loops" in plan_lib.describe(r)
        plans[bool(extra)] = r["programs"]
    scanned, unrolled = plans[False], plans[True]
    assert [x["trips"] for x in scanned["step"]["hlo"]["loops"]] == [3, 3]
    assert unrolled["step"]["hlo"]["loops"] == [] and unrolled["step"]["loop_scale"] == 1
    assert [x["trips"] for x in scanned["sample"]["hlo"]["loops"]] == [3, 40]
    assert [(x["trips"], x["nested"]) for x in unrolled["sample"]["hlo"]["loops"]] == [(40, 0)]
    for name in ("step", "sample"):
        assert scanned[name]["hlo"]["flops"] == pytest.approx(unrolled[name]["hlo"]["flops"], rel=1e-6)
    assert scanned["sample"]["estimated_step_seconds"] == pytest.approx(
        unrolled["sample"]["estimated_step_seconds"], rel=0.10)


def test_stack_frames_name_the_source_lines_outside_installed_packages():
    """jax 0.10.2 writes `stack_frame_id=N` in an instruction's metadata and the frames in tables
    at the top of the module; a frame's parent_frame_id is the parent's id + 1 (0: none). The
    source is the innermost two frames outside site-packages (a kernel's caller, not its library)."""
    from wfm_jax.plan.hlo_breakdown import stack_sources
    tables = """FileNames
1 "/r/wfm_jax/models/layers/linear.py"
2 "/r/wfm_jax/models/layers/attention.py"
3 "/v/site-packages/jax/experimental/pallas/ops/tpu/flash_attention.py"
FunctionNames
1 "Linear.__call__"
2 "Attention.__call__"
3 "flash_attention"
FileLocations
1 {file_name_id=2 function_name_id=2 line=308 end_line=308 column=1 end_column=1}
2 {file_name_id=1 function_name_id=1 line=50 end_line=50 column=1 end_column=1}
3 {file_name_id=3 function_name_id=3 line=199 end_line=199 column=1 end_column=1}
StackFrames
1 {file_location_id=1 parent_frame_id=0}
2 {file_location_id=2 parent_frame_id=2}
3 {file_location_id=3 parent_frame_id=2}
"""
    frames = stack_sources(tables + _MODULE)
    assert frames == {1: "layers/attention.py:308",
                      2: "layers/linear.py:50 < layers/attention.py:308",
                      3: "layers/attention.py:308"}
    assert hlo_cost.parse(tables + _MODULE).frames == frames
