"""Assay: LLM-proposed, evolved CUDA kernels that a hardened verifier has earned."""

__version__ = "0.1.0"
