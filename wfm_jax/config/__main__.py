"""`python -m wfm_jax.config --config RECIPE`: prints the resolved recipe (wfm_jax/config/recipe.py)."""
import sys

from wfm_jax.config.recipe import main

sys.exit(main())
