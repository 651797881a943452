"""Draw SIRI's three rollout-length schedules L(t) over two cycles: docs/figures/siri-schedules.png.

    python scripts/plot_schedules.py [--out docs/figures/siri-schedules.png]

The values come from `taut.length.schedules.length_cap`, the function the trainer calls, with
the shipped recipes' parameters (Lmax 128, Lmin 64, T = 50 steps).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from taut.length.schedules import SCHEDULES, length_cap  # noqa: E402

L_MAX, L_MIN, PERIOD, CYCLES = 128, 64, 50, 2
COLORS = {"cosine": "#1f77b4", "stair": "#d62728", "stair-cosine": "#2ca02c"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "docs/figures/siri-schedules.png")
    out = parser.parse_args().out

    steps = list(range(CYCLES * PERIOD))
    fig, axes = plt.subplots(3, 1, figsize=(8, 6.2), sharex=True, sharey=True)
    for ax, kind in zip(axes, SCHEDULES):
        caps = [length_cap(kind, t, L_MAX, L_MIN, PERIOD) for t in steps]
        ax.step(steps + [steps[-1] + 1], caps + caps[-1:], where="post", color=COLORS[kind], lw=2)   # L(t) holds for step t
        for cycle in range(CYCLES):                       # shade each cycle's compression half
            ax.axvspan(cycle * PERIOD, cycle * PERIOD + PERIOD / 2, color="#000000", alpha=0.05, lw=0)
        ax.set_title(kind, loc="left", fontsize=11)
        ax.set_yticks([L_MIN, (L_MAX + L_MIN) // 2, L_MAX])
        ax.set_ylim(L_MIN - 10, L_MAX + 10)
        ax.set_ylabel("cap L(t)\n(tokens)")
        ax.grid(axis="y", color="#dddddd", lw=0.8)
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1].set_xlabel(f"RL step t   (T = {PERIOD} steps; grey: first half of each cycle)")
    axes[-1].set_xticks(range(0, CYCLES * PERIOD + 1, PERIOD // 2))
    axes[-1].set_xlim(0, CYCLES * PERIOD)
    fig.suptitle(f"SIRI rollout-length schedules, Lmax = {L_MAX}, Lmin = {L_MIN}, two cycles", fontsize=12)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"written: {out}")


if __name__ == "__main__":
    main()
