"""python -m xpress_jax.bench --suite=heads|e2e|decode|train|regen|all [--out=DIR]

Each suite writes DIR/SUITE.json (date, device, jax version, shapes, every figure) and its PNG
plots, and prints a short summary; while it runs, SUITE.json holds what it has measured so far
("complete": false). `--config` gives the shapes of the heads suite and the large
config of the train suite's memory report (default configs/qwen3_8b.py). The e2e suite projects
early stop's latency onto the heads suite's latency-vs-iterations line: from the same run, or from the
heads.json an earlier run left in DIR. The decode suite times one decode-loop step of every
decoder against target-only decoding on random weights at `--decode_config`'s shapes (default
configs/tiny_repro.py, with `--decode_set` overrides): the tau each must reach to break even on
this machine. The regen suite times regeneration with continuous batching against a static batch,
and admissions at each prompt's own bucket against the queue's longest (with the share of wall
time spent admitting), on the shipped tiny target (or `--regen_target`), over this process's devices (simulated ones with
XLA_FLAGS=--xla_force_host_platform_device_count=N).
"""

from __future__ import annotations

import datetime
import json
import os
import platform

from absl import flags

from xpress_jax import atomic, cli
from xpress_jax.errors import InputError

SUITES = ("heads", "e2e", "decode", "train", "regen")
FLAGS = flags.FlagValues()  # this command's own flags (cli.invoke parses them)
DEFAULT_CONFIG = cli.config_path("qwen3_8b.py")
flags.DEFINE_enum("suite", "heads", SUITES + ("all",), "Which benchmarks to run.", flag_values=FLAGS)
flags.DEFINE_string("out", "benchmarks/cpu", "Directory for the JSON results and plots.", flag_values=FLAGS)
flags.DEFINE_integer("reps", 5, "Timed repetitions per call (heads, e2e: the median is reported; decode: the fastest).",
                     flag_values=FLAGS)
flags.DEFINE_list("batches", ["1", "8"], "Batch sizes of the heads and e2e suites.", flag_values=FLAGS)
flags.DEFINE_integer("context", 512, "heads: committed positions the drafter attends to.", flag_values=FLAGS)
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                  "heads: compute and weight dtype (float32 on CPUs, where bfloat16 matmuls are emulated).",
                  flag_values=FLAGS)
flags.DEFINE_string("run_dir", "runs/repro", "e2e: a finished tiny reproduction (python -m xpress_jax.reproduce --config=configs/tiny_repro.py).",
                    flag_values=FLAGS)
flags.DEFINE_string("repro_config", cli.config_path("tiny_repro.py"), "e2e: the config that reproduction ran.",
                    flag_values=FLAGS)
flags.DEFINE_integer("num_prompts", 8, "e2e: GSM8K test prompts.", flag_values=FLAGS)
flags.DEFINE_integer("max_new_tokens", 128, "e2e: tokens generated per prompt.", flag_values=FLAGS)
flags.DEFINE_integer("candidate_k", 8, "e2e: candidates per position of XPress candidate mode (top-k).",
                     flag_values=FLAGS)
flags.DEFINE_string("decode_config", cli.config_path("tiny_repro.py"),
                    "decode: the config whose shapes are timed on random weights (configs/qwen3_8b.py on an accelerator).",
                    flag_values=FLAGS)
flags.DEFINE_list("contexts", ["128", "1024"], "decode: prompt lengths (committed tokens) the steps are timed at.",
                  flag_values=FLAGS)
flags.DEFINE_integer("decode_tokens", 128, "decode: tokens generated per timed run.", flag_values=FLAGS)
flags.DEFINE_list("decode_set", [], "decode: overrides of --decode_config's fields, as --config.KEY=VALUE takes them, "
                  "e.g. target.arch.num_hidden_layers=24 (unknown keys are errors): other shapes, no new config file.",
                  flag_values=FLAGS)
flags.DEFINE_list("decode_variants", [], "decode: time only these labels (target-only is always timed); default all.",
                  flag_values=FLAGS)
flags.DEFINE_bool("compile_only", False, "decode, heads: compile each program on abstract weights and report the "
                  "seconds (nothing allocated, nothing run): an 8B rehearsal on a small host.", flag_values=FLAGS)
flags.DEFINE_list("verify_tokens", ["0"], "decode: draft tokens the target verifies per step (0: the whole block); "
                  "each drafter variant is timed at each, labelled LABEL_vM for M > 0.", flag_values=FLAGS)
