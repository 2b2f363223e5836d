"""Training a Qwen3 target from scratch with the plain next-token objective: the tiny target the
reproduction drafts for. `pretrain(config)` is what `python -m xpress_jax.pretrain` runs:

corpus (GSM8K chats + standard-library code) -> byte-level BPE -> sharded params -> jitted AdamW
step -> Orbax checkpoints (resumable) -> an HF Qwen3 directory with its tokenizer, a validation
loss, and a report of the greedy answers' repetition.
"""

from __future__ import annotations

import logging
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from xpress_jax import atomic, sharding
from xpress_jax.models.build import target_config, trainable_dtypes
from xpress_jax.config import MASK_FROM_TOKENIZER, dtype
from xpress_jax.errors import ConfigError
from xpress_jax.models.qwen3 import Qwen3
from xpress_jax.train import state as st
from xpress_jax.train import loop

log = logging.getLogger("xpress_jax.pretrain")


def next_token_loss(model: Qwen3, ids, mask):
    """Mean CE of predicting ids[t+1] from ids[..t] over real (non-pad) next tokens.
    ids: [batch, T] int32; mask: [batch, T] bool."""
    logits = model(ids[:, :-1]).logits  # [batch, T-1, vocab] float32
    logp = jax.nn.log_softmax(logits, -1)
    nll = -jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]  # [batch, T-1]
    weight = mask[:, 1:].astype(jnp.float32)
    return jnp.sum(nll * weight) / jnp.maximum(jnp.sum(weight), 1.0), jnp.sum(weight)


def make_step(graphdef, tx, schedule):
    def step(state, batch):
        def loss_fn(params):
            return next_token_loss(st.merge(graphdef, params), batch["ids"], batch["mask"])

        (loss, count), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
        new_state, finite = st.apply_update(state, grads, loss, tx)
        return new_state, {"loss": loss, "tokens": count, "grad_norm": optax.tree.norm(grads),
                           "lr": schedule(state["step"]), "finite": finite}
    return step


