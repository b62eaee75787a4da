"""Rollout logs: the observer round trip through on_estimate, reader errors, the command."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from leaf_plugins import Engine, RolloutBatch
from leaf_plugins.cli import main
from leaf_plugins.core.errors import ConfigError
from leaf_plugins.rollout.log import RolloutLogger, batches_from_groups, read_groups
from written_files import run_naming_every_file_written


def _random_batch(seed: int, groups: int = 6, k: int = 8) -> RolloutBatch:
    generator = torch.Generator().manual_seed(seed)
    tokens, rewards, ids, surprisal = [], [], [], []
    for g in range(groups):
        for _ in range(k):
            length = int(torch.randint(6, 14, (1,), generator=generator))
            tokens.append(torch.randint(0, 3, (length,), generator=generator).tolist())
            rewards.append(float(torch.rand(1, generator=generator)))
            surprisal.append(torch.rand(length, generator=generator).tolist())
            ids.append(100 + g)
    return RolloutBatch.from_lists(tokens, rewards, ids, surprisal=surprisal)


def test_logger_round_trip_through_on_estimate(tmp_path):
    path = tmp_path / "logs" / "rollouts.jsonl"
    logger = RolloutLogger(path)
    engine = Engine("leaf", {"fork_budget": 2}, observers=[logger])
    first, second = _random_batch(1), _random_batch(2)
    results = [engine.estimate(first), engine.estimate(second)]
    assert logger.groups_written == 12 and logger.step == 2
    groups = list(read_groups(path))
    assert [g.step for g in groups] == [0] * 6 + [1] * 6
    assert [g.group_id for g in groups[:6]] == list(range(100, 106))
    rows = [i for i in range(first.size) if int(first.group_ids[i]) == 102]
    assert groups[2].tokens == [first.tokens[i, : first.lengths[i]].tolist() for i in rows]
    assert groups[2].rewards == pytest.approx(first.rewards[rows].tolist())
    assert groups[2].surprisal[0] == pytest.approx(first.surprisal[rows[0], : first.lengths[rows[0]]].tolist())
    assert groups[8].boundaries == results[1].boundaries[2] and groups[8].estimator == "leaf"
    # re-packing the logged groups gives the same LEAF boundaries
    (batch, held), = batches_from_groups(groups[6:], groups_per_batch=100)
    assert len(held) == 6
    assert Engine("leaf", {"fork_budget": 2}).estimate(batch).boundaries == results[1].boundaries


def test_reader_names_file_line_and_key(tmp_path):
    path = tmp_path / "bad.jsonl"
    good = {"step": 0, "group_id": 1, "prompt_id": "q1", "tokens": [[1, 2]], "rewards": [1.0],
            "surprisal": [[0.1, 0.2]]}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "surprisal": [[0.1]]}) + "\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: surprisal\[0\] has 1 values for a response of 2 tokens"):
        list(read_groups(path))
    path.write_text(json.dumps({k: v for k, v in good.items() if k != "rewards"}) + "\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: missing key 'rewards'"):
        list(read_groups(path))
    path.write_text("{not json\n")
    with pytest.raises(ConfigError, match="bad.jsonl:1: not valid JSON"):
        list(read_groups(path))
    with pytest.raises(ConfigError, match="does not exist"):
        list(read_groups(tmp_path / "missing.jsonl"))


def test_forkability_command_writes_tables_and_plot(tmp_path, capsys):
    path = tmp_path / "cell.jsonl"
    engine = Engine("leaf", {"fork_budget": 2}, observers=[RolloutLogger(path)])
    for seed in range(4):
        engine.estimate(_random_batch(seed, groups=10))
    out = tmp_path / "out"
    printed = run_naming_every_file_written(["forkability", "--rollouts", str(path), "--out", str(out),
                                             "--min-attempts", "2", "--resamples", "200", "--groups-per-batch", "7"],
                                            out, capsys)
    assert "| cell | 40 | 80 |" in printed
    with (out / "forkability.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))
    assert int(row["attempts"]) == 80 and 0 <= float(row["r_f"]) <= 1
    with (out / "forkability_positions.csv").open() as handle:
        positions = list(csv.DictReader(handle))
    assert sum(int(p["attempts"]) for p in positions) == 80
    assert sum(int(p["usable"]) for p in positions) == int(row["usable"])
    assert (out / "usable_rate.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "forkability.md").read_text().startswith("| Rollouts |")


def test_forkability_from_a_fresh_sampling_pass(tmp_path, capsys):
    """--sample: K responses per held-out example from a run config's (starting) model."""
    run = tmp_path / "run.yaml"
    run.write_text(f"""\
output_dir: {tmp_path / 'no-run'}
backbone: {{name: tiny-qwen2-audio}}
task: {{name: spoken-translation, options: {{size: 8, validation_size: 3, test_size: 1, cache_dir: {tmp_path}}}}}
rollout: {{group_size: 4, prompts_per_step: 2, max_new_tokens: 6}}
""")
    out = tmp_path / "out"
    code = main(["forkability", "--sample", str(run), "--split", "validation", "--out", str(out), "--min-attempts", "1",
                 "--resamples", "50", "--set", "rollout.temperature=1.5"])
    assert code == 0
    with (out / "forkability.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))
    # 3 validation examples, one group of 4 each; B = 2 boundary attempts at most per group
    assert row["label"] == "tiny-qwen2-audio-validation" and int(row["groups"]) == 3
    assert 0 < int(row["attempts"]) <= 6 and int(row["usable"]) <= int(row["fired"]) <= int(row["attempts"])
    assert (out / "usable_rate.png").exists()