flags.DEFINE_string("train_config", cli.config_path("tiny.py"), "train: the config whose step is timed.",
                    flag_values=FLAGS)
flags.DEFINE_integer("train_steps", 5, "train: timed steps per variant.", flag_values=FLAGS)
flags.DEFINE_list("anchor_chunks", [], "train: anchor-chunk sizes each timed with and without rematerialisation; "
                  "default all of --train_config's anchors and a quarter of them.", flag_values=FLAGS)
flags.DEFINE_list("frozen_heads", ["markov", "xpress"], "train: heads whose step on a frozen drafter is timed "
                  "against the same step with a backward pass through the drafter.", flag_values=FLAGS)
flags.DEFINE_string("regen_target", "", "regen: an HF Qwen3 directory with its tokenizer (default: the shipped tiny "
                    "target).", flag_values=FLAGS)
flags.DEFINE_integer("regen_prompts", 48, "regen: questions, a mix of the four shipped sets (mixed answer lengths).",
                     flag_values=FLAGS)
flags.DEFINE_integer("regen_max_new_tokens", 160, "regen: longest answer.", flag_values=FLAGS)
flags.DEFINE_list("regen_batches", ["4", "8", "16"], "regen: rows decoded together (over all devices).",
                  flag_values=FLAGS)
flags.DEFINE_list("scaling_devices", ["1", "2", "4", "8"], "train: simulated device counts (at most 8) of the "
                  "--config step's strong and weak scaling table.", flag_values=FLAGS)


