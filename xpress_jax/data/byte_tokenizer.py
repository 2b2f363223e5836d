"""A byte-level stand-in for the Qwen3 tokenizer, for tiny random models without a checkpoint.

UTF-8 bytes are token ids 0..255. The chat specials keep their Qwen3 ids when the vocabulary has
them, or take ids 256.. in a small vocabulary (tiny CPU configs), so chat rendering, loss masks
and stop tokens behave as with the real tokenizer. Only for smoke runs: a real run uses the
tokenizer of the target's checkpoint directory.
"""

from __future__ import annotations

import re

SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
            "<think>": 151667, "</think>": 151668}
_SPLIT = re.compile("(" + "|".join(re.escape(t) for t in SPECIALS) + ")")
COMPACT = {t: 256 + i for i, t in enumerate(SPECIALS)}


class ByteTokenizer:
    chat_template = None

    def __init__(self, vocab_size: int = 151936):
        self.specials = SPECIALS if vocab_size > max(SPECIALS.values()) else COMPACT
        if vocab_size <= max(self.specials.values()):
            raise ValueError(f"ByteTokenizer needs a vocabulary of at least {max(COMPACT.values()) + 1}")
        self.pad_token_id = self.specials["<|endoftext|>"]

    def __call__(self, text: str, add_special_tokens: bool = False, return_offsets_mapping: bool = False):
        ids, offsets, pos = [], [], 0
        for piece in _SPLIT.split(text):
            if piece in self.specials:
                ids.append(self.specials[piece])
                offsets.append((pos, pos + len(piece)))
            else:
                for ch in piece:
                    for byte in ch.encode("utf-8"):
                        ids.append(byte)
                        offsets.append((pos, pos + 1))
                    pos += 1
                continue
            pos += len(piece)
        out = {"input_ids": ids}
        if return_offsets_mapping:
            out["offset_mapping"] = offsets
        return out

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.specials[token]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        inverse = {v: k for k, v in self.specials.items()}
        out, buf = [], bytearray()
        for i in ids:
            if i < 256:
                buf.append(i)
                continue
            out.append(buf.decode("utf-8", "replace"))
            buf = bytearray()
            if not skip_special_tokens and i in inverse:
                out.append(inverse[i])
        out.append(buf.decode("utf-8", "replace"))
        return "".join(out)


TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")  # what AutoTokenizer reads offline


def tokenizer_for(hf_dir: str, vocab_size: int = 151936):
    """The tokenizer of a checkpoint directory; a ByteTokenizer for the vocabulary only when there
    is no directory (a random target). A directory without its tokenizer files is refused in one
    line: a real target decoded through bytes would train and evaluate on the wrong tokens."""
    import os
    if not hf_dir:
        return ByteTokenizer(vocab_size)
    from xpress_jax.data.chat import load_tokenizer
    from xpress_jax.errors import CheckpointError
    missing = [f for f in TOKENIZER_FILES if not os.path.isfile(os.path.join(hf_dir, f))]
    if missing:
        raise CheckpointError(f"{hf_dir}: no tokenizer ({' and '.join(missing)} missing); copy the target's "
                              "tokenizer files there, or set data.tokenizer_dir to a directory that has them")
    return load_tokenizer(hf_dir)


def pad_id(tokenizer) -> int:
    pid = getattr(tokenizer, "pad_token_id", None)
    return pid if pid is not None else tokenizer.convert_tokens_to_ids("<|endoftext|>")
