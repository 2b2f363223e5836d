"""The tiny target's corpus, its BPE tokenizer, and next-token pretraining."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from compiled import jit_call
from xpress_jax.data.bpe import MASK_TOKEN, SPECIALS, train_bpe
from xpress_jax.data.chat import conversation_to_ids, load_tokenizer, prompt_ids, render
from xpress_jax.data.corpus import CODE_INSTRUCTION, build_corpus, is_validation, stdlib_code_records
from xpress_jax.data.questions import load_questions
from xpress_jax.models.qwen3 import Qwen3, Qwen3Config
from xpress_jax.pretrain.target import PackedBatches, distinct_ngram_ratio, next_token_loss


def test_stdlib_code_records_are_humaneval_shaped():
    records = stdlib_code_records(50)
    assert len(records) == 50 and len({r["id"] for r in records}) == 50
    assert stdlib_code_records(20) == records[:20]  # a smaller corpus is a prefix of a larger one
    for r in records:
        prompt, body = (t["content"] for t in r["conversations"])
        assert prompt.startswith(CODE_INSTRUCTION + "def ") and ('"""' in prompt or "'''" in prompt)
        assert body.strip() and body.lstrip("\n").startswith((" ", "\t")) and "def " + r["id"].split(":")[1] in prompt
        compile(prompt[len(CODE_INSTRUCTION):] + body, r["id"], "exec")  # signature + docstring + body is Python


def test_corpus_split_is_stable_disjoint_and_excludes_the_evaluation_questions():
    train, val = build_corpus(code_functions=100, val_fraction=0.05)
    train_ids, val_ids = {r["id"] for r in train}, {r["id"] for r in val}
    assert not train_ids & val_ids and 0.02 < len(val) / (len(train) + len(val)) < 0.08
    assert all(is_validation(i, 0.05) for i in val_ids)
    questions = {t["content"] for r in train + val for t in r["conversations"] if t["role"] == "user"}
    for bench in ("gsm8k", "humaneval"):
        assert not questions & set(load_questions(bench)), bench


def test_bpe_loads_in_transformers_with_the_chat_specials(tmp_path):
    train, _ = build_corpus(code_functions=50, val_fraction=0.02)
    train_bpe(train[:400], 600, str(tmp_path))
    tok = load_tokenizer(str(tmp_path))
    assert len(tok) == 600
    assert [tok.convert_tokens_to_ids(t) for t in SPECIALS] == list(range(len(SPECIALS)))
    assert tok.pad_token_id == 0 and tok.convert_tokens_to_ids(MASK_TOKEN) == 5
    text, _ = render([{"role": "user", "content": "What is 3 + 4?"}, {"role": "assistant", "content": "7"}],
                     add_generation_prompt=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    assert ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 2 and 3 in ids and 4 in ids  # think tags
    # the chat template renders what data/chat.py renders
    msgs = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        render(msgs, add_generation_prompt=True)[0]
    _, mask = conversation_to_ids(tok, {"conversations": [{"role": "user", "content": "a"},
                                                          {"role": "assistant", "content": "bcd"}]})
    assert tok.decode(np.asarray(ids)[:0].tolist()) == "" and mask.sum() >= 2


def test_bpe_prompt_is_a_prefix_of_the_training_chat(tmp_path):
    """What the target sees at inference (prompt_ids, ending in "</think>\\n\\n") must be the exact
    token prefix of what it trained on; else every greedy answer starts from an unseen boundary."""
    train, _ = build_corpus(code_functions=200, val_fraction=0.02)
    records = [r for r in train if r["id"].startswith("gsm8k")][:150] + \
        [r for r in train if r["id"].startswith("stdlib")][:150]
    train_bpe(records, 800, str(tmp_path))
    tok = load_tokenizer(str(tmp_path))
    for rec in records:
        ids, mask = conversation_to_ids(tok, rec)
        prompt = prompt_ids(tok, rec["conversations"][:1])
        assert ids[:len(prompt)].tolist() == prompt and int(np.argmax(mask)) == len(prompt), rec["id"]


def _tiny_qwen3(vocab=40):
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=True)
    return Qwen3(cfg, rngs=nnx.Rngs(0))


