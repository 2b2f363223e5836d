"""`python -m xpress_jax.reproduce`: the tiny end-to-end reproduction, stage by stage, cached."""
