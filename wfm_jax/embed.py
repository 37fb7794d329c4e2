"""`python -m wfm_jax.embed`: precomputes prompt embeddings (wfm_jax/cli/embed.py)."""
import sys

from wfm_jax.cli.embed import main

if __name__ == "__main__":
    sys.exit(main())
