"""Shared fixtures. Eight fake CPU devices so sharding tests can build real meshes."""

import os

# XLA's CPU backend compiles the tests' tiny programs without its costly LLVM passes, with its
# legacy fusion emitters and in one LLVM module (its parallel codegen pays on many cores, not on
# the two the suite shares): compiling is most of the suite's time (these flags take two thirds
# off the decode loops' compile), while collectives, FLOPs, memory and every numerical property
# are the same. The test that reads the loop's HLO for copies compiles with the emitters users
# get (tests/test_loop_copies.py). The CLI subprocesses the tests start get the same flags,
# without the fake devices (tests/cli_helpers.py).
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                      "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1")


def known_xla_flags(flags: str) -> str:
    """The flags this jaxlib's XLA knows: an unknown one aborts the process at backend start (jax
    0.11's XLA has no --xla_cpu_use_fusion_emitters), so a child process tries them first and each
    flag it names as unknown is dropped. Run once per session (the workers inherit the result)."""
    import re
    import subprocess
    import sys
    kept = flags.split()
    while kept:
        r = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], capture_output=True, text=True,
                           env={**os.environ, "XLA_FLAGS": " ".join(kept), "JAX_PLATFORMS": "cpu"}, timeout=120)
        unknown = re.findall(r"Unknown flags? in XLA_FLAGS: (\S+)", r.stderr)
        if r.returncode == 0 or not unknown:
            break
        kept = [f for f in kept if f.split("=")[0] not in {u.split("=")[0] for u in unknown}]
    return " ".join(kept)


if "XPRESS_TEST_XLA_FLAGS" not in os.environ:
    os.environ["XPRESS_TEST_XLA_FLAGS"] = known_xla_flags(FAST_COMPILE_FLAGS)
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {os.environ['XPRESS_TEST_XLA_FLAGS']}")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One persistent XLA cache per test session, shared by the xdist workers and the CLI subprocesses
# the tests start (they inherit the environment): the same tiny models compile once, not per process.
# Programs that compile in under 0.1 s (thousands of single eager ops) are not written: storing each
# costs about what compiling it does.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import tempfile
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="xpress_jax_test_xla_cache_")
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.1"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

# Four random tiny Qwen3s: tied and untied; GQA ratios 1, 2 and 4; head_dim != hidden/heads; two thetas.
TINY_CONFIGS = {
    "tied_gqa1": dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                      tie_word_embeddings=True, rope_theta=10_000.0),
    "untied_gqa2": dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                        tie_word_embeddings=False, rope_theta=1_000_000.0),
    "untied_gqa4": dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                        tie_word_embeddings=False, rope_theta=10_000.0),
    "tied_gqa2_default_head_dim": dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                                       tie_word_embeddings=True, rope_theta=1_000_000.0),
}


def make_hf_qwen3(out_dir: str, seed: int = 0, vocab_size: int = 128, num_layers: int = 3, **overrides) -> str:
    """Saves a random transformers Qwen3ForCausalLM (norm weights randomised too) to out_dir."""
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.Qwen3Config(vocab_size=vocab_size, intermediate_size=80, num_hidden_layers=num_layers,
                                   max_position_embeddings=512, initializer_range=0.2, **overrides)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_qwen3")
    return {name: make_hf_qwen3(str(root / name), seed=i, **kw) for i, (name, kw) in enumerate(TINY_CONFIGS.items())}


@pytest.fixture(scope="session", params=list(TINY_CONFIGS))
def tiny_dir(request, tiny_dirs):
    return tiny_dirs[request.param]


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir(tmp_path_factory):
    from tokenizer_fixture import build_qwen3_tokenizer
    return build_qwen3_tokenizer(str(tmp_path_factory.mktemp("qwen3_tokenizer")))


# Files start longest first, so that under `-n 2 --dist loadfile` the short ones fill the tail of
# the run and the two workers end together; files not named here take under 5 s. The files with
# whole-pipeline tests are in the order that balances a --pipeline=only run (the smoke reproduction
# alone takes two minutes). xdist would order files by their number of tests.
SLOW_FILES_FIRST = ("test_eval.py", "test_trainer.py", "test_reproduce.py", "test_bench.py", "test_eval_protocol.py",
                    "test_speculative.py", "test_dloop.py", "test_verify_tokens.py", "test_qwen3.py",
                    "test_validation.py", "test_launch.py", "test_notebook.py", "test_tools.py",
                    "test_decode_devices.py", "test_loop_copies.py", "test_continuous.py", "test_drafter.py",
                    "test_jacobi.py", "test_kernels.py", "test_export.py", "test_losses.py", "test_methods.py",
                    "test_heads.py", "test_checkpoints.py", "test_pretrain.py")


def pytest_addoption(parser):
    parser.addoption("--pipeline", choices=("skip", "only", "all"), default="skip",
                     help="the whole-pipeline tests (marked `pipeline`: the smoke reproduction, gpu.sh --dry_run, "
                          "two-process training and eval, the notebook): skip them (default, unless their file is named or -m "
                          "names the marker), run only them (CI's second step) or run everything")


def pytest_configure(config):
    config.addinivalue_line("markers", "pipeline: runs a whole command chain in subprocesses (see --pipeline)")
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist's reordering, on by default
        config.option.loadscopereorder = False


def pytest_report_header(config):
    return f"whole-pipeline tests: --pipeline={config.getoption('pipeline')}"


def pytest_unconfigure(config):
    # An xdist worker has sent its last report by the time the interpreter exits; tearing down
    # every program and array it compiled takes it seconds, which the controller waits for (up to
    # 10 s) before it prints the summary. atexit runs this first (last registered, first run).
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import atexit
        atexit.register(os._exit, 0)


def pytest_collection_modifyitems(config, items):
    mode = config.getoption("pipeline")
    if mode == "skip" and "pipeline" in (config.option.markexpr or ""):
        mode = "all"  # `-m` names the marker: it chooses
    named = {os.path.realpath(os.path.join(config.invocation_params.dir, arg.split("::")[0])) for arg in config.args}

    def selected(item):
        if mode == "all" or os.path.realpath(item.path) in named:
            return True
        return (item.get_closest_marker("pipeline") is not None) == (mode == "only")
    kept, deselected = [], []
    for item in items:
        (kept if selected(item) else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept

    def rank(item):
        name = os.path.basename(str(item.path))
        return SLOW_FILES_FIRST.index(name) if name in SLOW_FILES_FIRST else len(SLOW_FILES_FIRST)
    items.sort(key=rank)  # stable: the order inside each file is kept
