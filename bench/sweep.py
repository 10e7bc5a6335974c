"""Times kernel cases, or whole workloads, under every combination of environment settings (tuning
switches such as MEGANEURA_GEMM_TILE, MEGANEURA_COOP_BLOCK, MEGANEURA_IM2COL) and binaries in one
go, one `meganeura bench kernels` (or `bench workloads`) process per combination, and prints one
table: a row per case (workloads: per workload, precision and timing), a column per combination
(the best of a row marked with *: the least time, the most tokens or images a second). Meant for
one device call.

Usage: python3 bench/sweep.py --filter TEXT [--workloads] [--set NAME=V1/V2/... ...]
                              [--bin PATH ...] [--repeat N] [--runs N] [--no-fast]
                              [--bench-args="ARGS"] [--timeout S] [--jsonl FILE]

--workloads runs `bench workloads --filter TEXT` instead of `bench kernels` (its figures: ms,
tokens/s, images/s, compile seconds); give it --bench-args=--precision=fast to time one precision.
--no-fast leaves out the kernels' "... fast" cases. Other bench arguments go in --bench-args; write
it with "=" (--bench-args=--small), or argparse takes a value that starts with "--" for an option.

Values are separated by "/" (a value may hold commas: 64,128,8,8,8); "-" leaves the variable
unset (the built-in rule). Several --set options sweep their cartesian product. Several --bin
options (an old and a new build, say) add a dimension to it, and --repeat N runs the whole
product N times in turn (A, B, A, B, ...), so that drift within the call shows as spread along a
row; with N > 1 a second table gives each combination's median over its N runs and their spread
(the largest less the smallest, as a percentage of the median). A combination whose run fails or
outlasts --timeout seconds is reported, and the figures it did not print are left blank ("-") in
the table. Each combination's figures are also printed to stderr as soon as its run ends.
"""
import argparse
import itertools
import json
import os
import shlex
import subprocess
import sys


def parse_setting(text):
    name, separator, values = text.partition("=")
    if not separator or not name or not values:
        raise argparse.ArgumentTypeError(f"expected NAME=V1/V2/..., got {text!r}")
    return name, values.split("/")


