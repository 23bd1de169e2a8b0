"""Resilient, low-communication pre-training in JAX: DiLoCo, Streaming and Decoupled DiLoCo."""

import setuptools

# Lower bounds are the versions the test suite was run against (2026-11-29).
INSTALL_REQUIRES = [
    "jax>=0.10.2",
    "flax>=0.12.8",
    "optax>=0.2.8",
    "orbax-checkpoint>=0.12.8",
    "grain>=0.2.18",
    "array-record>=0.8.6",
    "ml-collections>=1.1.0",
    "absl-py>=2.5.1",
    "numpy>=2.4",
    "ml-dtypes>=0.6",
    "tqdm>=4.70",
    "tensorboardX>=2.6.5",
    "sentencepiece>=0.2.1",
    "matplotlib>=3.11",
]

EXTRAS_REQUIRE = {
    "dev": [
        "pytest>=9.0",
        "jupytext>=1.19",
        "nbclient>=0.11",
        "nbformat>=5.10",
        "ipykernel>=7.0",
    ],
}

setuptools.setup(
    name="diloco",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["diloco", "diloco.*"]),
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
)
