"""One line on the console per run event (tiny assets built, resumed, checkpoint saved or
removed, export written, sample skipped), printed above the progress bar instead of through it.
metrics.jsonl keeps the numbers; these lines say what happened."""
from __future__ import annotations

import sys


def say(message: str, every_process: bool = False) -> None:
    """Print `message` on process 0 (on every process with every_process: e.g. each reads its
    own data shard)."""
    if not every_process:
        import jax
        if jax.process_index() != 0:
            return
    from tqdm.auto import tqdm
    tqdm.write(message, file=sys.stdout)  # clears and redraws an active bar around the line
    sys.stdout.flush()
