"""A soak run with injected kills (issue 43, docs/RELIABILITY.md): `meganeura train` on a model
folder for --seconds, killed with SIGKILL at --kills evenly spaced moments and resumed from its
checkpoint each time, then stopped with SIGINT (Ctrl-C). It checks that:
  - each kill is recorded as `killed` by `meganeura runs`, and the steps lost to it (the last
    step logged before the kill minus the checkpoint's step) are at most --checkpoint-every;
  - every resume continues from the checkpoint's step, and the run ends `interrupted` with a
    checkpoint at its last step;
  - host memory (the process's resident set) and device memory (nvidia-smi's used memory, where
    there is one) stay flat: each segment's last-quarter median within --memory-slack of its
    second-quarter median.
Prints one JSON line per segment and a summary table; writes soak.json into --out; exits 1 if a
check fails.

usage: python3 bench/soak.py --binary BIN --model DIR --data FILE --out DIR [--seconds S]
       [--kills K] [--checkpoint-every N] [--precision P] [--seq N] [--batch N]
       [--memory-slack F]
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--binary", required=True)
parser.add_argument("--model", required=True)
parser.add_argument("--data", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--seconds", type=float, default=3600)
parser.add_argument("--kills", type=int, default=3)
parser.add_argument("--checkpoint-every", type=int, default=50)
parser.add_argument("--precision", default="strict")
parser.add_argument("--seq", type=int, default=128)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--memory-slack", type=float, default=0.05)
args = parser.parse_args()

run_dir = os.path.join(args.out, "run")
shutil.rmtree(run_dir, ignore_errors=True)
os.makedirs(args.out, exist_ok=True)
checkpoint = os.path.join(run_dir, "checkpoint.safetensors")
has_nvidia_smi = shutil.which("nvidia-smi") is not None


def device_memory_mib():
    if not has_nvidia_smi:
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout.split()
    return float(out[0]) if out else None


def resident_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_record():
    out = subprocess.run([args.binary, "runs", run_dir, "--json"], capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def logged_steps():
    """The steps of metrics.jsonl's training records, in file order."""
    steps = []
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if "loss" in record:
                    steps.append(int(record["step"]))
    except OSError:
        pass
    return steps


def flat(samples):
    values = [v for v in samples if v is not None]
    if len(values) < 8:
        return True, None
    quarter = len(values) // 4
    early = statistics.median(values[quarter:2 * quarter])
    late = statistics.median(values[3 * quarter:])
    growth = (late - early) / max(early, 1e-9)
    return growth <= args.memory_slack, growth


segments, failures = [], []
segment_seconds = args.seconds / (args.kills + 1)
for segment in range(args.kills + 1):
    command = [args.binary, "train", "--model", args.model, "--data", args.data, "--out", run_dir,
               "--seq", str(args.seq), "--batch", str(args.batch), "--epochs", "1000",
               "--checkpoint-every", str(args.checkpoint_every), "--log-every", "1",
               "--precision", args.precision]
    resumed_from = None
    if segment > 0:
        resumed_from = (run_record().get("checkpoint") or {}).get("step")
        command += ["--resume", checkpoint]
    log = open(os.path.join(args.out, f"segment{segment}.log"), "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    start = time.time()
    host, device = [], []
    while time.time() - start < segment_seconds and process.poll() is None:
        time.sleep(2)
        host.append(resident_mib(process.pid))
        device.append(device_memory_mib())
    killed = segment < args.kills
    if process.poll() is not None:
        failures.append(f"segment {segment}: the run ended by itself (exit {process.returncode})")
    elif killed:
        process.send_signal(signal.SIGKILL)
    else:
        process.send_signal(signal.SIGINT)
    process.wait()
    log.close()
    record = run_record()
    logged = logged_steps()
    reached = max(logged, default=0)
    checkpoint_step = (record.get("checkpoint") or {}).get("step")
    host_flat, host_growth = flat(host)
    device_flat, device_growth = flat(device)
    result = {"segment": segment, "seconds": round(time.time() - start, 1),
              "resumed_from": resumed_from, "reached_step": reached, "status": record.get("status"),
              "checkpoint_step": checkpoint_step,
              "host_mib_last": round(host[-1]) if host and host[-1] else None,
              "host_growth": host_growth, "device_mib_last": device[-1] if device else None,
              "device_growth": device_growth}
    if killed:
        lost = reached - (checkpoint_step or 0)
        result["lost_steps"] = lost
        if record.get("status") != "killed":
            failures.append(f"segment {segment}: status {record.get('status')}, not killed")
        if lost > args.checkpoint_every:
            failures.append(f"segment {segment}: {lost} steps lost, more than the interval")
    else:
        if record.get("status") != "interrupted":
            failures.append(f"segment {segment}: status {record.get('status')}, not interrupted")
        if checkpoint_step != reached:
            failures.append(f"segment {segment}: checkpoint at {checkpoint_step}, run at {reached}")
    # A resume drops the metrics logged past its checkpoint and logs those steps again: the
    # training records count 1, 2, 3, ... with no step missing or repeated.
    if logged != list(range(1, len(logged) + 1)):
        failures.append(f"segment {segment}: metrics.jsonl misses or repeats steps")
    if not host_flat:
        failures.append(f"segment {segment}: host memory grew {host_growth:.1%}")
    if not device_flat:
        failures.append(f"segment {segment}: device memory grew {device_growth:.1%}")
    segments.append(result)
    print(json.dumps(result), flush=True)

summary = {"seconds": args.seconds, "kills": args.kills, "checkpoint_every": args.checkpoint_every,
           "segments": segments, "failures": failures}
with open(os.path.join(args.out, "soak.json"), "w") as f:
    json.dump(summary, f, indent=2)
print("| segment | seconds | resumed from | reached | status | checkpoint | lost | host MiB (growth) "
      "| device MiB (growth) |")
print("|---|---|---|---|---|---|---|---|---|")


def growth(value):
    return "-" if value is None else f"{value:+.1%}"


for s in segments:
    print(f"| {s['segment']} | {s['seconds']} | {s['resumed_from']} | {s['reached_step']} | "
          f"{s['status']} | {s['checkpoint_step']} | {s.get('lost_steps', '-')} | "
          f"{s['host_mib_last']} ({growth(s['host_growth'])}) | {s['device_mib_last']} "
          f"({growth(s['device_growth'])}) |")
print("PASS" if not failures else "FAIL: " + "; ".join(failures))
sys.exit(1 if failures else 0)
