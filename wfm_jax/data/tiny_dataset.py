"""`python -m wfm_jax.data.tiny_dataset DIR --count N`: draws the shapes world's dataset
(wfm_jax/worlds/shapes/dataset.py)."""
import sys

from wfm_jax.worlds.shapes.dataset import main

if __name__ == "__main__":
    sys.exit(main())
