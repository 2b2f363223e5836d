"""`python -m xpress_jax.eval`: every method against target-only decoding on the same prompts:
tau, acceptance per position, repetition, tokens/s and speedup, paired intervals, plots."""
