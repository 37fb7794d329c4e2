"""The planner's cache of compiled programs' figures (plan/stats_cache.py): a second plan of the
same recipe compiles nothing and reports the same figures; a change to the program, the compiler
flags or the target is a miss; a torn entry is a miss written over; --no-cache and
WFM_JAX_PLAN_CACHE=off neither read nor write."""
from __future__ import annotations

import json
import os

import pytest

from wfm_jax import plan as plan_lib
from wfm_jax.plan import stats_cache


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory):
    from wfm_jax.families.tiny import build_tiny_pipeline
    return build_tiny_pipeline(str(tmp_path_factory.mktemp("cache") / "tiny_sd3"), seed=0)


def _plan(sd3_dir, *extra) -> tuple[dict, list]:
    """The plan of tiny SFT on 2 CPU devices, and the programs it compiled (jax's in-process
    cache can hand back an executable without an XLA compile, so the planner's compile calls
    are what is counted)."""
    from wfm_jax.programs import stats
    args = plan_lib.parse_args(["--config", "configs/tiny_sft.py", "--devices", "2",
                                f"--config.policy.model_name_or_path={sd3_dir}",
                                "--config.policy.parallelism.data=2", "--batch-per-device", "2",
                                "--config.train.compute_dtype=float32", *extra])
    compiled, real = [], stats.compile_lowered

    def counted(lowering, analyze_hlo=None):
        compiled.append(lowering)
        return real(lowering, analyze_hlo)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stats, "compile_lowered", counted)
        return plan_lib.plan(args), compiled


def _figures(r: dict) -> dict:
    return {name: {k: v for k, v in p.items() if k not in ("cached", "compile_seconds")}
            for name, p in r["programs"].items()}


def test_a_second_plan_compiles_nothing_and_reports_the_same(sd3_dir, tmp_path):
    cache = str(tmp_path / "cache")
    first, compiled = _plan(sd3_dir, "--cache-dir", cache)
    assert compiled and all(p["cached"] is False for p in first["programs"].values())
    entries = sorted(os.listdir(cache))
    assert len(entries) == len(first["programs"]) and all(e.endswith(".json") for e in entries)
    second, recompiled = _plan(sd3_dir, "--cache-dir", cache)
    assert len(compiled) == len(first["programs"]) and recompiled == []
    assert all(p["cached"] is True for p in second["programs"].values())
    assert _figures(second) == _figures(first)
    for name, p in second["programs"].items():  # the compile that made the figures
        assert p["compile_seconds"] == first["programs"][name]["compile_seconds"], name
    assert sorted(os.listdir(cache)) == entries
    # another batch is another program: compiled and added, the old entries kept
    third, _ = _plan(sd3_dir, "--cache-dir", cache, "--config.train.train_batch_per_replica=8",
                     "--batch-per-device", "4")
    assert third["programs"]["step"]["cached"] is False
    assert third["programs"]["step"]["temp_bytes"] != first["programs"]["step"]["temp_bytes"]
    assert set(entries) < set(os.listdir(cache))


def test_a_torn_entry_is_a_miss_and_is_written_over(sd3_dir, tmp_path):
    cache = str(tmp_path / "cache")
    first, _ = _plan(sd3_dir, "--cache-dir", cache, "--no-validation")
    (entry,) = os.listdir(cache)
    with open(os.path.join(cache, entry), "w") as f:
        f.write('{"format": 1, "result": {"temp')  # a write cut short
    again, compiled = _plan(sd3_dir, "--cache-dir", cache, "--no-validation")
    assert len(compiled) == 1 and again["programs"]["step"]["cached"] is False
    assert _figures(again) == _figures(first)
    with open(os.path.join(cache, entry)) as f:
        assert json.load(f)["result"]["temp_bytes"] == first["programs"]["step"]["temp_bytes"]


def test_off_neither_reads_nor_writes(sd3_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(stats_cache.CACHE_ENV, raising=False)
    assert stats_cache.default_dir() == str(tmp_path / "xdg" / "wfm_jax" / "plan")
    r, _ = _plan(sd3_dir, "--no-cache", "--no-validation")
    assert r["programs"]["step"]["cached"] is False and not (tmp_path / "xdg").exists()
    monkeypatch.setenv(stats_cache.CACHE_ENV, "off")
    assert stats_cache.default_dir() is None
    _plan(sd3_dir, "--no-validation")
    assert not (tmp_path / "xdg").exists()


def test_the_key_follows_the_flags_and_the_target(monkeypatch):
    """XLA_FLAGS / LIBTPU_INIT_ARGS change what the compiler makes: each value its own key; so
    do the devices compiled for and whether the optimized HLO was read."""
    import jax
    import jax.numpy as jnp

    from wfm_jax.core.mesh import make_mesh, mesh_jit
    from wfm_jax.programs.stats import lower_program

    x = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    cache = stats_cache.StatsCache("unused")
    keys = set()
    for devices in (1, 2):
        fn = mesh_jit(lambda a: a @ a, mesh=make_mesh(devices=jax.devices()[:devices]))
        lowering = lower_program(fn, x)
        keys |= {cache.key(lowering, False), cache.key(lowering, True)}
        for env in ("XLA_FLAGS", "LIBTPU_INIT_ARGS"):
            monkeypatch.setenv(env, os.environ.get(env, "") + " --xla_some_flag=1")
            keys.add(cache.key(lowering, False))
            monkeypatch.undo()
    assert len(keys) == 8
    again = lower_program(mesh_jit(lambda a: a @ a, mesh=make_mesh(devices=jax.devices()[:1])), x)
    assert cache.key(again, False) in keys  # the same program on the same target: the same key


def test_a_cache_that_cannot_be_written_is_said_and_the_plan_goes_on(sd3_dir, tmp_path, capsys):
    blocked = tmp_path / "a_file"
    blocked.write_text("not a directory")
    r, compiled = _plan(sd3_dir, "--cache-dir", str(blocked), "--no-validation")
    assert r["programs"]["step"]["compiled"] and len(compiled) == 1
    err = capsys.readouterr().err
    assert f"wfm_jax.plan: not kept in the plan cache {blocked}: " in err
    assert blocked.read_text() == "not a directory"