def machine() -> dict:
    import jax
    return {"date": datetime.date.today().isoformat(), "device": jax.devices()[0].device_kind,
            "device_count": jax.device_count(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "jax": jax.__version__}


def partial_writer(out: str, suite: str, **fields):
    """progress(result so far) for a suite: OUT/SUITE.json with "complete": false, so a run cut
    short (gpu.sh's stage limits) keeps every figure measured before the cut."""
    return lambda partial: atomic.write_json(os.path.join(out, f"{suite}.json"),
                                             {"suite": suite, "complete": False, **machine(), **fields, **partial})


def run_heads(config, out: str) -> dict:
    from xpress_jax.report import plots
    from xpress_jax.bench import heads
    with config.unlocked():
        config.dtype = config.param_dtype = FLAGS.dtype
    result = heads.suite(config, batches=[int(b) for b in FLAGS.batches], context=FLAGS.context, reps=FLAGS.reps,
                         progress=partial_writer(out, "heads"), compile_only=FLAGS.compile_only)
    if FLAGS.compile_only:
        for batch, r in result["batches"].items():
            seconds = sum(r["compile_s"].values())
            print(f"heads batch {batch}, compiled: {len(r['compile_s'])} programs in {seconds:.1f} s")
        return result
    plots.latency_against_iterations(result, os.path.join(out, "heads-latency_vs_iterations.png"))
    plots.draft_step_breakdown(result, os.path.join(out, "heads-draft_step.png"))
    for batch, r in result["batches"].items():
        ratio = r["ratio_to_markov"]
        print(f"heads batch {batch}: XPress 4 iterations {ratio['xpress_it4']:.2f}x Markov, early stop "
              f"{ratio['xpress_it4_early_stop']:.2f}x, top-32 {ratio['xpress_it4_top32']:.3f}x; "
              f"Markov {r['costs']['markov']['bound']}-bound; drafter forward {r['seconds']['drafter_forward'] * 1e3:.1f} ms, "
              f"LM head {r['seconds']['lm_head'] * 1e3:.1f} ms, Markov {r['seconds']['markov'] * 1e3:.1f} ms")
        roof = r["h200_roofline"]
        print(f"heads batch {batch}: a Jacobi iteration {r['per_iteration_s'] * 1e3:.2f} ms "
              f"({r['per_iteration_vs_markov_block']:.2f} of a Markov block); it reads "
              f"{roof['xpress_iteration_bytes'] / 1e6:.1f} MB, {roof['xpress_iteration_bound_s'] * 1e6:.2f} us at an "
              f"H200's 4.8 TB/s (a Markov block: {roof['markov_block_bytes'] / 1e6:.1f} MB, "
              f"{roof['markov_block_bound_s'] * 1e6:.2f} us)")
    return result


def run_e2e(out: str, heads_result: dict | None) -> dict:
    from xpress_jax.report import plots
    from xpress_jax.bench import e2e
    repro = cli.load_config(FLAGS.repro_config)
    result = e2e.suite(repro, FLAGS.run_dir, out, num_prompts=FLAGS.num_prompts, max_new_tokens=FLAGS.max_new_tokens,
                       top_k=FLAGS.candidate_k, batches=[int(b) for b in FLAGS.batches], reps=FLAGS.reps)
    if heads_result is not None:
        used = result["real_blocks"]["early_stop_iterations"]["xpress_it4_early_stop"]
        result["projected_early_stop_at_heads_shapes"] = e2e.projected_early_stop(heads_result, used)
    plots.e2e_speed(result, os.path.join(out, "e2e-speed.png"))
    rb = result["real_blocks"]
    print(f"e2e: early stop uses {rb['early_stop_iterations']['xpress_it4_early_stop']:.2f} of 4 Jacobi iterations "
          f"({rb['early_stop_iterations']['xpress_it15_early_stop']:.2f} to the fixed point) on {rb['blocks']} real blocks; "
          f"top-{FLAGS.candidate_k} candidate agreement {rb['candidate_agreement_it4']:.4f}")
    for label, r in result["decode"].items():
        print(f"e2e decode {label}: tau {r['tau']:.2f}, {r['tokens_per_s']:.1f} tokens/s, {r['speedup']:.2f}x"
              + (f" (breaks even at tau {r['break_even_tau']:.2f})" if label != "target" else ""))
    sc = result["step_costs"]
    print(f"e2e step costs (separate calls): a target pass over a block costs {sc['verify_over_target_step']:.1f} "
          f"one-token passes, a drafter pass {sc['draft_s'] / sc['target_pass_s']['1']:.1f}")
    return result


def run_decode(out: str) -> dict:
    from xpress_jax.report import plots
    from xpress_jax.bench import decode
    config = cli.parse_config(FLAGS.decode_config, [f"--config.{kv}" for kv in FLAGS.decode_set])
    result = decode.suite(config, contexts=[int(c) for c in FLAGS.contexts], batches=[int(b) for b in FLAGS.batches],
                          new_tokens=FLAGS.decode_tokens, reps=FLAGS.reps,
                          variants=decode.chosen_variants(FLAGS.decode_variants),
                          verify_tokens=[int(m) for m in FLAGS.verify_tokens],
                          progress=partial_writer(out, "decode", config=FLAGS.decode_config,
                                                  overrides=list(FLAGS.decode_set)),
                          compile_only=FLAGS.compile_only)
    result = {"config": FLAGS.decode_config, "overrides": list(FLAGS.decode_set), **result}
    if FLAGS.compile_only:
        for context, by_batch in result["contexts"].items():
            for batch, rows in by_batch.items():
                print(f"decode context {context}, batch {batch}, compiled: " + ", ".join(
                    f"{label} {r['trace_and_lower_s']:.1f} + {r['compile_s']:.1f} s" for label, r in rows.items()))
        return result
    plots.break_even_tau(result, os.path.join(out, "decode-break_even_tau.png"))
    for context, by_batch in result["contexts"].items():
        for batch, rows in by_batch.items():
            target_ms = rows["target"]["seconds_per_step"] * 1e3
            others = ", ".join(f"{label} {r['break_even_tau']:.2f}" for label, r in rows.items() if label != "target")
            print(f"decode context {context}, batch {batch}: target-only {target_ms:.2f} ms/step; "
                  f"break-even tau: {others}")
    return result


def run_train(config_path: str, out: str) -> dict:
    from xpress_jax.bench import train
    from xpress_jax.bench.scaling import scaling_table
    from xpress_jax.report import plots
    result = train.suite(FLAGS.train_config, config_path, steps=FLAGS.train_steps, chunks=anchor_chunks(),
                         heads=frozen_heads(), scaling_devices=scaling_devices(), progress=partial_writer(out, "train"))
    for name, v in result["variants"].items():
        print(f"train {name}: {v['tokens_per_s']:.0f} tokens/s ({v['relative_to_fastest']:.2f} of the fastest)")
    for head, v in result["frozen_drafter"].items():
        flops = f" and {v['flops_ratio']:.2f} of the flops" if v["flops_ratio"] is not None else ""
        print(f"train {head} on a frozen drafter: {v['time_ratio']:.2f} of the step time{flops} "
              "of the same step with a backward pass through the drafter")
    table = scaling_table(result["scaling"])
    atomic.write_text(os.path.join(out, "train-scaling.md"), table + "\n")
    plots.scaling(result["scaling"], os.path.join(out, "train-scaling.png"))
    print(f"train scaling of {os.path.basename(config_path)} on simulated devices (per device):\n{table}")
    return result


def run_regen(out: str) -> dict:
    import jax
    from xpress_jax import assets
    from xpress_jax.bench import regen
    from xpress_jax.checkpoints.hf_qwen3 import load_qwen3
    from xpress_jax.data.chat import load_tokenizer, prompt_ids
    from xpress_jax.data.questions import BENCHMARKS, load_questions
    directory = FLAGS.regen_target or assets.TINY_TARGET
    devices = jax.local_device_count()
    batches = [int(b) for b in FLAGS.regen_batches if b.isdigit()]
    if len(batches) != len(FLAGS.regen_batches) or any(b < 1 or b % devices for b in batches):
        raise InputError(f"--regen_batches={','.join(FLAGS.regen_batches)}: expected row counts that {devices} "
                         "device(s) divide")
    tok = load_tokenizer(directory)
    per_set = -(-FLAGS.regen_prompts // len(BENCHMARKS))
    mixed = [q for group in zip(*(load_questions(name, per_set) for name in BENCHMARKS)) for q in group]
    prompts = [prompt_ids(tok, [{"role": "user", "content": q}]) for q in mixed[:FLAGS.regen_prompts]]
    stops = [tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    result = regen.suite(load_qwen3(directory, scan=False), prompts, stops, max_new_tokens=FLAGS.regen_max_new_tokens,
                         batches=batches, devices=devices, reps=FLAGS.reps, progress=partial_writer(out, "regen"))
    for rows, r in result["batches"].items():
        queue, own = r["continuous_queue_bucket"], r["continuous"]
        print(f"regen batch {rows} on {devices} device(s): useful tokens per decode slot static "
              f"{r['static']['useful_per_slot']:.2f}, continuous {own['useful_per_slot']:.2f}; "
              f"tokens/s {r['static']['tokens_per_s']:.0f} against {own['tokens_per_s']:.0f} "
              f"({r['speedup']:.2f}x); admitting at the queue's bucket {queue['tokens_per_s']:.0f} tokens/s, "
              f"{queue['admission_share']:.0%} of the time admitting, at each prompt's own "
              f"{own['admission_share']:.0%} ({r['own_bucket_speedup']:.2f}x); same tokens: {r['same_tokens']}")
    return {"target": directory, **result}


def scaling_devices() -> list[int]:
    counts = FLAGS.scaling_devices
    if not counts or not all(n.isdigit() and 1 <= int(n) <= 8 for n in counts):
        raise InputError(f"--scaling_devices={','.join(counts)}: expected device counts between 1 and 8")
    return [int(n) for n in counts]


def anchor_chunks() -> list[int]:
    if not all(n.isdigit() and int(n) >= 1 for n in FLAGS.anchor_chunks):
        raise InputError(f"--anchor_chunks={','.join(FLAGS.anchor_chunks)}: expected positive anchor counts")
    return [int(n) for n in FLAGS.anchor_chunks]


def frozen_heads() -> list[str]:
    from xpress_jax.methods import HEADS
    unknown = sorted(set(FLAGS.frozen_heads) - set(HEADS))
    if unknown:
        raise InputError(f"--frozen_heads: unknown heads {unknown}; choose from {', '.join(HEADS)}")
    return list(FLAGS.frozen_heads)


def _earlier(out: str, suite: str) -> dict | None:
    """A suite's results written to `out` by an earlier run (the e2e projection reads heads')."""
    path = os.path.join(out, f"{suite}.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def main(config):
    out = FLAGS.out
    os.makedirs(out, exist_ok=True)
    config_path = cli.config_file(FLAGS)
    suites = SUITES if FLAGS.suite == "all" else (FLAGS.suite,)
    if "train" in suites:
        scaling_devices(), anchor_chunks(), frozen_heads()  # refused before any suite runs
    results = {}
    for suite in suites:
        if suite == "heads":
            results[suite] = run_heads(config, out)
        elif suite == "e2e":
            results[suite] = run_e2e(out, results.get("heads") or _earlier(out, "heads"))
        elif suite == "decode":
            results[suite] = run_decode(out)
        elif suite == "regen":
            results[suite] = run_regen(out)
        else:
            results[suite] = run_train(config_path, out)
        path = os.path.join(out, f"{suite}.json")
        atomic.write_json(path, {"suite": suite, "complete": True, **machine(), **results[suite]})
        print(f"wrote {path}")


if __name__ == "__main__":
    cli.run(main, FLAGS, DEFAULT_CONFIG)
