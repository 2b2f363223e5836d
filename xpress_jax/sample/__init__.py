"""`python -m xpress_jax.sample`: one decoder's answers to a few prompts, each with its trace."""
