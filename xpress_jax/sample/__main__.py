"""Greedy generation with the Qwen3 target through the jitted KV-cache loop.

    python -m xpress_jax.sample                                   # tiny random model, CPU, seconds
    python -m xpress_jax.sample --config=configs/qwen3_8b.py --config.target.hf_dir=/ckpt/Qwen3-8B

With a checkpoint directory the prompt goes through the Qwen3 chat template (thinking off) and
the reply is decoded to text; the tiny random default prints token ids and throughput.
"""

from __future__ import annotations

import json
import logging
import os
import time

import jax
import numpy as np

from absl import flags

from xpress_jax import cli
from xpress_jax.models.build import build_target
from xpress_jax.decoding.speculative import generate_greedy

log = logging.getLogger("xpress_jax.sample")


FLAGS = flags.FlagValues()  # no flags beyond --config


def main(config):
    model = build_target(config)
    tokenizer = None
    hf_dir = config.target.hf_dir
    if hf_dir and os.path.isfile(os.path.join(hf_dir, "tokenizer_config.json")):
        from xpress_jax.data.chat import load_tokenizer, prompt_ids
        tokenizer = load_tokenizer(hf_dir)
        prompt = prompt_ids(tokenizer, [{"role": "user", "content": config.sample.prompt}])
        stop = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]
    else:
        rng = np.random.default_rng(config.seed)
        prompt = rng.integers(0, model.cfg.vocab_size, size=16).tolist()
        stop = []
    kw = dict(max_new_tokens=config.sample.max_new_tokens, stop_ids=stop, max_len=config.sample.max_len)
    t0 = time.perf_counter()
    generate_greedy(model, [prompt], **kw)  # compile
    t1 = time.perf_counter()
    out = generate_greedy(model, [prompt], **kw)
    t2 = time.perf_counter()
    tokens = out.tokens[0]
    result = {"prompt_tokens": len(prompt), "new_tokens": len(tokens), "compile_s": round(t1 - t0, 3),
              "tokens_per_s": round(len(tokens) / (t2 - t1), 1), "device": jax.devices()[0].device_kind,
              "tokens": tokens}
    if tokenizer is not None:
        result["text"] = tokenizer.decode(tokens, skip_special_tokens=True)
    print(json.dumps(result))


if __name__ == "__main__":
    cli.run(main, FLAGS)
