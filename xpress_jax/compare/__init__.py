"""`python -m xpress_jax.compare`: two methods' tau paired prompt by prompt across eval reports."""
