"""Nsight Compute's raw CSV (``ncu --csv --page raw``): one column per profiled kernel, one row per metric.

    python3 bench/ncu_table.py report.csv [--all]

Prints each metric whose value differs between the kernels by more than 1% of the largest, or is missing for some
(every metric with --all), the kernels named by their NVTX range (bench/ws_profile.py's "profiled:<case>"). Used by
scripts/gpu_profile_ws_pipes.sh (v98).
"""
import argparse
import csv
import sys


def read(path):
    """(kernel names, {metric: (unit, [value per kernel])}) from ncu's raw CSV (first row the names, second units)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 3:
        raise SystemExit(f"{path}: no profiled kernels")
    head, units, data = rows[0], rows[1], rows[2:]
    nvtx = [i for i, h in enumerate(head) if h.lower().startswith("thread domain") or h == "NVTX"]
    names = []
    for r in data:
        label = next((r[i] for i in nvtx if r[i]), "") or r[head.index("Kernel Name")][:30]
        names.append(label.split("profiled:")[-1].split("/")[0].split(":")[0] if "profiled:" in label else label)
    metrics = {}
    for j, h in enumerate(head):
        if "__" not in h:
            continue
        vals = []
        for r in data:
            try:
                vals.append(float(r[j].replace(",", "")))
            except ValueError:
                vals.append(float("nan"))
        metrics[h] = (units[j], vals)
    return names, metrics


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--all", action="store_true")
    args = p.parse_args(argv)
    names, metrics = read(args.csv)
    print(f"{'metric':70s} " + " ".join(f"{n[:14]:>14s}" for n in names))
    for m, (unit, vals) in sorted(metrics.items()):
        known = [v for v in vals if v == v]  # (NaN: a kernel without the metric)
        top = max((abs(v) for v in known), default=0.0)
        if not args.all and (top == 0 or (len(known) == len(vals) and max(known) - min(known) <= 0.01 * top)):
            continue
        print(f"{m + ' (' + unit + ')':70.70s} " + " ".join(f"{v:14.4g}" for v in vals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
