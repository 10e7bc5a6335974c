"""Times kernel cases under every combination of environment settings (tuning switches such as
MEGANEURA_GEMM_TILE, MEGANEURA_COOP_BLOCK, MEGANEURA_IM2COL) and binaries in one go, one
`meganeura bench kernels` process per combination, and prints one table: a row per case, a
column per combination, milliseconds (the fastest of a row marked with *). Meant for one device
call.

Usage: python3 bench/sweep.py --filter TEXT [--set NAME=V1/V2/... ...] [--bin PATH ...]
                              [--repeat N] [--runs N] [--no-fast] [--bench-args="ARGS"]
                              [--jsonl FILE]

--no-fast leaves out the "... fast" cases. Other bench arguments go in --bench-args; write it
with "=" (--bench-args=--small), or argparse takes a value that starts with "--" for an option.

Values are separated by "/" (a value may hold commas: 64,128,8,8,8); "-" leaves the variable
unset (the built-in rule). Several --set options sweep their cartesian product. Several --bin
options (an old and a new build, say) add a dimension to it, and --repeat N runs the whole
product N times in turn (A, B, A, B, ...), so that drift within the call shows as spread along a
row. A combination whose run fails is reported, and the cases it did not time are left blank
("-") in the table. Each combination's times are also printed to stderr as soon as its run
ends.
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


def run_case_family(binary, case_filter, runs, extra_args, environment):
    command = [binary, "bench", "kernels", "--filter", case_filter, "--runs", str(runs)]
    command += extra_args
    result = subprocess.run(command, env=environment, capture_output=True, text=True)
    if result.returncode != 0:
        # One bad combination (or case: the others still print theirs) must not cost the rest of
        # the device call: report it, keep what ran, go on.
        print(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr}",
              file=sys.stderr, flush=True)
    records = []
    for line in result.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if "case" in record:
                records.append(record)
    return records


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--filter", required=True, help="cases whose name contains this text")
    parser.add_argument("--set", dest="settings", type=parse_setting, action="append",
                        default=[], help="NAME=V1/V2/... ('-' = unset)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1,
                        help="run the whole product this many times in turn")
    default_binary = ".dev/bin/meganeura" if os.path.exists(".dev/bin/meganeura") \
        else "build/meganeura"
    parser.add_argument("--bin", dest="binaries", action="append",
                        help=f"a meganeura binary; several compare builds (default {default_binary})")
    parser.add_argument("--no-fast", action="store_true", help="leave out the fast cases")
    parser.add_argument("--bench-args", default="",
                        help="more arguments for bench kernels (write --bench-args=ARGS)")
    parser.add_argument("--jsonl", help="also write every record, with its settings, here")
    arguments = parser.parse_args()

    binaries = arguments.binaries or [default_binary]
    extra_arguments = shlex.split(arguments.bench_args) + (["--no-fast"] if arguments.no_fast else [])
    names = [name for name, _ in arguments.settings]
    combinations = list(itertools.product(binaries,
                                          *[values for _, values in arguments.settings]))
    columns = []
    times = {}  # case -> {column index: ms}
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
            for record in run_case_family(binary, arguments.filter, arguments.runs,
                                          extra_arguments, environment):
                times.setdefault(record["case"], {})[len(columns) - 1] = record["ms"]
                # As they come, so that a device call cut short by its time limit keeps them.
                print(f"  {record['case']}: {record['ms']:.4f} ms", file=sys.stderr, flush=True)
                if log:
                    log.write(json.dumps(dict(record, binary=binary, settings=settings)) + "\n")
    if log:
        log.close()
    if not times:
        sys.exit(f"no case matched --filter {arguments.filter!r}")

    for index, column in enumerate(columns):
        print(f"[{index}] {column}")
    width = max(len(case) for case in times)
    print(f"{'case':<{width}}" + "".join(f"{f'[{i}]':>12}" for i in range(len(columns))))
    for case, row in times.items():
        fastest = min(row.values())
        cells = []
        for index in range(len(columns)):
            ms = row.get(index)
            cell = "-" if ms is None else f"{ms:.4f}" + ("*" if ms == fastest else " ")
            cells.append(f"{cell:>12}")
        print(f"{case:<{width}}" + "".join(cells))


if __name__ == "__main__":
    main()
