"""Qwen3 chat formatting with thinking disabled, and the assistant-token loss mask.

Training renders every assistant turn as the target produces it at inference with thinking off:
`<|im_start|>assistant\n<think>\n\n</think>\n\n{content}<|im_end|>\n`. (Qwen3's own template
drops the empty think block from turns before the last user message; rendering it everywhere
keeps each turn identical to what the drafter sees when that turn is generated.) The loss mask
covers `{content}<|im_end|>`, found through the tokenizer's character offsets, so it is exact
whatever the BPE merges do at segment edges.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from xpress_jax.errors import DataError

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
THINK_OFF = "<think>\n\n</think>\n\n"
ROLES = ("system", "user", "assistant")
_SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system", "user": "user",
                   "assistant": "assistant"}


def load_tokenizer(path: str):
    """The tokenizer of a checkpoint directory (through transformers, offline)."""
    from transformers import AutoTokenizer
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer directory {path!r} does not exist")
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def _text(content) -> str | None:
    """A turn's text: a string, or OpenAI-style parts `[{"type": "text", "text": ...}]` joined
    (what vLLM and SGLang requests carry); None for anything else (an image part)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    return None


def normalise_messages(record: dict[str, Any]) -> list[dict[str, str]]:
    """`{"conversations": [{"role", "content"}...]}` (ShareGPT `from`/`value`, OpenAI `messages`
    and text-part content also accepted: SpecForge's regenerated files train as they are)."""
    turns = record.get("conversations", record.get("messages"))
    if not isinstance(turns, list) or not turns:
        raise DataError(f"record {record.get('id', '?')!r}: no 'conversations' list")
    messages = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise DataError(f"record {record.get('id', '?')!r}, turn {i}: a turn must be an object with role and "
                            f"content, found {type(t).__name__}")
        role = t.get("role", _SHAREGPT_ROLES.get(t.get("from", ""), t.get("from")))
        content = _text(t.get("content", t.get("value")))
        if role not in ROLES or content is None:
            raise DataError(f"record {record.get('id', '?')!r}, turn {i}: needs a role in {ROLES} "
                            f"and text content, got role={role!r}")
        if role == "assistant" and t.get("reasoning_content"):  # SpecForge's --reasoning save
            raise DataError(f"record {record.get('id', '?')!r}, turn {i}: the assistant turn carries "
                            "reasoning_content (the target answered with thinking on), but drafters train "
                            "and decode with thinking off; regenerate with --reasoning disable")
        if role == "assistant" and "<think>" in content:  # regenerated with thinking on, no reasoning parser
            raise DataError(f"record {record.get('id', '?')!r}, turn {i}: the assistant turn's content holds a "
                            "<think> block (the target answered with thinking on), but drafters train and decode "
                            "with thinking off; regenerate with --reasoning disable")
        messages.append({"role": role, "content": content})
    return messages


def render(messages: Sequence[dict[str, str]], *, add_generation_prompt: bool,
           earlier_think_blocks: bool = True) -> tuple[str, list[tuple[int, int]]]:
    """The chat text and the character spans [start, end) that the loss covers.
    earlier_think_blocks=False renders assistant turns before the last user turn as Qwen3's own
    template does at inference, without the empty think block (how the DFlash harness asks
    MT-Bench's second turn)."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    parts: list[str] = []
    spans: list[tuple[int, int]] = []
    pos = 0

    def emit(text: str) -> None:
        nonlocal pos
        parts.append(text)
        pos += len(text)

    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            emit(f"{IM_START}assistant\n{THINK_OFF if earlier_think_blocks or i > last_user else ''}")
            start = pos
            emit(m["content"] + IM_END)
            spans.append((start, pos))
            emit("\n")
        else:
            emit(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n")
    if add_generation_prompt:
        emit(f"{IM_START}assistant\n{THINK_OFF}")
    return "".join(parts), spans


def prompt_text(messages: Sequence[dict[str, str]], earlier_think_blocks: bool = True) -> str:
    """A prompt ending in the assistant header with thinking disabled. earlier_think_blocks=False:
    earlier assistant turns as Qwen3's chat template writes them at inference, as plain text (eval's
    later turns); True: with the empty think block, as training renders them (regeneration)."""
    if messages and messages[-1]["role"] == "assistant":
        raise DataError("a prompt must not end with an assistant turn")
    return render(messages, add_generation_prompt=True, earlier_think_blocks=earlier_think_blocks)[0]


def prompt_ids(tokenizer, messages: Sequence[dict[str, str]], earlier_think_blocks: bool = True) -> list[int]:
    """Token ids of `prompt_text(messages, earlier_think_blocks)`."""
    return tokenizer(prompt_text(messages, earlier_think_blocks), add_special_tokens=False)["input_ids"]


def conversation_to_ids(tokenizer, record: dict[str, Any], max_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Token ids [seq] int32 and loss mask [seq] bool (True on assistant content and its <|im_end|>)."""
    text, spans = render(normalise_messages(record), add_generation_prompt=False)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], np.int32)
    starts = np.asarray([s for s, _ in enc["offset_mapping"]], np.int64)
    mask = np.zeros(len(ids), bool)
    for lo, hi in spans:
        mask |= (starts >= lo) & (starts < hi)
    if max_len is not None:
        ids, mask = ids[:max_len], mask[:max_len]
    return ids, mask