def test_next_token_loss_matches_numpy():
    model = _tiny_qwen3()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 40, (2, 9)).astype(np.int32)
    mask = np.ones_like(ids, bool)
    mask[1, 6:] = False
    loss, count = nnx.jit(next_token_loss)(model, jnp.asarray(ids), jnp.asarray(mask))
    logits = np.asarray(jit_call(model, jnp.asarray(ids[:, :-1])).logits, np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    nll = -np.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0]
    w = mask[:, 1:]
    assert float(count) == w.sum() and float(loss) == pytest.approx((nll * w).sum() / w.sum(), rel=1e-5)


class _CharTokenizer:
    pad_token_id = 0

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        out = {"input_ids": [1 + ord(c) % 50 for c in text]}
        if return_offsets_mapping:
            out["offset_mapping"] = [(i, i + 1) for i in range(len(text))]
        return out


def test_packed_batches_cover_the_stream_without_padding_and_resume_exactly():
    records = [{"id": str(i), "conversations": [{"role": "user", "content": "q" * (3 + i % 5)},
                                                {"role": "assistant", "content": "a" * (7 + i % 3)}]}
               for i in range(30)]
    a = PackedBatches(records, _CharTokenizer(), max_len=16, batch_size=2, seed=0)
    first = [next(a)["ids"] for _ in range(5)]
    assert all(b.shape == (2, 16) for b in first)
    state = a.get_state()
    rest = [next(a)["ids"] for _ in range(90)]  # crosses an epoch boundary
    b = PackedBatches(records, _CharTokenizer(), max_len=16, batch_size=2, seed=0)
    b.set_state(json.loads(json.dumps(state)))
    np.testing.assert_array_equal(np.stack(rest), np.stack([next(b)["ids"] for _ in range(90)]))
    stream = np.concatenate([x.ravel() for x in first])
    np.testing.assert_array_equal(stream, PackedBatches(records, _CharTokenizer(), 16, 2, 0)._epoch_stream(0)[:160])
    assert (stream == 0).sum() >= 1  # <|endoftext|> ends each document
    assert a.epoch >= 1


def test_distinct_ngram_ratio():
    assert distinct_ngram_ratio([1, 2, 3, 4, 5], 2) == 1.0
    assert distinct_ngram_ratio([7, 7, 7, 7, 7], 2) == 0.25
    assert distinct_ngram_ratio([1, 2, 1, 2, 1, 2], 2) == pytest.approx(2 / 5)
    assert distinct_ngram_ratio([1], 4) == 1.0


def test_a_few_pretraining_steps_lower_the_loss(tmp_path):
    """The jitted step on a repeated batch: the next-token loss falls."""
    from xpress_jax.train import state as st
    from xpress_jax.pretrain.target import make_step
    import ml_collections
    p = ml_collections.ConfigDict({"lr": 1e-2, "warmup_fraction": 0.1, "final_lr_fraction": 0.1, "grad_clip": 1.0,
                                   "b1": 0.9, "b2": 0.95, "weight_decay": 0.0})
    model = _tiny_qwen3()
    graphdef, params = st.split_params(model)
    schedule = st.make_schedule(p, 30)
    tx = st.make_optimizer(p, schedule)
    state = st.init_state(params, tx, 0)
    step = jax.jit(make_step(graphdef, tx, schedule))
    ids = np.tile(np.arange(1, 17, dtype=np.int32), (4, 1))
    batch = {"ids": ids, "mask": np.ones_like(ids, bool)}
    losses = []
    for _ in range(30):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    assert losses[-1] < 0.5 * losses[0] and int(state["step"]) == 30
