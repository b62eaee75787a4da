"""The static rollout's GPU check, in one run of a few minutes on one CUDA GPU.

1. The CUDA tests (``pytest -m gpu tests/test_rollout_capture.py``): tiny backbones in
   float32 and bf16; the capture works, the graph equals the eager step, |Δ log π|
   between the rollout and teacher forcing, the fallback to ``generate`` when the
   self-check is forced to fail.
2. ``leaf bench rollout --device cuda --profile`` for each real-size backbone
   (random-weight Granite Speech 3.3 8B and Qwen2-Audio-7B built from their published
   configs in bf16 on the GPU), ``static`` and ``generate`` side by side.
3. One summary (``summary.md``): the machine and versions, the tests' outcome, the
   tables, and each target (the static decode step at most ``FLOOR_TARGET`` × the
   floor, ``static`` at least ``SPEEDUP_TARGET`` × faster than ``generate`` in the same
   run) met or missed.

Every step has a time limit within ``--budget`` seconds and writes its results under
``--out`` as it finishes, so a run cut short still leaves what it measured.
``--device cpu`` is a dry run of the same script (the CPU tests of the captured path,
the CPU benchmark's quick shape).

Usage: ``python scripts/gpu_check.py --out DIR [--device cuda] [--new-tokens 64]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

FLOOR_TARGET = 3.0
SPEEDUP_TARGET = 6.0
BACKBONES = ("granite-speech", "qwen2-audio")


def run_limited(command: list[str], seconds: float, log: Path) -> tuple[int, float]:
    """Run ``command`` (its output into ``log`` and this process's stdout), killing its
    whole process group after ``seconds``: (exit status, 124 on timeout; seconds taken)."""
    started = time.monotonic()
    print(f"$ {' '.join(command)}  (limit {seconds:.0f} s)", flush=True)
    with log.open("a") as sink:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        try:
            deadline = started + seconds
            for line in process.stdout:  # type: ignore[union-attr]
                sys.stdout.write(line)
                sink.write(line)
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(command, seconds)
            status = process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            status = 124
            sink.write(f"\n[killed after {seconds:.0f} s]\n")
            print(f"[killed after {seconds:.0f} s]", flush=True)
    return status, time.monotonic() - started


def machine(device: str) -> list[str]:
    """Lines naming the GPU (or CPU), the versions and the date."""
    import torch

    from importlib.metadata import version

    name = torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() else "CPU"
    return [f"- device: {name}", f"- torch {torch.__version__}, transformers {version('transformers')}, "
            f"peft {version('peft')}, Python {sys.version.split()[0]}",
            f"- date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
            f"- command: `python {' '.join(sys.argv)}`"]


def targets(rows: list[dict]) -> list[str]:
    """One line per backbone: the static decode step and whole rollout against the
    floor, the speed-up over generate, each target met or missed, the bf16 mismatch."""
    lines = []
    for row in rows:
        reads, bandwidth = row["bytes"], row["bandwidth"]
        floor = 1000 * (reads["weights"] + reads["kv_standard"]) / bandwidth
        ms = row["ms_per_token"]
        step = (row.get("static_phases") or {}).get("decode_ms_per_step")
        speedup = ms["generate"] / ms["static"]
        if row.get("static_fallback"):
            lines.append(f"- {row['backbone']}: the static backend FELL BACK to generate: {row['static_fallback']}")
            continue
        step_ratio = step / floor if step else float("nan")
        lines.append(
            f"- {row['backbone']}: floor {floor:.2f} ms; static decode step {step:.2f} ms = {step_ratio:.2f}× floor "
            f"(target ≤ {FLOOR_TARGET:g}×: {'met' if step_ratio <= FLOOR_TARGET else 'MISSED'}); whole static "
            f"rollout {ms['static']:.2f} ms/token = {ms['static'] / floor:.2f}× floor; generate {ms['generate']:.2f} "
            f"ms/token; static {speedup:.2f}× faster (target ≥ {SPEEDUP_TARGET:g}×: "
            f"{'met' if speedup >= SPEEDUP_TARGET else 'MISSED'})"
            + ("" if row.get("static_folded") is None else
               f"; projections {'folded' if row['static_folded'] else 'unfolded'}"))
        for backend, found in row["mismatch"].items():
            lines.append(f"  - bf16 |Δ log π| ({backend}): mean {found['mean']:.4f}, max {found['max']:.4f}, "
                         f"{100 * found['outside']:.2f}% of {found['tokens']} tokens outside the clip range")
    return lines


def run_tests(selection: list[str], seconds: float, out: Path, summary: Path) -> None:
    """The CUDA tests; their outcome and the |Δ log π| lines they print into ``summary``."""
    status, took = run_limited([sys.executable, "-m", "pytest", "-q", "-s", "-rA", "-p", "no:cacheprovider",
                                *selection, "tests/test_rollout_capture.py"], seconds, out / "tests.txt")
    text = (out / "tests.txt").read_text()
    tail = text.strip().splitlines()[-1:]
    printed = [line for line in text.splitlines() if "|Δ log π|" in line and "print(" not in line]
    with summary.open("a") as sink:
        sink.write(f"## CUDA tests (exit {status}, {took:.0f} s)\n\n" + "\n".join(tail + printed) + "\n\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--budget", type=float, default=450.0, help="seconds for the whole check")
    parser.add_argument("--tests-seconds", type=float, default=130.0, help="0: skip the tests")
    args = parser.parse_args()
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = args.device.startswith("cuda")
    summary = args.out / "summary.md"
    header = ["# The static rollout on one GPU", ""] + machine(args.device) + [""]
    summary.write_text("\n".join(header) + "\n")

    if args.tests_seconds > 0:
        run_tests(["-m", "gpu"] if cuda else ["-m", "not gpu", "-k", "falls_back or reused"], args.tests_seconds,
                  args.out, summary)

    rows = []
    for index, backbone in enumerate(BACKBONES if cuda else BACKBONES[1:]):
        left = args.budget - (time.monotonic() - started)
        share = left / (len(BACKBONES) - index) if cuda else left
        out = args.out / backbone
        bench = [sys.executable, "-m", "leaf_plugins.cli", "bench", "rollout", "--device", args.device,
                 "--backbone", backbone, "--repeats", str(args.repeats), "--profile", "--out", str(out)]
        bench += ["--new-tokens", str(args.new_tokens)] if cuda else ["--quick"]
        status, seconds = run_limited(bench, share, args.out / "bench.txt")
        found = json.loads((out / "rollout.json").read_text()) if (out / "rollout.json").exists() else []
        rows += found
        with summary.open("a") as sink:
            sink.write(f"## {backbone}: leaf bench rollout (exit {status}, {seconds:.0f} s)\n\n")
            if (out / "rollout.md").exists():
                sink.write((out / "rollout.md").read_text() + "\n")
            sink.write("\n".join(targets(found)) + "\n\n")
    print("\n" + summary.read_text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
