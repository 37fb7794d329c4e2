"""`python -m wfm_jax.tiny`: tiny pipelines for tests and the embedded recipes (wfm_jax/cli/tiny.py)."""
import sys

from wfm_jax.cli.tiny import main

if __name__ == "__main__":
    sys.exit(main())
