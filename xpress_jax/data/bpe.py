"""A small byte-level BPE for the tiny target, trained with the `tokenizers` library and saved as
an HF tokenizer (tokenizer.json + tokenizer_config.json) that `transformers` loads offline.

It carries Qwen3's chat specials (`<|endoftext|>` as padding, `<|im_start|>`, `<|im_end|>` as
end of turn), the think tags, and `<|mask|>` for the DFlash drafter's masked block positions.
The special tokens take the first ids, in the order of SPECIALS.
"""

from __future__ import annotations

import os
from typing import Iterable

from xpress_jax.data.chat import normalise_messages

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|mask|>")
MASK_TOKEN = "<|mask|>"
# Qwen3's template with thinking switched off, as data/chat.py renders every turn
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}{% endif %}")
# Qwen2/Qwen3's pre-tokenizer split. Its `\s*[\r\n]+` keeps a run of newlines one piece whatever
# follows, so the prompt's trailing "</think>\n\n" tokenizes as it does inside a training chat. With
# the GPT-2 split, "\n\nHe" becomes "\n" "\n" "He" in training while a prompt that ends in "\n\n"
# gets the merged "\n\n": a boundary the target never saw, after which its answers wander.
PRETOKENIZE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _texts(records: Iterable[dict]) -> Iterable[str]:
    """What the BPE learns from: every turn's text and the role lines (specials are added, not learned)."""
    for r in records:
        for m in normalise_messages(r):
            yield f"{m['role']}\n{m['content']}\n"


def train_bpe(records: list[dict], vocab_size: int, out_dir: str):
    """Trains the BPE on the records' text and saves it to out_dir; returns the transformers tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(PRETOKENIZE), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(_texts(records), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        additional_special_tokens=list(SPECIALS[1:]))
    tokenizer.chat_template = CHAT_TEMPLATE
    os.makedirs(out_dir, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    return tokenizer
