"""Plot a stage-1 split (main loop against epilogue) from a ``wide_tile_stage1_*.json`` of v82's probe.

Each (D, B) cell gets one group of bars per tile: stage 1 with noise ([B] parameters), all-greedy (the main loop
under the lightest epilogue) and the epilogue alone (main loop skipped), each over cuBLAS's matmul alone at that
cell, with the 1.0 line (issue 14's yardstick) drawn across.

    python3 bench/plot_stage1_split.py bench/results/wide_tile_stage1_h200_20261203T195553Z_v82b.json \\
        --out docs/plots/wide_tile_stage1_h200_20261203_v82b.png   # (the committed plot)
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

KINDS = (("", "with noise"), ("_greedy", "greedy (main loop)"), ("_epi", "epilogue alone"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    with open(args.json) as f:
        data = json.load(f)
    rows = data["rows"]
    tiles = sorted({k.split("_")[0] if not k.startswith("wide") else "_".join(k.split("_")[:2])
                    for r in rows for k in r if k not in ("D", "V", "B", "cublas")})
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / (len(tiles) * len(KINDS))
    colors = {"": "tab:blue", "_greedy": "tab:green", "_epi": "tab:orange"}
    hatches = ["", "//", "..", "xx"]
    for i, r in enumerate(rows):
        for j, tile in enumerate(tiles):
            for k, (suffix, label) in enumerate(KINDS):
                v = r.get(tile + suffix)
                if v is None:
                    continue
                x = i + (j * len(KINDS) + k) * width - 0.4 + width / 2
                ax.bar(x, v / r["cublas"], width, color=colors[suffix], hatch=hatches[j % len(hatches)],
                       edgecolor="black", linewidth=0.4,
                       label=f"{tile}: {label}" if i == 0 else None)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"D={r['D']}\nB={r['B']}" for r in rows])
    ax.set_ylabel("stage 1 time / cuBLAS matmul alone")
    gpu = data.get("env", {}).get("gpu", {})
    gpu = gpu.get("name", "") if isinstance(gpu, dict) else str(gpu)
    ax.set_title(f"Stage 1 split, {gpu} (CUDA events, L2 flushed, medians)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    out = args.out or os.path.join("docs", "plots", os.path.basename(args.json).replace(".json", ".png"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    fig.savefig(out, dpi=120)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
