import sys

from wfm_jax.plan.cli import main

sys.exit(main())
