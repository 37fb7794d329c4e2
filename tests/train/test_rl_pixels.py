"""The rollout's images become uint8 on the device with exactly the host rounding."""
import jax.numpy as jnp
import numpy as np

from wfm_jax.io.media import to_uint8
from wfm_jax.programs.rl import pixels_to_uint8


def test_device_uint8_matches_the_host_conversion():
    rng = np.random.default_rng(0)
    halves = (np.arange(256, dtype=np.float32) + 0.5) / 255  # exact .5 ties after * 255
    x = np.concatenate([rng.uniform(-0.2, 1.2, 4096).astype(np.float32), halves])
    np.testing.assert_array_equal(np.asarray(pixels_to_uint8(jnp.asarray(x))), to_uint8(x))
    assert pixels_to_uint8(jnp.asarray(x, jnp.bfloat16)).dtype == jnp.uint8
