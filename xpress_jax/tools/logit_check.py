"""Compares this port's logits with transformers' on the same tokens.

    python -m xpress_jax.tools.logit_check --hf_dir=DIR [--dtype=float32] [--prompt=TEXT | --random_tokens=N]

Prints one JSON line (max_abs_diff, kl = mean KL(p_hf || p_jax) of the next-token distributions)
and exits 1 when max_abs_diff exceeds the tolerance for the dtype.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from xpress_jax import cli
from xpress_jax.errors import InputError


TOLERANCE = {"float32": 1e-4, "bfloat16": 0.5}  # bf16 logits round at ~2^-8 of their magnitude

FLAGS = flags.FlagValues()  # this command's own flags (cli.invoke parses them)
flags.DEFINE_string("hf_dir", None, "Local HF Qwen3 directory (config.json + safetensors).", required=True,
                    flag_values=FLAGS)
flags.DEFINE_enum("dtype", "float32", list(TOLERANCE), "Compute and parameter dtype of both models.", flag_values=FLAGS)
flags.DEFINE_string("prompt", "The quick brown fox jumps over the lazy dog. Speculative decoding",
                    "Text to run, through the directory's tokenizer.", flag_values=FLAGS)
flags.DEFINE_integer("random_tokens", 0, "Compare on this many random token ids instead of --prompt (a directory "
                     "without a tokenizer).", flag_values=FLAGS)
flags.DEFINE_float("tolerance", None, "Override the max_abs_diff tolerance of the dtype.", flag_values=FLAGS)


def tokens_for(hf_dir: str, prompt: str, vocab_size: int, n_random: int) -> tuple[np.ndarray, str]:
    """[1, n] token ids: `n_random` random ids when asked for, else the prompt through the
    directory's tokenizer (refused in one line when it has none, or the prompt makes no tokens)."""
    if n_random > 0:
        return np.random.default_rng(0).integers(0, vocab_size, size=(1, n_random), dtype=np.int32), "random"
    if not any(os.path.isfile(os.path.join(hf_dir, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        raise InputError(f"{hf_dir} has no tokenizer (tokenizer.json or tokenizer_config.json) to read --prompt "
                         "with; add one, or pass --random_tokens=N to compare on N random token ids")
    from xpress_jax.data.chat import load_tokenizer
    ids = load_tokenizer(hf_dir)(prompt, add_special_tokens=False)["input_ids"]
    if not ids:
        raise InputError(f"--prompt={prompt!r} makes no tokens")
    return np.asarray([ids], np.int32), "prompt"


def compare(hf_dir: str, dtype: str, prompt: str, n_random: int = 0) -> dict:
    import torch
    import transformers

    from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
    from xpress_jax.config import DTYPES

    if dtype == "float32":
        jax.config.update("jax_default_matmul_precision", "highest")
    jdt = DTYPES[dtype]
    model = load_qwen3(hf_dir, dtype=jdt, param_dtype=jdt)
    tokens, source = tokens_for(hf_dir, prompt, model.cfg.vocab_size, n_random)
    ours = np.asarray(model(jnp.asarray(tokens)).logits, np.float64)  # [1, seq, vocab]
    del model
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=getattr(torch, dtype)).eval()
    with torch.no_grad():
        ref = hf(torch.from_numpy(tokens.astype(np.int64))).logits.double().numpy()
    log_p = ref - np.logaddexp.reduce(ref, axis=-1, keepdims=True)
    log_q = ours - np.logaddexp.reduce(ours, axis=-1, keepdims=True)
    kl = float(np.mean(np.sum(np.exp(log_p) * (log_p - log_q), axis=-1)))
    return {"max_abs_diff": float(np.max(np.abs(ours - ref))), "kl": kl, "dtype": dtype,
            "tokens": int(tokens.shape[1]), "token_source": source}


def main(config_unused):
    del config_unused  # the checkpoint's own config.json is what counts
    result = compare(FLAGS.hf_dir, FLAGS.dtype, FLAGS.prompt, FLAGS.random_tokens)
    tolerance = FLAGS.tolerance if FLAGS.tolerance is not None else TOLERANCE[FLAGS.dtype]
    result.update(tolerance=tolerance, passed=result["max_abs_diff"] <= tolerance)
    print(json.dumps(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    cli.run(main, FLAGS)
