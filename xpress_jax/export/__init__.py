"""`python -m xpress_jax.export`: a run's checkpoint step as PyTorch-loadable safetensors."""
