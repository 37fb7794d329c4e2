"""The two ceilings METHOD-style measurements need on a GPU: the best dense bf16 matmul rate and
device-to-device copy bandwidth, through jax (the stack under test) and torch. Random data (zeros
run faster on some parts), warm-up first, median of 10 timed runs. Prints one JSON line."""
import json
import statistics
import time

import jax
import jax.numpy as jnp


def _median_s(fn, n=10):
    fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    out = {"device": jax.devices()[0].device_kind}
    n = 8192
    k = jax.random.split(jax.random.key(0), 2)
    a = jax.random.normal(k[0], (n, n), jnp.bfloat16)
    b = jax.random.normal(k[1], (n, n), jnp.bfloat16)
    mm = jax.jit(lambda x, y: x @ y)
    out["jax_bf16_matmul_tflops"] = 2 * n ** 3 / _median_s(lambda: mm(a, b).block_until_ready()) / 1e12
    x = jax.random.normal(k[0], (1 << 30,), jnp.float32)  # 4 GiB
    cp = jax.jit(lambda v: v + 1.0)
    out["jax_copy_tb_s"] = 2 * x.nbytes / _median_s(lambda x=x: cp(x).block_until_ready()) / 1e12
    del x
    try:
        import torch
        ta = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        tb = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)

        def tmm():
            ta @ tb
            torch.cuda.synchronize()
        out["torch_bf16_matmul_tflops"] = 2 * n ** 3 / _median_s(tmm) / 1e12
    except Exception as e:  # torch is optional here
        out["torch_error"] = str(e)[:200]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
