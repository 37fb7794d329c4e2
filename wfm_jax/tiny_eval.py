"""`python -m wfm_jax.tiny_eval DIR`: the shapes world's score of a tiny pipeline (wfm_jax/cli/tiny.py)."""
import sys

from wfm_jax.cli.tiny import eval_main

if __name__ == "__main__":
    sys.exit(eval_main())
