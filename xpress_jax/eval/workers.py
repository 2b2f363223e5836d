"""Eval over every device: the questions are split over the processes of a run and, within each, over
its local devices (groups of `tensor_parallel` devices for a split target), as the DFlash harness
splits them over ranks (`range(rank, n, world)`). Each worker decodes its questions one response at a
time on its own copy of the models, in its own thread: a program per device, so each response is
timed on its own, where one SPMD program would show the host only the slowest device. The results
are merged back into question order, and across processes gathered to every process."""

from __future__ import annotations

import concurrent.futures
import pickle

import jax
import numpy as np
from flax import nnx

from xpress_jax.decoding.devices import place_on_tensor_mesh, tensor_mesh
from xpress_jax.errors import InputError


class _Replica(nnx.Module):
    """Every decoder's models in one graph, so a copy shares one target and one drafter per checkpoint."""

    def __init__(self, models: list):
        self.models = nnx.List(models)


def device_groups(devices: int, tensor_parallel: int) -> list[list]:
    """This process's workers: `devices` local devices (0: all), in groups of `tensor_parallel`."""
    local = jax.local_devices()
    count = devices or len(local)
    if not 1 <= count <= len(local):
        raise InputError(f"eval.devices={devices}: this process has {len(local)} device(s); choose 0 (all) or "
                         f"1..{len(local)}")
    if count % tensor_parallel:
        raise InputError(f"eval.devices={count} is not a multiple of eval.tensor_parallel={tensor_parallel}")
    return [local[i:i + tensor_parallel] for i in range(0, count, tensor_parallel)]


def replicas(decoders: dict, groups: list[list], target_cfg) -> list[dict]:
    """The decoders' models (label -> (DecodingModels, Method)) on each group: the first group's are the
    ones given (already placed there), the others copies placed on their own devices."""
    labels = list(decoders)
    out = [decoders]
    graphdef, state = nnx.split(_Replica([decoders[label][0] for label in labels]))
    for group in groups[1:]:
        if len(group) == 1:
            copy = nnx.merge(graphdef, jax.device_put(state, group[0]))
        else:
            copy = nnx.merge(graphdef, state)
            mesh = tensor_mesh(len(group), target_cfg, group)
            for models in copy.models:
                place_on_tensor_mesh(models, mesh)
        out.append({label: (copy.models[i], decoders[label][1]) for i, label in enumerate(labels)})
    return out


def share(n_questions: int, worker: int, workers: int) -> list[int]:
    """The questions worker `worker` of `workers` decodes: every workers-th from its own index."""
    return list(range(worker, n_questions, workers))


def run_on_workers(fn, n_questions: int, local: list[dict]) -> list:
    """fn(models, question indices, worker) on each of this process's workers at once, the
    questions split over every worker of every process; returns every worker's result, gathered
    from all processes, in worker order (worker w of process p is p * len(local) + w)."""
    first = jax.process_index() * len(local)
    workers = jax.process_count() * len(local)
    with concurrent.futures.ThreadPoolExecutor(len(local)) as pool:
        futures = [pool.submit(fn, models, share(n_questions, first + w, workers), first + w)
                   for w, models in enumerate(local)]
        mine = [f.result() for f in futures]
    return gather_processes(mine)


def gather_processes(mine: list) -> list:
    """Every process's list of results, concatenated in process order (one process: `mine`)."""
    if jax.process_count() == 1:
        return mine
    from jax.experimental import multihost_utils
    blob = np.frombuffer(pickle.dumps(mine), np.uint8)
    sizes = multihost_utils.process_allgather(np.array([blob.size], np.int64)).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:blob.size] = blob
    every = multihost_utils.process_allgather(padded)  # [processes, max size]
    return [r for p in range(len(sizes)) for r in pickle.loads(every[p, :sizes[p]].tobytes())]
