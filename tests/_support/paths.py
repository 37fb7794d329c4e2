"""Where the repository's files are, for tests at any depth of tests/."""
from __future__ import annotations

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(REPO_ROOT, "configs")
TESTS = os.path.join(REPO_ROOT, "tests")
