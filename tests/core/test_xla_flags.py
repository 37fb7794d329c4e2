"""The GPU overlap flags are added to XLA_FLAGS without overriding what the user set; a host
with libtpu installed and no TPU or GPU runs on the CPU without starting the TPU plugin (whose
warnings buried the CLI's one-line errors: tests/train/test_s3_checkpoints.py's credentials
test runs the real CLI on such a host)."""
import pytest
from jax._src import hardware_utils

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


def _host(monkeypatch, tpus=0, gpu=False):
    monkeypatch.setattr(hardware_utils, "num_available_tpu_chips_and_device_id",
                        lambda: (tpus, None))
    monkeypatch.setattr(hardware_utils, "has_visible_nvidia_gpu", lambda: gpu)


def test_no_accelerator_means_the_cpu(monkeypatch):
    _host(monkeypatch)
    env: dict = {}
    assert xla_flags.skip_absent_tpu(env) and env == {"JAX_PLATFORMS": "cpu"}


@pytest.mark.parametrize("host", [dict(tpus=4), dict(gpu=True)])
def test_accelerators_and_the_users_choice_are_left_alone(monkeypatch, host):
    _host(monkeypatch, **host)
    env: dict = {}
    assert not xla_flags.skip_absent_tpu(env) and env == {}
    _host(monkeypatch)
    env = {"JAX_PLATFORMS": "tpu"}
    assert not xla_flags.skip_absent_tpu(env) and env == {"JAX_PLATFORMS": "tpu"}

