"""Inputs the SANA1.5 and SANA-Video transformer tests share."""
from __future__ import annotations

import numpy as np

TEXT_LEN = 7
TIMESTEPS = np.array([999, 517], np.int64)  # what the pipelines feed: int64 ~ 1000 sigma
# right-padded Gemma masks of different lengths (padding_side="right")
MASK = np.array([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0]], np.int64)
