"""PNG plots of evaluation results (matplotlib, headless)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def acceptance_per_position(results: dict, path: str) -> None:
    """One panel per dataset: acceptance rate at each draft position, a line per head."""
    datasets = list(results)
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 3.6), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        for head, r in results[ds].items():
            if r["accept_per_position"]:
                ax.plot(range(1, len(r["accept_per_position"]) + 1), r["accept_per_position"], marker="o",
                        ms=3, label=f"{head} (tau {r['tau']:.2f})")
        ax.set(title=ds, xlabel="draft position k", ylabel="acceptance rate", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def tau_against_k(sweep: dict, reference: dict, path: str) -> None:
    """tau of each XPress method against Jacobi iterations K, with the other methods as flat lines."""
    datasets = list(sweep)
    fig, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 3.6), squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        for label, by_k in sweep[ds].items():  # one line per XPress method
            ks = sorted(int(k) for k in by_k)
            ax.plot(ks, [by_k[str(k)] for k in ks], marker="o", label=label)
        for head, tau in reference.get(ds, {}).items():
            ax.axhline(tau, ls="--", lw=1, label=head, color=f"C{len(sweep[ds]) + list(reference[ds]).index(head)}")
        ax.set(title=ds, xlabel="Jacobi iterations K", ylabel="tau (acceptance length)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
