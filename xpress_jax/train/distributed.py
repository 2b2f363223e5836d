"""Multi-process start-up (every process checks in before `jax.distributed.initialize`), and the
small host-side collectives the training loop needs: every process's data position, the tokens
of all processes.

When a process never arrives, JAX's coordination service aborts the others from C++ after its
timeout, with a stack trace and no word on who is missing. So the processes first meet over a
plain TCP socket on the coordinator's port + 1: process 0 waits (up to XPRESS_INIT_TIMEOUT
seconds, default 300) for every id and names the missing ones in one line; the others say when
the coordinator cannot be reached. Only then does JAX initialise.
"""

from __future__ import annotations

import json
import os
import socket
import time

import jax
import numpy as np

from xpress_jax.errors import ConfigError


def _address(coordinator: str) -> tuple[str, int]:
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"XPRESS_COORDINATOR={coordinator!r}: expected HOST:PORT")
    return host, int(port) + 1


def check_in(coordinator: str, count: int, me: int, timeout: float) -> None:
    """Returns once all `count` processes have checked in; ConfigError naming who is missing otherwise."""
    host, port = _address(coordinator)
    deadline = time.monotonic() + timeout
    if me == 0:
        seen = {0}
        peers = []
        with socket.create_server(("", port), reuse_port=False) as server:
            server.settimeout(0.5)
            while len(seen) < count and time.monotonic() < deadline:
                try:
                    conn, _ = server.accept()
                except socket.timeout:
                    continue
                conn.settimeout(5)
                data = conn.recv(16).decode().strip()
                if data.isdigit():
                    seen.add(int(data))
                    peers.append(conn)
            missing = sorted(set(range(count)) - seen)
            for conn in peers:  # tell everyone whether to go on
                conn.sendall(b"go\n" if not missing else b"stop\n")
                conn.close()
        if missing:
            raise ConfigError(f"process 0 of {count}: processes {missing} did not check in at {host}:{port} within "
                              f"{timeout:g} s (XPRESS_INIT_TIMEOUT); start all {count} with the same XPRESS_COORDINATOR")
        return
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic())) as conn:
                conn.sendall(f"{me}\n".encode())
                conn.settimeout(max(1.0, deadline - time.monotonic() + 10))
                reply = conn.recv(16).decode().strip()
                if reply == "go":
                    return
                raise ConfigError(f"process {me} of {count}: process 0 gave up waiting for the others")
        except (ConnectionRefusedError, socket.timeout, OSError) as e:
            if isinstance(e, ConfigError):
                raise
            if time.monotonic() >= deadline:
                raise ConfigError(f"process {me} of {count}: process 0 did not answer at its check-in port "
                                  f"{host}:{port} within {timeout:g} s (XPRESS_INIT_TIMEOUT)") from None
            time.sleep(0.5)


def maybe_initialize_distributed(config) -> None:
    """Multi-host: jax.distributed from XPRESS_COORDINATOR / _NUM_PROCESSES / _PROCESS_ID (after the
    check-in above), or the cluster's own environment (TPU pods, SLURM) when train.distributed is set."""
    timeout = int(os.environ.get("XPRESS_INIT_TIMEOUT", "300"))
    if os.environ.get("XPRESS_COORDINATOR"):
        coordinator, count = os.environ["XPRESS_COORDINATOR"], int(os.environ["XPRESS_NUM_PROCESSES"])
        me = int(os.environ["XPRESS_PROCESS_ID"])
        check_in(coordinator, count, me, timeout)
        # CPU collectives between processes (only the CPU backend reads this; asking for the backend
        # here would initialise it before jax.distributed may)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=count, process_id=me,
                                   initialization_timeout=timeout)
    elif config.train.distributed:
        jax.distributed.initialize(initialization_timeout=timeout)


def gather_json(value) -> list:
    """Every process's JSON-serialisable `value`, in process order: a collective, so every process
    calls it at the same point. [value] in a single-process run."""
    if jax.process_count() == 1:
        return [value]
    from jax.experimental import multihost_utils
    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    lengths = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32))).reshape(-1)
    padded = np.zeros(int(lengths.max()), np.uint8)  # the gather needs one shape on every process
    padded[:data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(padded))  # [processes, longest]
    return [json.loads(bytes(row[:n])) for row, n in zip(rows, lengths)]


def process_sum(count: int) -> int:
    """`count` summed over the processes (a collective, like gather_json)."""
    return count if jax.process_count() == 1 else sum(gather_json(count))
