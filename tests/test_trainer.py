"""The trainer: sharded steps equal a single device, SIGTERM saves, learning happens, bad input
gets clear errors, init_from and the XPress objective (SIGKILL and resume: tests/test_launch.py)."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from train_helpers import checkpoint_steps, override_args, train_config
from xpress_jax.errors import CheckpointError, ConfigError, DataError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- sharding: one step on several meshes equals one device ----

def activation_all_gathers(hlo: str, batch: int, seq: int) -> list[str]:
    """The all-gathers in an HLO text whose result is a float array over the whole batch and the
    sequence (a hidden state, logits): gathering one means some device computes every sequence."""
    import re
    shapes = re.findall(r"= ((?:f32|bf16|f16)\[([\d,]+)\][^ ]*) all-gather\(", hlo)
    return [full for full, dims in shapes if [int(d) for d in dims.split(",")][:2] == [batch, seq]
            and len(dims.split(",")) >= 3]


def test_train_step_is_the_same_on_every_mesh(tmp_path):
    """One step from the same state and batch on every kind of mesh (data, fsdp, tensor, mixed;
    two KV heads, so tensor splits them) equals one device's; and the compiled step never
    all-gathers activations over the batch."""
    from xpress_jax.train.setup import Setup
    rng = np.random.default_rng(0)
    batch = {"ids": rng.integers(0, 256, (8, 64)).astype(np.int32),
             "loss_mask": np.repeat((np.arange(64) >= 10)[None], 8, 0)}
    results = {}
    for shape in [(1, 1, 1), (8, 1, 1), (1, 8, 1), (2, 4, 1), (1, 4, 2)]:
        config = train_config(tmp_path, **{"mesh.shape": str(shape), "data.max_len": "64", "train.steps": "10",
                                           "target.arch.num_key_value_heads": "2"})  # split over tensor=2
        setup = Setup(config, abstract=False)
        state0, global_batch = setup.init_state(), setup.global_batch(batch)
        step = setup.step.lower(state0, setup.target_params, global_batch).compile()  # compiled once: read, then run
        hlo = step.as_text()
        assert not activation_all_gathers(hlo, 8, 64), (shape, activation_all_gathers(hlo, 8, 64))
        state, metrics = step(state0, setup.target_params, global_batch)
        results[shape] = (float(metrics["loss"]), jax.device_get(state["params"]))
    assert len(results) == 5
    ref_loss, ref_params = results[(1, 1, 1)]
    for shape, (loss, params) in results.items():
        assert loss == pytest.approx(ref_loss, abs=1e-5), shape
        for k in ref_params:
            np.testing.assert_allclose(params[k], ref_params[k], atol=1e-5, err_msg=f"{shape} {k}")


# ---- runs as processes: SIGTERM, checkpoints ----

def start_train(out_dir, *extra, env_extra=None):
    env = {**os.environ, "XLA_FLAGS": os.environ.get("XPRESS_TEST_XLA_FLAGS", ""), **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "xpress_jax.train", *override_args(out_dir), *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_checkpoint_from_another_number_of_processes_is_refused():
    """Each process's data position belongs to its own shard of the data: two positions cannot
    resume one process."""
    from xpress_jax.train import loop

    class TwoProcessCheckpoint:
        directory = "/runs/x/checkpoints"

        def restore_latest(self, abstract_state, report=None):
            return 6, {}, [{"next_index": 7}, {"next_index": 9}]

    with pytest.raises(CheckpointError, match="written by 2 processes and this run has 1"):
        loop.resume(TwoProcessCheckpoint(), None, iter([]))


def test_a_half_written_checkpoint_is_never_the_latest(tmp_path):
    from xpress_jax.train.run import train
    train(train_config(tmp_path, **{"train.steps": "4", "train.save_every": "2"}))
    ckpt_dir = tmp_path / "checkpoints"
    import shutil
    shutil.copytree(ckpt_dir / "4", ckpt_dir / "6.orbax-checkpoint-tmp-1234567")  # a save cut off mid-write
    from xpress_jax.train.checkpointer import Checkpointer
    assert Checkpointer(str(ckpt_dir), save_every=2, keep=3).latest_step() == 4


def test_sigterm_saves_and_exits(tmp_path):
    proc = start_train(tmp_path, "--config.train.steps=500", "--config.train.save_every=1000")
    deadline = time.time() + 300
    while not os.path.exists(tmp_path / "log.jsonl") or os.path.getsize(tmp_path / "log.jsonl") == 0:
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()[-2000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    steps = checkpoint_steps(tmp_path)
    assert steps and 0 < steps[-1] < 500 and "SIGTERM" in err


# ---- learning, and bad input ----

def predictable_data(path, n=400):
    """Assistant turns that continue the alphabet from a random letter: learnable in minutes."""
    rng = np.random.default_rng(0)
    letters = "abcdefghijklmnopqrstuvwxyz" * 6
    with open(path, "w") as f:
        for i in range(n):
            start = int(rng.integers(0, 26))
            f.write(json.dumps({"id": str(i), "conversations": [
                {"role": "user", "content": f"Continue from {letters[start]}"},
                {"role": "assistant", "content": letters[start:start + 80]}]}) + "\n")
    return str(path)


def test_a_few_hundred_steps_lower_the_loss_and_raise_acceptance(tmp_path):
    from xpress_jax.train.run import train
    data = predictable_data(tmp_path / "abc.jsonl")
    result = train(train_config(tmp_path, **{"train.steps": "240", "train.save_every": "1000",
                                             "train.async_checkpointing": "false", "data.max_len": "128",
                                             "data.train_files": f"('{data}',)"}))
    log = [json.loads(line) for line in open(tmp_path / "log.jsonl")]
    mean = lambda rows, key: float(np.mean([r[key] for r in rows]))  # noqa: E731
    early, late = log[:5], log[-20:]
    # The frozen random target's LM head (std 0.02) keeps logits small, so CE falls slowly even as
    # the argmax becomes right; acceptance is the real signal.
    assert mean(late, "loss/dflash_ce") < mean(early, "loss/dflash_ce") - 0.25
    assert mean(late, "loss/xpress_teacher_forced") < mean(early, "loss/xpress_teacher_forced") - 0.25
    assert mean(late, "sim_tau_drafter") > mean(early, "sim_tau_drafter") + 0.5
    assert mean(late, "sim_tau_xpress") > mean(early, "sim_tau_xpress") + 0.5
    assert result["step"] == 240
    scalars = tensorboard_scalars(tmp_path / "tb")  # TensorBoard holds every logged number
    for row in log:
        for key, value in row.items():
            values = {f"{key}/{i + 1}": v for i, v in enumerate(value)} if isinstance(value, list) else {key: value}
            for tag, v in values.items():
                if key != "step" and isinstance(v, (int, float)):
                    assert scalars[tag, row["step"]] == pytest.approx(float(v), rel=1e-6, abs=1e-30), (tag, row["step"])


def test_tensorboard_values_read_back_as_numpy_casts_them_to_float32(tmp_path):
    from xpress_jax.train.tensorboard import ScalarWriter
    values = [1.25, 1e39, -1e39, 3.4028235e38 * 1.0000000001, float("nan"), 7]
    writer = ScalarWriter(str(tmp_path))
    for step, value in enumerate(values):
        writer.add_scalar("value", value, step)
    writer.close()
    scalars = tensorboard_scalars(tmp_path)
    with np.errstate(over="ignore"):
        for step, value in enumerate(values):
            np.testing.assert_equal(scalars["value", step], np.float32(value))


def tensorboard_scalars(log_dir) -> dict:
    """{(tag, step): value} from the event files, read with tensorboardX's Event proto and its
    masked CRC-32C (another implementation than the writer's), every record's checksums checked."""
    import struct
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import masked_crc32c as masked

    scalars = {}
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        data, at, events = path.read_bytes(), 0, []
        while at < len(data):
            length = data[at:at + 8]
            (n,), (length_crc,) = struct.unpack("<Q", length), struct.unpack("<I", data[at + 8:at + 12])
            payload = data[at + 12:at + 12 + n]
            (payload_crc,) = struct.unpack("<I", data[at + 12 + n:at + 16 + n])
            assert length_crc == masked(length) and payload_crc == masked(payload), (path, at)
            events.append(Event.FromString(payload))
            at += 16 + n
        assert events[0].file_version == "brain.Event:2", path  # each file opens with its format version
        for event in events[1:]:
            for v in event.summary.value:
                scalars[v.tag, event.step] = v.simple_value
    return scalars


def test_nan_steps_are_skipped_then_stop_the_run(tmp_path):
    from xpress_jax.train.loop import TrainingStopped
    from xpress_jax.train.run import train
    with pytest.raises(TrainingStopped, match="5 non-finite steps in a row"):
        train(train_config(tmp_path, **{"train.steps": "20", "train.lr": "1e30", "train.save_every": "2"}))


def test_a_sigterm_on_a_non_finite_step_saves_the_last_finite_state(tmp_path):
    """The loop on a counting step function: step 3's gradient is not finite (the update is
    skipped, so the state stays that of step 2) and a SIGTERM arrives during it. The loop saves
    step 3 with the last finite state and the data position past step 3's batch, then stops."""
    import types

    from xpress_jax.train.loop import run_loop
    saved = []

    class Checkpoints:
        directory = str(tmp_path)
        manager = types.SimpleNamespace(should_save=lambda step: False)

        def save(self, step, state, data_state, force=False):
            saved.append((step, int(state), data_state, force))

        def latest_step(self):
            return saved[-1][0] if saved else None

        def close(self):
            pass

    class Batches:
        position = 0

        def __next__(self):
            self.position += 1
            return self.position

        def get_state(self):
            return {"position": self.position}

    def step_fn(state, batch):
        finite = batch != 3
        if not finite:
            os.kill(os.getpid(), signal.SIGTERM)  # the preemption lands on the bad step
        return (state + 1 if finite else state), {"loss": jnp.float32(0.0), "finite": jnp.asarray(finite)}

    _, step, _ = run_loop(step_fn, 0, Batches(), section=types.SimpleNamespace(log_every=100, max_bad_steps=5),
                          total_steps=10, start=0, ckpt=Checkpoints(), out_dir=str(tmp_path), desc="loop",
                          count_tokens=lambda batch: 1)
    assert step == 3 and saved == [(3, 2, {"position": 3}, True)]


