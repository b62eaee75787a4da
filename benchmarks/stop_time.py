"""How a run on several processes ends when it is stopped: ``leaf train`` under
``torchrun`` given SIGINT to its whole process group (a terminal's Ctrl-C) or SIGTERM to
``torchrun`` alone (a scheduler's preemption) at seeded moments after a checkpoint.

    python benchmarks/stop_time.py --tries 7 --processes 2

For each try: the seconds from the signal to the exit of every process, how many times
"interrupted" was printed, whether the newest checkpoint is the last logged step, and
whether a ``.partial-*`` checkpoint or a traceback through ``leaf_plugins`` was left.
Each try starts a fresh run of ``configs/runs/tiny-qwen2-audio.yaml`` (24 steps,
a checkpoint every 3) and signals it a moment drawn from [0, ``--spread``) seconds after
its third checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
RUN = ["configs/runs/tiny-qwen2-audio.yaml", "steps=24", "checkpoint_every=3", "rollout.prompts_per_step=2",
       "rollout.group_size=4", "rollout.max_new_tokens=8", "threads=1"]


def one_try(output: Path, processes: int, how: str, delay: float) -> dict:
    """Launch, wait for the third checkpoint and ``delay`` seconds, signal, and read what was left."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "-m",
            "leaf_plugins.cli", "train", *RUN, f"output_dir={output}"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPOSITORY,
                               env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True)
    while not (output / "checkpoint-00000003").exists():
        if process.poll() is not None:
            raise RuntimeError(f"the run ended before its third checkpoint:\n{process.stdout.read()[-3000:]}")
        time.sleep(0.02)
    time.sleep(delay)
    sent = time.monotonic()
    if how == "SIGINT to the group":
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.send_signal(signal.SIGTERM)
    text = process.communicate(timeout=120)[0].replace("\r", "\n")
    seconds = time.monotonic() - sent
    newest = max(int(path.name.split("-")[1]) for path in output.glob("checkpoint-*"))
    logged = json.loads((output / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    package = f"{os.sep}leaf_plugins{os.sep}"
    return {"signal": how, "delay": delay, "seconds": seconds, "interrupted": text.count("interrupted"),
            "newest_is_last_logged": newest == logged, "step": newest,
            "partial": bool(list(output.glob(".partial-*"))),
            "traceback": any(line.lstrip().startswith('File "') and package in line for line in text.splitlines())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=7, help="SIGINT tries (then 2 SIGTERM tries)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--spread", type=float, default=1.0, help="seconds over which the moment is drawn")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        plans = ["SIGINT to the group"] * args.tries + ["SIGTERM to torchrun"] * 2
        for number, how in enumerate(plans):
            rows.append(one_try(Path(scratch) / f"try-{number}", args.processes, how, rng.uniform(0, args.spread)))
            print(json.dumps(rows[-1]), flush=True)
    seconds = [row["seconds"] for row in rows]
    clean = sum(row["interrupted"] == 1 and row["newest_is_last_logged"] and not row["partial"] and not row["traceback"]
                for row in rows)
    print(f"\n{len(rows)} tries on {args.processes} processes: {clean} clean; stop time median "
          f"{statistics.median(seconds):.1f} s, longest {max(seconds):.1f} s")


if __name__ == "__main__":
    main()
