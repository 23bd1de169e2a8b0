"""Resilient, low-communication pre-training of language models in JAX."""
