"""`python -m xpress_jax.train`: a DFlash drafter and its causal heads against a frozen Qwen3
target. `loop.py` is the training loop (pretraining runs it too), `setup.py` builds the
sharded state and the jitted step, `step.py`/`losses.py`/`anchors.py` are the objective."""
