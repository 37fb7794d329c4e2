"""`python -m wfm_jax.main --config RECIPE`: train (wfm_jax/cli/main.py)."""
import sys

from wfm_jax.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
