"""A separate virtualenv for torch oracles that need torchvision.

torchvision must never enter the project environment (importing it there breaks `import diffusers`),
but transformers' video processors (and its fast image processors) need it. So the tests build a venv
under a cache dir and run oracle scripts with its python, exchanging inputs/outputs through files.

The venv uses `--system-site-packages`: the pins below that the project environment already satisfies
(torch 2.13.0 CPU, transformers 5.23.0, pillow, numpy) are reused from it, so a build normally installs
only the torchvision wheel (seconds). Without them it installs everything (minutes, torch is large).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

# torchvision 0.28.x is the release built against torch 2.13 (its wheel pins torch==2.13.0).
ORACLE_REQUIREMENTS = ("torch==2.13.0", "torchvision==0.28.0", "transformers==5.23.0", "pillow", "numpy")
_STAMP = "wfm_jax_oracle.json"


def default_dir() -> Path:
    root = os.environ.get("WFM_JAX_ORACLE_VENV")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "wfm_jax" / "oracle-venv"


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(venv: Path | None = None, timeout: float = 1800) -> Path:
    """Create (once; a stamp records the pins) and return the oracle venv's python. A file lock keeps
    parallel test workers from building it twice."""
    venv = default_dir() if venv is None else Path(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    want = {"requirements": list(ORACLE_REQUIREMENTS), "python": sys.version.split()[0]}
    with open(venv.parent / (venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = venv / _STAMP
        if stamp.is_file() and json.loads(stamp.read_text()) == want and _python(venv).exists():
            return _python(venv)
        start = time.monotonic()
        # no pip inside the venv (saves seconds): the project's pip installs into it via --python
        subprocess.run([sys.executable, "-m", "venv", "--clear", "--without-pip", "--system-site-packages",
                        str(venv)], check=True, timeout=timeout)
        subprocess.run([sys.executable, "-m", "pip", "--python", str(_python(venv)), "install", "-q",
                        *ORACLE_REQUIREMENTS], check=True, timeout=timeout)
        (venv / "build_seconds.txt").write_text(f"{time.monotonic() - start:.1f}\n")
        stamp.write_text(json.dumps(want))
    return _python(venv)


# The torchvision wheels on PyPI are CUDA builds; beside CPU torch their C++ ops (nms, roi_align...)
# cannot load, and torchvision 0.28 then fails at import while registering fake kernels for two of
# them. Processors use only the pure-python transforms, so the oracle skips those registrations.
_IMPORT_SHIM = (
    "import torch.library as _tl\n"
    "_orig = _tl.register_fake\n"
    "_tl.register_fake = lambda *a, **k: (lambda fn: fn)\n"
    "import torchvision\n"
    "_tl.register_fake = _orig\n"
)


def import_shim() -> str:
    """Python source an oracle script runs before importing transformers (see `_IMPORT_SHIM`)."""
    return _IMPORT_SHIM


def run_oracle(script: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `script` with the oracle venv's python; raise with its output on failure."""
    python = ensure_venv()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    with contextlib.suppress(KeyError):
        del env["PYTHONHOME"]
    res = subprocess.run([str(python), str(script), *args], capture_output=True, text=True, env=env,
                         timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"oracle {script.name} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res
