"""Joins the JSON lines of `meganeura bench kernels` and bench/kernels_pytorch.py into one table
with the ratio ours / PyTorch (time ratio: below 1 means Meganeura is faster). Memory-bound rows
also show each side's GB/s as a percentage of its own measured copy bandwidth (the "copy" case).

Usage: python3 bench/compare.py MEGANEURA.jsonl PYTORCH.jsonl [--markdown]
       python3 bench/compare.py --workloads MEGANEURA.jsonl PYTORCH.jsonl
The second form joins `meganeura bench workloads` and bench/workloads_pytorch.py into one
markdown table per workload: each framework variant and precision a row.
"""
import json
import sys


def load(path):
    rows = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            record = json.loads(line)
            if "case" in record:
                rows[record["case"]] = record
    return rows


def copy_rate(rows):
    return next((r["gbps"] for name, r in rows.items() if name.startswith("copy")), None)


def rate(record):
    if "gflops" in record:
        if record["gflops"] < 1e3:
            return f"{record['gflops']:.1f} GFLOP/s"
        return f"{record['gflops'] / 1e3:.1f} TFLOP/s"
    return f"{record['gbps']:.0f} GB/s"


def percent_of_copy(record, copy):
    if record is None or "gbps" not in record or copy is None:
        return "-"
    return f"{100 * record['gbps'] / copy:.0f} %"


def workloads_table(paths):
    records = []
    for path in paths:
        for line in open(path):
            if line.strip().startswith("{"):
                records.append(json.loads(line))

    def cell(value, digits):
        return "-" if value is None else f"{value:.{digits}f}"

    def label(key):
        for suffix, unit in (("_per_second", "/s"), ("_ms", " ms"), ("_s", " s")):
            if key.endswith(suffix):
                return key[: -len(suffix)].replace("_", " ") + unit
        return key.replace("_", " ")

    for model in dict.fromkeys(r["model"] for r in records):
        rows = [r for r in records if r["model"] == model]
        # Every wall-clock figure any framework reported for this workload, in first-seen order;
        # GPU-only times and the warm compile (shown beside the cold one) are not columns.
        keys = [k for k in dict.fromkeys(k for r in rows for k in r.get("timings", {}))
                if not k.endswith("_gpu_ms") and k != "compile_warm_s"]
        print(f"\n{model}\n")
        print("| framework | precision | " + " | ".join(label(k) for k in keys) +
              " | training memory GiB |")
        print("| --- | --- |" + " ---: |" * (len(keys) + 1))
        for r in rows:
            if "error" in r:
                print(f"| {r['framework']} | {r['mode']} | error: {r['error'][:60]} |" + " |" * len(keys))
                continue
            t, memory = r["timings"], r.get("memory", {})
            cells = []
            for k in keys:
                digits = 1 if k.endswith("_per_second") else 4 if k.endswith("_factor") else 2
                text = cell(t.get(k), digits)
                if k == "compile_s" and t.get("compile_warm_s") is not None:
                    text += " / " + cell(t["compile_warm_s"], 2)
                cells.append(text)
            gib = memory.get("training_device_bytes")
            print(f"| {r['framework']} | {r['mode']} | " + " | ".join(cells) +
                  f" | {cell(gib / 2**30 if gib else None, 2)} |")


def main():
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--workloads" in sys.argv:
        workloads_table(paths)
        return
    markdown = "--markdown" in sys.argv
    ours, theirs = load(paths[0]), load(paths[1])
    ours_copy, theirs_copy = copy_rate(ours), copy_rate(theirs)
    header = ["case", "meganeura ms", "pytorch ms", "ratio", "meganeura rate", "pytorch rate",
              "ours % copy", "torch % copy"]
    rows = []
    for name, record in ours.items():
        other = theirs.get(name)
        rows.append([name, f"{record['ms']:.4f}", f"{other['ms']:.4f}" if other else "-",
                     f"{record['ms'] / other['ms']:.2f}" if other else "-", rate(record),
                     rate(other) if other else "-", percent_of_copy(record, ours_copy),
                     percent_of_copy(other, theirs_copy)])
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("| --- |" + " ---: |" * (len(header) - 1))
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(row[i]) for row in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        print("  ".join(cells))


if __name__ == "__main__":
    main()
