"""The GPU overlap flags are added to XLA_FLAGS without overriding what the user set."""
from wfm_jax.core import xla_flags


def test_defaults_are_added_and_user_flags_win():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
                        "--xla_gpu_enable_latency_hiding_scheduler=false"}
    xla_flags.apply(env)
    flags = env["XLA_FLAGS"].split()
    assert flags[:2] == ["--xla_force_host_platform_device_count=8",
                         "--xla_gpu_enable_latency_hiding_scheduler=false"]
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" not in flags
    assert set(xla_flags.GPU_DEFAULTS[1:]) <= set(flags)
    xla_flags.apply(env)  # idempotent
    assert env["XLA_FLAGS"].split() == flags


def test_opt_out():
    env = {"WFM_JAX_XLA_DEFAULTS": "0"}
    xla_flags.apply(env)
    assert "XLA_FLAGS" not in env
