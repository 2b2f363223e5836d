r"""Compare two methods prompt by prompt, within one eval report or across two.

    python -m xpress_jax.compare --method=runs/a/results.json:xpress.frozen --reference=runs/a/results.json:markov
    python -m xpress_jax.compare --method=benchmarks/tiny/results.json:T0:xpress \\
        --reference=runs/ctrl/results.json:dflash.ctrl100

Each side is REPORT:LABEL, where REPORT is an `xpress_jax.eval` results.json, or a reproduction's
results.json with the temperature named too (REPORT:T0:LABEL). For every dataset both reports
hold, it prints tau(method) / tau(reference) with a 95% paired bootstrap over prompts
(`significance.paired_tau_ratio`). Pairing needs the same prompts decoded the same way, so reports
whose eval settings differ in what decides the prompts or the tokens are refused, and so are
reports whose target-only rows gave different answer lengths (another target, or other prompts).
So are reports without per-prompt figures.
"""

from __future__ import annotations

from absl import flags

from xpress_jax import atomic, cli
from xpress_jax.compare.pairing import compare, markdown, read_side
from xpress_jax.errors import InputError

FLAGS = flags.FlagValues()  # this command's own flags (cli.invoke parses them)
flags.DEFINE_string("method", None, "REPORT:LABEL (or REPORT:T0:LABEL for a reproduction's results.json).",
                    flag_values=FLAGS)
flags.DEFINE_string("reference", None, "REPORT:LABEL of the method to divide by.", flag_values=FLAGS)
flags.DEFINE_string("out", "", "Also write the comparison as JSON here.", flag_values=FLAGS)


def main(config_unused):
    del config_unused  # compares finished reports; no model is built
    if not FLAGS.method or not FLAGS.reference:
        raise InputError("--method and --reference are required")
    method, reference = read_side(FLAGS.method), read_side(FLAGS.reference)
    result = compare(method, reference)
    print(markdown(result, method[1], reference[1]), end="")
    if FLAGS.out:
        atomic.write_json(FLAGS.out, {"method": FLAGS.method, "reference": FLAGS.reference, "results": result})


if __name__ == "__main__":
    cli.run(main, FLAGS)
