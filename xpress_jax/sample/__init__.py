"""`python -m xpress_jax.sample`: greedy generation with the target through the jitted loop."""