def test_data_without_assistant_tokens_is_refused(tmp_path):
    from xpress_jax.data.byte_tokenizer import ByteTokenizer
    from xpress_jax.data.dataset import make_dataset, read_records
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"conversations": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(DataError, match="has assistant tokens"):
        make_dataset(read_records([str(path)]), ByteTokenizer(300), max_len=64, batch_size=1, seed=0)
    with pytest.raises(DataError, match="does not exist"):
        read_records([str(tmp_path / "missing.jsonl")])


def test_checkpoint_of_another_shape_is_refused(tmp_path):
    from xpress_jax.train.run import train
    train(train_config(tmp_path, **{"train.steps": "2", "train.save_every": "1"}))
    with pytest.raises(ConfigError, match=r"heads\.rank: 16 -> 8\. Use another"):
        train(train_config(tmp_path, **{"train.steps": "2", "heads.rank": "8"}))
    # forced past the config record, the checkpoint's own shapes still refuse it
    with pytest.raises(CheckpointError, match="does not match this model"):
        train(train_config(tmp_path, **{"train.steps": "2", "heads.rank": "8", "train.allow_config_change": "true"}))


def test_bad_configs_fail_clearly(tmp_path):
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XPRESS_TEST_XLA_FLAGS", ""))
    r = subprocess.run([sys.executable, "-m", "xpress_jax.train", "--config.train.nope=1"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown config key 'train.nope'" in r.stderr and "Traceback" not in r.stderr
    from xpress_jax.train.setup import loss_settings
    with pytest.raises(ConfigError, match="D-Loop trains the drafter alone"):
        loss_settings(train_config(tmp_path, **{"train.loss.dloop": "1.0"}))


def test_restore_onto_a_different_mesh(tmp_path):
    """Saved from a (8,1,1) mesh, restored onto (2,2,2): same values, the new mesh's shardings."""
    from xpress_jax.train.checkpointer import Checkpointer
    from xpress_jax.train.setup import Setup
    rng = np.random.default_rng(1)
    batch = {"ids": rng.integers(0, 256, (8, 64)).astype(np.int32),
             "loss_mask": np.repeat((np.arange(64) >= 10)[None], 8, 0)}
    first = Setup(train_config(tmp_path, **{"mesh.shape": "(8, 1, 1)", "data.max_len": "64", "train.steps": "10"}),
                  abstract=False)
    state, _ = first.step(first.init_state(), first.target_params, first.global_batch(batch))
    ckpt = Checkpointer(str(tmp_path / "ckpt"), save_every=1, keep=2, async_save=False)
    ckpt.save(1, state, {"next_index": 8})
    ckpt.wait()
    second = Setup(train_config(tmp_path, **{"mesh.shape": "(2, 2, 2)", "data.max_len": "64", "train.steps": "10"}),
                   abstract=False)
    restored, data_state = ckpt.restore(1, second.abstract_state)
    ckpt.close()
    assert data_state == [{"next_index": 8}]  # one process: one position
    q = "drafter.layers.self_attn.q_proj"
    assert restored["params"][q].sharding == second.param_sharding[q] != first.param_sharding[q]
    for k, v in jax.device_get(state["params"]).items():
        np.testing.assert_array_equal(np.asarray(restored["params"][k]), v, err_msg=k)
    # and training continues from it on the new mesh
    _, metrics = second.step(restored, second.target_params, second.global_batch(batch))
    assert bool(metrics["finite"])


def test_array_record_files_are_read(tmp_path):
    from array_record.python.array_record_module import ArrayRecordWriter
    from xpress_jax.data.dataset import read_records
    path = str(tmp_path / "d.array_record")
    writer = ArrayRecordWriter(path, "group_size:1")
    rows = [{"id": str(i), "conversations": [{"role": "user", "content": f"q{i}"},
                                             {"role": "assistant", "content": f"a{i}"}]} for i in range(3)]
    for r in rows:
        writer.write(json.dumps(r).encode())
    writer.close()
    assert read_records([path]) == rows


# ---- the XPress objective and starting from a trained drafter ----

def test_xpress_training_does_not_count_the_drafter_ce_twice(tmp_path):
    """With the xpress head, the drafter-anchor term (CE + TV on p^b) is the drafter's loss; DFlash's
    CE is logged but added only with train.loss.dflash_ce_with_heads."""
    from xpress_jax.train.step import LossSettings, compute_loss
    from xpress_jax.models.build import build_target, build_trainable
    config = train_config(tmp_path)
    target = build_target(config)
    model = build_trainable(config, target.cfg)
    ids = jnp.asarray(np.random.default_rng(1).integers(0, 256, (2, 40)), jnp.int32)
    mask = jnp.asarray(np.arange(40)[None] >= 8).repeat(2, 0)
    xpress_terms = ("loss/xpress_teacher_forced", "loss/xpress_anchor", "loss/xpress_consistency")
    for with_ce in (False, True):
        s = dataclasses.replace(LossSettings.from_config(config.train), num_anchors=6, anchor_chunk=3,
                                dflash_ce_with_heads=with_ce)
        total, m = nnx.jit(compute_loss, static_argnums=5)(model, target, ids, mask, jax.random.key(3), s)
        expect = sum(float(m[k]) for k in xpress_terms) + (float(m["loss/dflash_ce"]) if with_ce else 0.0)
        assert float(total) == pytest.approx(expect, rel=1e-5)
        assert float(m["loss/dflash_ce"]) > 0


def _flat(module):
    from xpress_jax.train.state import flat_params
    return {k: np.asarray(v) for k, v in flat_params(module).items()}


def test_init_from_a_trained_drafter_trains_only_the_heads(tmp_path):
    """A drafter-only run's export, then trainable=heads from it: the drafter stays exactly the
    exported one, the head learns; a head found in DIR/heads/ is loaded too."""
    from xpress_jax.checkpoints.heads import load_head
    from xpress_jax.checkpoints.hf_drafter import load_drafter
    from xpress_jax.train.run import initial_params, train
    from xpress_jax.train.setup import Setup
    common = {"train.steps": "3", "train.save_every": "1000", "train.async_checkpointing": "false"}
    first = tmp_path / "drafter"
    train(train_config(first, **common, **{"train.trainable": "drafter", "train.heads": "()"}))
    exported = _flat(load_drafter(str(first / "export"), scan=True))  # training's layer layout

    second = tmp_path / "markov"
    config = train_config(second, **common, **{"train.trainable": "heads", "train.heads": "('markov',)",
                                               "train.init_from": str(first / "export")})
    result = train(config)
    params = {k: np.asarray(v) for k, v in jax.device_get(result["state"]["params"]).items()}
    for k, v in exported.items():
        np.testing.assert_array_equal(params[f"drafter.{k}"], v)
    fresh = {k: np.asarray(v) for k, v in Setup(config, abstract=False, num_records=10).params.items()}
    assert any(not np.array_equal(params[k], fresh[k]) for k in params if k.startswith("markov."))

    # a run starting from the second export picks up its markov head as well
    config3 = train_config(tmp_path / "third", **common, **{"train.trainable": "heads", "train.heads": "('markov',)",
                                                            "train.init_from": str(second / "export")})
    setup = Setup(config3, abstract=False, num_records=10)
    start = {k: np.asarray(v) for k, v in initial_params(setup, config3, str(second / "export")).items()}
    saved = _flat(load_head(nnx_abstract_markov(setup), str(second / "export"), "markov"))
    for k, v in saved.items():
        np.testing.assert_array_equal(start[f"markov.{k}"], v)


def test_a_frozen_drafter_is_not_differentiated(tmp_path):
    """trainable=heads: the step takes no gradient through the frozen drafter (fewer flops), and
    its update is the one a full backward pass gives: same heads, same untouched drafter."""
    from xpress_jax.bench.train import full_backward_step
    from xpress_jax.train.dry_run import compiled_flops
    from xpress_jax.train.setup import Setup
    config = train_config(tmp_path, **{"data.max_len": "64", "train.steps": "10", "train.trainable": "heads",
                                       "train.heads": "('markov', 'xpress')"})
    setup = Setup(config, abstract=False)
    rng = np.random.default_rng(0)
    batch = setup.global_batch({"ids": rng.integers(0, 256, (8, 64)).astype(np.int32),
                                "loss_mask": np.repeat((np.arange(64) >= 10)[None], 8, 0)})
    everything = full_backward_step(setup, config)
    args = (setup.init_state(), setup.target_params, batch)
    flops = lambda step: compiled_flops(step.lower(*args).compile())  # noqa: E731
    assert flops(setup.step) < 0.9 * flops(everything)

    new, old = setup.init_state(), setup.init_state()
    for _ in range(2):  # the first step's learning rate is 0 (warmup)
        new, m_new = setup.step(new, setup.target_params, batch)
        old, m_old = everything(old, setup.target_params, batch)
    assert float(m_new["loss"]) == pytest.approx(float(m_old["loss"]), rel=1e-6)
    start = jax.device_get(setup.params)
    moved = 0
    for k, v in jax.device_get(new["params"]).items():
        np.testing.assert_allclose(v, jax.device_get(old["params"][k]), atol=1e-6, err_msg=k)
        if k.startswith("drafter."):
            np.testing.assert_array_equal(v, start[k])
        moved += not np.array_equal(v, start[k])
    assert moved > 0
    assert 0 < float(m_new["grad_norm"]) < float(m_old["grad_norm"])  # the heads' gradient alone


def nnx_abstract_markov(setup):
    from xpress_jax.train.state import merge
    return nnx.eval_shape(lambda: merge(setup.graphdef, setup.params).markov)


def test_a_checkpoint_brings_its_own_shapes_and_only_a_command_line_override_may_contradict_them(tmp_path):
    """Fine-tuning or evaluating an export needs only its directory: the drafter's layers and the
    heads' sizes come from its config files; a command-line value that differs is refused."""
    from xpress_jax.cli import DEFAULT_CONFIG, with_overrides
    from xpress_jax.models.build import build_drafter, build_head, build_target
    from xpress_jax.train.run import train
    from train_helpers import TINY_OVERRIDES
    common = {"train.steps": "1", "train.save_every": "1000", "train.async_checkpointing": "false"}
    train(train_config(tmp_path / "a", **common, **{"train.trainable": "all", "train.heads": "('xpress',)"}))
    export = str(tmp_path / "a" / "export")
    config = train_config(tmp_path / "b", **common, **{"drafter.num_layers": "2", "train.init_from": export})
    with pytest.raises(ConfigError, match=r"--config.drafter.num_layers=2 but .*config.json has num_layers=1"):
        train(config, overridden=frozenset({"drafter.num_layers"}))  # as `cli.config_overrides` reports it
    # the config file's defaults (2 drafter layers, heads of rank 32) give way to the checkpoint's
    unset = {k: v for k, v in TINY_OVERRIDES.items() if k not in ("drafter.num_layers", "heads.rank")}
    config = with_overrides(DEFAULT_CONFIG, **unset, **common, **{
        "train.out_dir": str(tmp_path / "c"), "train.init_from": export, "train.heads": "('xpress',)"})
    assert (config.drafter.num_layers, config.heads.rank) == (2, 32)
    assert train(config)["setup"].drafter_cfg.num_hidden_layers == 1
    target = build_target(config)
    drafter = build_drafter(config, target, export)
    assert build_head("xpress", config, drafter.cfg, export).W_e[...].shape == (300, 16)
    config = with_overrides(DEFAULT_CONFIG, **unset, **{"heads.rank": "8"})
    assert build_head("xpress", config, drafter.cfg, export).W_e[...].shape == (300, 16)  # not from the command line
    with pytest.raises(ConfigError, match=r"--config.heads.rank=8 but .*xpress.config.json has rank=16"):
        build_head("xpress", config, drafter.cfg, export, overridden=frozenset({"heads.rank"}))


def test_the_train_steps_memory_per_device_falls_with_devices(tmp_path):
    """At a fixed global batch, the compiled step's temporaries per device at 8 fsdp devices are at
    most 0.6x those at 4: activations are split over the batch, not replicated."""
    from xpress_jax.train.setup import Setup
    temp = {}
    for devices in (4, 8):
        config = train_config(tmp_path, **{"mesh.shape": f"(1,{devices},1)", "data.max_len": "128",
                                           "train.batch_size": "16", "target.arch.vocab_size": "1024",
                                           "drafter.mask_token_id": "1023", "dtype": "bfloat16",
                                           "target.arch.num_key_value_heads": "2"})
        setup = Setup(config, abstract=True)
        batch = setup.abstract_batch()
        temp[devices] = setup.step.lower(setup.abstract_state, setup.target_params, batch).compile() \
            .memory_analysis().temp_size_in_bytes
    assert temp[8] <= 0.6 * temp[4], temp


def test_the_dry_run_proves_the_work_is_split_and_meshes_that_cannot_split_it_are_refused(tmp_path):
    """--dry_run's FLOPs ratio (per-device FLOPs * devices / the one-device step's) is about 1 when
    the batch splits over 8 devices. The shapes (bf16, the target logits a large share of the step,
    two KV heads) are ones where the ratio reads 1.09 when the one-device program is counted with
    CSE on (it merges the forward and rematerialised p^t logits), and 1.10 when the training
    attention's rows are heads-major (the batch split cannot follow them). A mesh that cannot split
    the batch, the heads, the vocabulary or the widths would leave that dimension whole on every
    device: refused, naming the field."""
    from xpress_jax.train.dry_run import dry_run
    config = train_config(tmp_path, **{"mesh.shape": "(1,8,1)", "data.max_len": "128", "train.batch_size": "16",
                                       "dtype": "bfloat16", "target.arch.vocab_size": "4096",
                                       "target.arch.num_key_value_heads": "2",
                                       "drafter.mask_token_id": "4095", "train.num_anchors": "32",
                                       "train.anchor_chunk": "8"})
    report = dry_run(config)
    assert report["devices"] == 8 and report["peak_gib"] > 0 and report["model_flops"] > 0
    assert 0.97 <= report["flops_ratio"] <= 1.03, report
    # read from the lowered programs: none on this CPU, splash attention in the step lowered for TPU,
    # flash_gpu in the step lowered for CUDA
    assert report["fused_attention"] == {"cpu": [], "tpu": ["splash"], "gpu": ["flash_gpu"]}, report
    tpu, gpu = report["attention"]["tpu"], report["attention"]["gpu"]
    assert tpu["parts"]["target"]["in_kernels"] == 1.0 and tpu["parts"]["drafter"]["kernels"] == []  # 8 x 6
    # anchored queries are not whole 128-query splash tiles; flash_gpu's 16-query tiles take them
    assert gpu["parts"]["drafter"]["kernels"] == ["flash_gpu"] and gpu["in_kernels"] >= 0.95
    assert 0 < tpu["in_kernels"] < 1 and report["attention"]["cpu"]["in_kernels"] == 0.0
    # no f32 vocabulary-sized array beyond one anchor chunk's logits (32 anchors in chunks of 8)
    assert 0 < report["largest_vocab_f32_bytes"] <= report["chunk_logits_bytes"] == 4 * 2 * 8 * 5 * 4096, report
    for mesh, field, message in (
            ("(1,8,1)", {"train.batch_size": "4"}, "train.batch_size=4 does not split over fsdp=8 (8 devices)"),
            ("(1,4,2)", {"target.arch.vocab_size": "301"}, "target.arch.vocab_size=301 does not split over tensor=2"),
            ("(1,2,4)", {"target.arch.num_attention_heads": "2"},
             "target.arch.num_attention_heads=2 does not split over tensor=4"),
            ("(1,8,1)", {"target.arch.hidden_size": "36", "target.arch.head_dim": "18"},
             "target.arch.hidden_size=36 does not split over fsdp=8")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            dry_run(train_config(tmp_path, **{"mesh.shape": mesh, **field}))
    # KV heads fewer than tensor devices stay whole (replicated), as GQA models usually are
    from xpress_jax.sharding import make_mesh, refuse_uneven_splits
    from xpress_jax.train.setup import split_sizes
    refuse_uneven_splits(make_mesh((1, 4, 2)), split_sizes(train_config(tmp_path)))  # kv heads 1, tensor 2


def test_layer_remat_recomputes_the_drafter_layers_and_changes_nothing_else(tmp_path):
    """train.layer_remat: the scanned drafter layers keep less for the backward pass and recompute
    it (more FLOPs in the compiled step), and the step's loss and updated parameters are the same."""
    from xpress_jax.train.dry_run import compiled_flops
    from xpress_jax.train.setup import Setup
    rng = np.random.default_rng(0)
    batch = {"ids": rng.integers(0, 256, (8, 64)).astype(np.int32),
             "loss_mask": np.repeat((np.arange(64) >= 10)[None], 8, 0)}
    flops, results = {}, {}
    for policy in ("none", "full"):
        # two drafter layers, so the layer scan has a body to recompute; the chunks are not
        # recomputed here (train.remat) so that the layers' recomputation is what the FLOPs see
        config = train_config(tmp_path, **{"data.max_len": "64", "drafter.num_layers": "2", "train.remat": "False",
                                           "train.layer_remat": policy})
        setup = Setup(config, abstract=False)
        state0, global_batch = setup.init_state(), setup.global_batch(batch)
        step = setup.step.lower(state0, setup.target_params, global_batch).compile()
        flops[policy] = compiled_flops(step)
        state, metrics = step(state0, setup.target_params, global_batch)
        results[policy] = (float(metrics["loss"]), jax.device_get(state["params"]))
    assert flops["none"] < flops["full"], flops
    assert results["full"][0] == pytest.approx(results["none"][0], abs=1e-6)
    for k, v in results["none"][1].items():
        np.testing.assert_allclose(results["full"][1][k], v, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("mesh", ["(1,1,8)", "(1,4,2)"])
def test_under_tensor_parallelism_the_logits_stay_split_over_the_vocabulary(tmp_path, mesh):
    """On a tensor mesh, alone or with fsdp, the compiled step moves no vocabulary-sized array
    between devices: CE, TV and the argmax reduce each device's slice of the logits, and only
    per-token partial results ([.., devices]), hidden states and each device's vocabulary slice
    of a gathered weight travel."""
    import re
    from xpress_jax.train.setup import Setup
    vocab = 512
    config = train_config(tmp_path, **{"mesh.shape": mesh, "data.max_len": "64",
                                       "target.arch.vocab_size": str(vocab), "drafter.mask_token_id": str(vocab - 1),
                                       "target.arch.num_attention_heads": "8",  # 8 tensor devices split them
                                       "train.heads": "('xpress', 'markov')"})
    setup = Setup(config, abstract=True)
    hlo = setup.step.lower(setup.abstract_state, setup.target_params, setup.abstract_batch()).compile().as_text()
    moved = re.findall(r"= \w+\[([\d,]*)\][^ ]* (all-gather|all-reduce|all-to-all|collective-permute)\(", hlo)
    assert moved, "a tensor-parallel step exchanges something"
    vocab_sized = [(dims, op) for dims, op in moved if str(vocab) in dims.split(",")]
    assert not vocab_sized, vocab_sized


def test_a_train_step_at_the_recipes_sequence_length(tmp_path):
    """The 8B recipe's data.max_len (3,072 tokens, configs/qwen3_8b.py) at tiny width, its
    16-token blocks and anchors over the whole sequence: a 2,000-token prompt whose answer runs to
    the end. Two steps (the first at the warmup's zero learning rate) give finite losses and
    change the drafter."""
    from xpress_jax.cli import config_path, load_config
    from xpress_jax.train.setup import Setup
    recipe_len = int(load_config(config_path("qwen3_8b.py")).data.max_len)
    assert recipe_len == 3072
    config = train_config(tmp_path, **{"data.max_len": str(recipe_len), "train.batch_size": "2",
                                       "mesh.shape": "(1,1,1)",
                                       "drafter.block_size": "16", "train.num_anchors": "64",
                                       "train.anchor_chunk": "32"})
    rng = np.random.default_rng(0)
    batch = {"ids": rng.integers(0, 256, (2, recipe_len)).astype(np.int32),
             "loss_mask": np.repeat((np.arange(recipe_len) >= 2000)[None], 2, 0)}
    setup = Setup(config, abstract=False)
    state0 = setup.init_state()
    before = jax.device_get(state0["params"])
    state = state0
    for _ in range(2):
        state, metrics = setup.step(state, setup.target_params, setup.global_batch(batch))
        assert np.isfinite(float(metrics["loss"])) and bool(metrics["finite"])
    after = jax.device_get(state["params"])
    assert any(not np.array_equal(before[k], after[k]) for k in before)