class PackedBatches:
    """Next-token batches packed from a token stream: every record's chat tokens followed by
    <|endoftext|>, concatenated, shuffled by record each epoch and cut into rows of max_len tokens,
    so no compute goes to padding (documents may attend across a boundary, as usual in LM
    pretraining). The state (epoch, position) is what a checkpoint saves."""

    def __init__(self, records, tokenizer, max_len: int, batch_size: int, seed: int):
        from xpress_jax.data.byte_tokenizer import pad_id
        from xpress_jax.data.chat import conversation_to_ids
        eos = pad_id(tokenizer)
        self.docs = [np.append(conversation_to_ids(tokenizer, r)[0], eos).astype(np.int32) for r in records]
        self.row, self.batch_size, self.seed = max_len, batch_size, seed
        self.epoch, self.position = 0, 0
        self._stream = self._epoch_stream(0)

    def _epoch_stream(self, epoch: int) -> np.ndarray:
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.docs))
        return np.concatenate([self.docs[i] for i in order])

    def tokens_per_epoch(self) -> int:
        return int(sum(len(d) for d in self.docs))

    def __next__(self) -> dict:
        need = self.batch_size * self.row
        if self.position + need > len(self._stream):  # the epoch's tail is dropped
            self.epoch, self.position = self.epoch + 1, 0
            self._stream = self._epoch_stream(self.epoch)
        ids = self._stream[self.position:self.position + need].reshape(self.batch_size, self.row)
        self.position += need
        return {"ids": ids, "mask": np.ones_like(ids, bool)}

    def get_state(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def set_state(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._stream = self._epoch_stream(self.epoch)


def validation_loss(model: Qwen3, records, tokenizer, max_len: int, batch_size: int = 16) -> float:
    """Token-weighted next-token CE (nats) over every validation record."""
    from xpress_jax.data.byte_tokenizer import pad_id
    from xpress_jax.data.dataset import Tokenize
    tok = Tokenize(tokenizer, max_len)
    graphdef, params = st.split_params(model)
    loss_fn = jax.jit(lambda p, ids, mask: next_token_loss(st.merge(graphdef, p), ids, mask))
    total, count = 0.0, 0.0
    pad = pad_id(tokenizer)
    for i in range(0, len(records), batch_size):
        rows = [tok.map(r)["ids"] for r in records[i:i + batch_size]]
        rows += [np.full(max_len, pad, np.int32)] * (batch_size - len(rows))  # one compiled shape
        ids = np.stack(rows)
        loss, n = loss_fn(params, ids, ids != pad)
        total += float(loss) * float(n)
        count += float(n)
    return total / max(count, 1.0)


def distinct_ngram_ratio(tokens: list[int], n: int) -> float:
    """Unique n-grams / n-grams of one answer (1.0: no n-gram repeats; loops drive it towards 0)."""
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 1.0


def greedy_report(model: Qwen3, tokenizer, records, *, max_new_tokens: int, n: int = 4) -> dict:
    """Greedy answers to validation questions: distinct n-gram ratios and a few examples."""
    from xpress_jax.data.chat import normalise_messages, prompt_ids
    from xpress_jax.decoding.padding import PROMPT_BUCKET
    from xpress_jax.decoding.speculative import DecodingModels, generate
    stops = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    questions = [normalise_messages(r)[0]["content"] for r in records]
    prompts = [prompt_ids(tokenizer, [{"role": "user", "content": q}]) for q in questions]
    out = generate(DecodingModels(model), prompts, decoder="target", max_new_tokens=max_new_tokens, stop_ids=stops,
                   pad_multiple=PROMPT_BUCKET)
    answers = [[t for t in toks if t not in stops] for toks in out.tokens]
    ratios = {f"distinct_{k}": round(float(np.mean([distinct_ngram_ratio(a, k) for a in answers])), 4)
              for k in (1, 2, n)}
    examples = [{"question": q, "answer": tokenizer.decode(a), "stopped": s}
                for q, a, s in zip(questions, answers, out.stopped)]
    return {**ratios, "stopped_fraction": round(float(np.mean(out.stopped)), 3), "examples": examples}


class TargetLayout:
    """The target's parameters (placed on the mesh, or abstract), optimizer and state shardings."""

    def __init__(self, config, *, abstract: bool):
        p = config.pretrain
        self.mesh = sharding.make_mesh(tuple(config.mesh.shape))
        # the target being trained holds float32 master weights like any trainable
        make = lambda: Qwen3(target_config(config), rngs=nnx.Rngs(config.seed), **trainable_dtypes(config))  # noqa: E731
        model = nnx.eval_shape(make) if abstract else make()
        self.graphdef, params = st.split_params(model)
        shardings = st.param_shardings(st.flat_axes(model), {k: v.shape for k, v in params.items()}, self.mesh)
        self.params = params if abstract else {k: jax.device_put(v, shardings[k]) for k, v in params.items()}
        self.schedule = st.make_schedule(p, p.steps)
        self.tx = st.make_optimizer(p, self.schedule)
        replicated = NamedSharding(self.mesh, P())
        abstract_state = jax.eval_shape(lambda q: st.init_state(q, self.tx, config.seed), params)
        self.state_sharding = {"step": replicated, "params": shardings, "key": replicated, "bad_steps": replicated,
                               "opt_state": st.opt_state_shardings(self.tx, abstract_state["opt_state"], shardings,
                                                                   self.mesh)}
        self.abstract_state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                           abstract_state, self.state_sharding)


def write_target(model: Qwen3, out_dir: str, tokenizer_dir: str, dtype_=None) -> None:
    """The target as an HF Qwen3 directory with its tokenizer (end of pretraining, and the export CLI)."""
    from xpress_jax.checkpoints.hf_qwen3 import save_qwen3
    save_qwen3(model, out_dir, tokenizer_dir=tokenizer_dir, dtype=dtype_)


def export_target(config, run: str, out: str, *, step: int | None, dtype_name: str) -> dict:
    """Any Orbax step of a pretraining run as an HF directory."""
    from xpress_jax.train.checkpointer import restore_run_step
    layout = TargetLayout(config, abstract=True)
    step, state = restore_run_step(run, step, layout.abstract_state)
    write_target(st.merge(layout.graphdef, jax.device_get(state["params"])), out, os.path.join(run, "tokenizer"),
                 dtype(dtype_name))
    return {"step": step, "target": out}


def pretrain(config, *, out_dir: str | None = None, stop_after: int | None = None) -> dict:
    """Trains the target of `config.target.arch` on the corpus; resumable. Returns the summary
    that is also written to OUT/pretrain.json."""
    from xpress_jax.data.bpe import MASK_TOKEN, train_bpe
    from xpress_jax.data.chat import load_tokenizer
    from xpress_jax.data.corpus import build_corpus, write_jsonl

    p = config.pretrain
    out_dir = out_dir or p.out_dir
    os.makedirs(out_dir, exist_ok=True)
    started = time.perf_counter()
    train_records, val_records = build_corpus(code_functions=p.code_functions, val_fraction=p.val_fraction)
    tok_dir = os.path.join(out_dir, "tokenizer")
    if os.path.isfile(os.path.join(tok_dir, "tokenizer.json")):
        tokenizer = load_tokenizer(tok_dir)  # a resumed run keeps its vocabulary
    else:
        write_jsonl(train_records, os.path.join(out_dir, "corpus_train.jsonl"))
        write_jsonl(val_records, os.path.join(out_dir, "corpus_val.jsonl"))
        train_bpe(train_records, p.vocab_size, tok_dir)
        tokenizer = load_tokenizer(tok_dir)
    cfg = target_config(config)
    if len(tokenizer) != cfg.vocab_size:
        raise ConfigError(f"target.arch.vocab_size is {cfg.vocab_size} but the BPE has {len(tokenizer)} tokens "
                          f"(pretrain.vocab_size={p.vocab_size}); make them equal")
    if config.drafter.mask_token_id not in (MASK_FROM_TOKENIZER, tokenizer.convert_tokens_to_ids(MASK_TOKEN)):
        raise ConfigError(f"drafter.mask_token_id is {config.drafter.mask_token_id} but the BPE's {MASK_TOKEN} is "
                          f"{tokenizer.convert_tokens_to_ids(MASK_TOKEN)}")

    layout = TargetLayout(config, abstract=False)
    graphdef, tx, state_sharding = layout.graphdef, layout.tx, layout.state_sharding
    batch_sharding = NamedSharding(layout.mesh, sharding.logical_to_spec(("batch", None), (p.batch_size, 1),
                                                                         layout.mesh))
    step_fn = jax.jit(sharding.with_activations_on(layout.mesh, make_step(graphdef, tx, layout.schedule)),
                      in_shardings=(state_sharding, batch_sharding),
                      out_shardings=(state_sharding, None), donate_argnums=(0,))
    # what `xpress_jax.export` rebuilds from
    atomic.write_text(os.path.join(out_dir, "run_config.json"), config.to_json_best_effort(indent=2))

    batches = PackedBatches(train_records, tokenizer, p.max_len, p.batch_size, config.seed)
    ckpt = loop.checkpointer(p, out_dir)
    resumed = loop.resume(ckpt, layout.abstract_state, batches)
    if resumed is not None:
        start, state = resumed
    else:
        start = 0
        state = jax.jit(lambda q: st.init_state(q, tx, config.seed), out_shardings=state_sharding)(layout.params)

    def place(state, local):
        return step_fn(state, {k: jax.device_put(np.asarray(v), batch_sharding) for k, v in local.items()})

    state, step, last = loop.run_loop(place, state, batches, section=p, total_steps=p.steps, start=start,
                                      ckpt=ckpt, out_dir=out_dir, desc="pretrain target",
                                      count_tokens=lambda local: int(np.sum(local["mask"])), stop_after=stop_after)
    summary = {"step": step, "steps": p.steps}
    if step < p.steps:
        return summary
    trained = st.merge(graphdef, jax.device_get(state["params"]))
    write_target(trained, out_dir, tok_dir)  # OUT is the HF directory
    summary.update(
        epochs=round(step * p.batch_size * p.max_len / batches.tokens_per_epoch(), 3),
        params=int(sum(math.prod(v.shape) for v in layout.params.values())),
        train_records=len(train_records), val_records=len(val_records), vocab_size=len(tokenizer),
        train_loss=last.get("loss"), val_loss=round(validation_loss(trained, val_records, tokenizer, p.max_len), 4),
        seconds=round(time.perf_counter() - started, 1))
    report_records = [r for r in val_records if r["id"].startswith("gsm8k")][:p.report_prompts // 2]
    report_records += [r for r in val_records if r["id"].startswith("stdlib")][:p.report_prompts // 2]
    summary["greedy"] = greedy_report(trained, tokenizer, report_records, max_new_tokens=p.report_max_new_tokens)
    atomic.write_json(os.path.join(out_dir, "pretrain.json"), summary)
    return summary
