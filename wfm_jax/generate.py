"""`python -m wfm_jax.generate`: the generation CLI (wfm_jax/cli/generate.py)."""
import sys

from wfm_jax.cli.generate import main

if __name__ == "__main__":
    sys.exit(main())
