"""`python -m xpress_jax.pretrain`: a Qwen3 target trained from scratch with the next-token
objective (the tiny reproduction's target), through the shared loop of `xpress_jax.train.loop`."""
