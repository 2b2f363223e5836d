"""How this project times code: wall seconds of repeated calls after a first call that
compiles and warms up, each call waiting for its results (`block_until_ready`), so asynchronous
dispatch never hides work. Benchmarks and the eval's time split all time through here, and
compile times (`compile_seconds`) too."""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import numpy as np


def timed_calls(fn: Callable[[], Any], reps: int) -> tuple[list[float], Any]:
    """(seconds of each of `reps` calls of fn(), the last call's result), after one untimed call."""
    out = jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return times, out


def median_seconds(fn: Callable, *args, reps: int) -> float:
    """Median seconds of fn(*args): the typical cost of a call."""
    return float(np.median(timed_calls(lambda: fn(*args), reps)[0]))


def fastest_seconds(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    """(fastest seconds of fn(), its result): the cost with the least interference from the machine."""
    times, out = timed_calls(fn, reps)
    return min(times), out


def compile_seconds(jitted, *args) -> dict:
    """Seconds to trace + lower and to compile `jitted` on `args`, which may be abstract
    (jax.ShapeDtypeStruct): what a run at these shapes compiles, with nothing allocated or run."""
    t0 = time.perf_counter()
    lowered = jitted.lower(*args)
    t1 = time.perf_counter()
    lowered.compile()
    return {"trace_and_lower_s": round(t1 - t0, 2), "compile_s": round(time.perf_counter() - t1, 2)}
