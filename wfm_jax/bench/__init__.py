"""Side-by-side benchmark of wfm_jax and the PyTorch diffusers (+ peft) stack.

    python -m wfm_jax.bench --suite cpu|gpu [--out results.json] [--only NAME ...]

Modules: suites (shapes), weights / inputs (identical weights and data for both stacks),
jax_side (programs' SFT step) / rollout (wfm_jax), torch_side (diffusers + peft), reward_rt
(reward round trips), flops (analytic FLOP counts), devices (peaks, memory, environment), timing, report, runner.
"""