def run_bench(binary, arguments, environment, timeout):
    """The JSON records that `binary` prints for `arguments`, or those it printed before it failed
    or ran out of time."""
    command = [binary] + arguments
    try:
        result = subprocess.run(command, env=environment, capture_output=True, text=True,
                                timeout=timeout)
        stdout, failure = result.stdout, result.returncode != 0 and f"failed ({result.returncode})"
        stderr = result.stderr
    except subprocess.TimeoutExpired as expired:
        stdout = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout or ""
        stderr = expired.stderr.decode() if isinstance(expired.stderr, bytes) else expired.stderr or ""
        failure = f"ran past {timeout} s"
    if failure:
        # One bad combination (or case: the others still print theirs) must not cost the rest of
        # the device call: report it, keep what ran, go on.
        print(f"{' '.join(command)} {failure}:\n{stderr}", file=sys.stderr, flush=True)
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def figures(record):
    """(row, value, higher is better) for each figure of a bench record: a kernel case's time, or
    each number among a workload's timings."""
    if "case" in record:
        return [(record["case"], record["ms"], False)]
    if "timings" not in record:
        return []
    return [(f"{record['model']} {record['mode']} {key}", value, "per_second" in key)
            for key, value in record["timings"].items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--filter", required=True,
                        help="cases (workloads with --workloads) whose name contains this text")
    parser.add_argument("--workloads", action="store_true",
                        help="run bench workloads instead of bench kernels")
    parser.add_argument("--timeout", type=float, help="seconds a process may run")
    parser.add_argument("--set", dest="settings", type=parse_setting, action="append",
                        default=[], help="NAME=V1/V2/... ('-' = unset)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the whole product this many times in turn")
    default_binary = ".dev/bin/meganeura" if os.path.exists(".dev/bin/meganeura") \
        else "build/meganeura"
    parser.add_argument("--bin", dest="binaries", action="append",
                        help=f"a meganeura binary; several compare builds (default {default_binary})")
    parser.add_argument("--no-fast", action="store_true", help="leave out the kernels' fast cases")
    parser.add_argument("--bench-args", default="",
                        help="more arguments for bench (write --bench-args=ARGS)")
    parser.add_argument("--jsonl", help="also write every record, with its settings, here")
    arguments = parser.parse_args()
    if arguments.no_fast and arguments.workloads:
        parser.error("--no-fast is for kernel cases: give bench workloads --bench-args=--precision=strict")

    binaries = arguments.binaries or [default_binary]
    bench = ["bench", "workloads" if arguments.workloads else "kernels", "--filter", arguments.filter,
             "--runs", str(arguments.runs)] + shlex.split(arguments.bench_args)
    if arguments.no_fast:
        bench.append("--no-fast")
    names = [name for name, _ in arguments.settings]
    combinations = list(itertools.product(binaries,
                                          *[values for _, values in arguments.settings]))
    columns = []
    values = {}  # row -> {column index: value}
    higher_is_better = {}
    log = open(arguments.jsonl, "w") if arguments.jsonl else None
    for _ in range(arguments.repeat):
        for binary, *combination in combinations:
            environment = dict(os.environ)
            for name, value in zip(names, combination):
                environment.pop(name, None)
                if value != "-":
                    environment[name] = value
            settings = dict(zip(names, combination))
            label = " ".join(f"{name}={value}" for name, value in settings.items())
            if len(binaries) > 1:
                label = f"{binary} {label}".strip()
            columns.append(label or binary)
            print(f"running {columns[-1]}", file=sys.stderr, flush=True)
            for record in run_bench(binary, bench, environment, arguments.timeout):
                for row, value, higher in figures(record):
                    values.setdefault(row, {})[len(columns) - 1] = value
                    higher_is_better[row] = higher
                    # As they come, so that a device call cut short by its time limit keeps them.
                    print(f"  {row}: {value:.4f}", file=sys.stderr, flush=True)
                if log:
                    log.write(json.dumps(dict(record, binary=binary, settings=settings)) + "\n")
    if log:
        log.close()
    if not values:
        sys.exit(f"nothing matched --filter {arguments.filter!r}")

    for index, column in enumerate(columns):
        print(f"[{index}] {column}")
    width = max(len(row) for row in values)

    def best(row, cells):
        return (max if higher_is_better[row] else min)(cells)

    print(f"{'case':<{width}}" + "".join(f"{f'[{i}]':>12}" for i in range(len(columns))))
    for row, cells in values.items():
        top = best(row, cells.values())
        text = []
        for index in range(len(columns)):
            value = cells.get(index)
            cell = "-" if value is None else f"{value:.4f}" + ("*" if value == top else " ")
            text.append(f"{cell:>12}")
        print(f"{row:<{width}}" + "".join(text))
    if arguments.repeat == 1:
        return

    # Column c of repeat r is c + r * len(combinations).
    count = len(combinations)
    print(f"\nmedian of {arguments.repeat} runs (spread: largest less smallest, % of the median)")
    print(f"{'case':<{width}}" + "".join(f"{f'[{i}]':>20}" for i in range(count)))
    for row, cells in values.items():
        medians = {}
        for index in range(count):
            runs = sorted(cells[c] for c in range(index, len(columns), count) if c in cells)
            if runs:
                middle = len(runs) // 2
                median = runs[middle] if len(runs) % 2 else (runs[middle - 1] + runs[middle]) / 2
                spread = 100 * (runs[-1] - runs[0]) / median if median else 0.0
                medians[index] = (median, spread)
        top = best(row, [median for median, _ in medians.values()]) if medians else None
        text = []
        for index in range(count):
            if index not in medians:
                text.append(f"{'-':>20}")
                continue
            median, spread = medians[index]
            mark = "*" if median == top else " "
            text.append(f"{f'{median:.4f}{mark} ({spread:.0f} %)':>20}")
        print(f"{row:<{width}}" + "".join(text))


if __name__ == "__main__":
    main()
