"""Benchmarks, reported as ratios measured side by side in one run (never as test assertions).

    python -m xpress_jax.bench --suite=heads|e2e|decode|train|regen|all [--out=benchmarks/cpu]

`heads.py`: the draft step at Qwen3-8B shapes on random weights, each call with its FLOPs, bytes
and roofline bound (`costs.py`); `e2e.py`: decoding speed and the heads' costs on the tiny
reproduction's trained checkpoints; `decode.py`: one decode-loop step of every decoder against
target-only decoding; `train.py`: train-step throughput; `regen.py`: regeneration with continuous
batching against a static batch; `scaling.py`: the 8B step's strong and weak scaling on simulated
devices (per-device memory and FLOPs).
"""
