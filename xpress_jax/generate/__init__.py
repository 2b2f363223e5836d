"""`python -m xpress_jax.generate`: the target's greedy replies to a conversation set (the
drafter's training data, as the DFlash recipe makes it)."""
