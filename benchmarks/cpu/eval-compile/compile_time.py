"""Seconds to trace + lower and to compile the eval's decode loop for Qwen3-8B (configs/qwen3_8b.py:
bf16 target, its DFlash drafter and heads in eval.drafter_dtype) on this machine's CPU, from
abstract weights (shapes and dtypes only: nothing is allocated), batch 1, one prompt bucket
(64 tokens) and the config's eval.max_new_tokens. With $JAX_COMPILATION_CACHE_DIR set, the
persistent cache every command keeps: a second run times a second run's compile (a cache read).
Run from the repository root:
    python benchmarks/cpu/eval-compile/compile_time.py [DECODER ...]   # default: target dflash xpress"""
import json
import os
import sys
import time

import jax
from flax import nnx

from xpress_jax import cli
from xpress_jax.bench.decode import loop_compile_seconds
from xpress_jax.config import dtype
from xpress_jax.decoding.padding import PROMPT_BUCKET
from xpress_jax.decoding.settings import DecodeSettings
from xpress_jax.decoding.speculative import DecodingModels
from xpress_jax.methods import DECODERS, head_of
from xpress_jax.models.build import build_target, drafter_config, new_drafter, new_head

cache = os.environ.get("JAX_COMPILATION_CACHE_DIR")
if cache:
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
config = cli.load_config("configs/qwen3_8b.py")
target = build_target(config, abstract=True)
dcfg = drafter_config(config, target.cfg)
dtypes = {"dtype": dtype(config.eval.drafter_dtype), "param_dtype": dtype(config.eval.drafter_dtype)}
drafter = nnx.eval_shape(lambda: new_drafter(config, dcfg, dtypes))
new_tokens = int(config.eval.max_new_tokens)
report = {"date": time.strftime("%Y-%m-%d"), "jax": jax.__version__, "cpu_count": os.cpu_count(),
          "persistent_cache": bool(cache),
          "shapes": {"target_layers": target.cfg.num_hidden_layers, "hidden": target.cfg.hidden_size,
                     "vocab": target.cfg.vocab_size, "drafter_layers": dcfg.num_hidden_layers,
                     "block": dcfg.block_size, "prompt_bucket": PROMPT_BUCKET, "max_new_tokens": new_tokens,
                     "batch": 1},
          "seconds": {}}
for decoder in sys.argv[1:] or ("target", "dflash", "xpress"):
    head_name = head_of(decoder)
    head = nnx.eval_shape(lambda: new_head(head_name, config, dcfg, dtypes=dtypes)) if head_name else None
    models = DecodingModels(target, drafter if DECODERS[decoder].drafter else None, head)
    report["seconds"][decoder] = loop_compile_seconds(models, decoder, DecodeSettings(), batch=1,
                                                      prompt_len=PROMPT_BUCKET, new_tokens=new_tokens)
    print(decoder, report["seconds"][decoder], flush=True)
print(json.dumps(report))
