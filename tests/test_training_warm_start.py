"""Warm start: teacher forcing on the references lowers the loss, and the checkpoint is a
backbone checkpoint that RL runs load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from leaf_plugins import get_host
from leaf_plugins.cli import main
from leaf_plugins.core.task import Example
from leaf_plugins.rollout.assembly import audio_token_ids
from leaf_plugins.training.config import BackboneConfig
from leaf_plugins.training.warm_start import WarmStartConfig, reference_tokens, warm_start

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "warm-start" / "tiny-qwen2-audio-translation.yaml"


def examples() -> list[Example]:
    rng = np.random.default_rng(0)
    sentences = ["Die Katze ist klein.", "Der Hund wohnt in Wien.", "Das Kind hat drei Bücher.", "Mein Bruder ist alt."]
    return [Example(f"x{i}", (rng.standard_normal(12000) * 0.1).astype(np.float32), "<|audio|> Translate.", s, 0.75)
            for i, s in enumerate(sentences * 2)]


def test_reference_tokens_end_with_eos():
    tokenizer = get_host().backbones.get("tiny-qwen2-audio").load(seed=0).tokenizer
    tokens, lengths = reference_tokens(tokenizer, ["Die Katze.", "Ja"])
    for row, length, text in zip(tokens.tolist(), lengths.tolist(), ["Die Katze.", "Ja"]):
        assert row[length - 1] == tokenizer.eos_token_id and all(t == -1 for t in row[length:])
        assert tokenizer.decode(row[: length - 1]) == text


def test_warm_start_learns_the_references_and_saves_a_loadable_backbone(tmp_path):
    config = WarmStartConfig(output_dir=str(tmp_path), epochs=10, batch_size=4, backbone=BackboneConfig())
    path = warm_start(config, examples())
    losses = [json.loads(line)["loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 10 and losses[-1] < 0.5 * losses[0]
    assert all(later < earlier for earlier, later in zip(losses, losses[1:]))
    backbone = get_host().backbones.get("tiny-qwen2-audio")
    reloaded = backbone.load(path=str(path), dtype="float32")
    again = backbone.load(path=str(path), dtype="float32")
    inputs = backbone.build_inputs(reloaded, ["<|audio|> Translate."], [examples()[0].audio])
    with torch.no_grad():
        assert torch.equal(reloaded.model.eval()(**inputs).logits, again.model.eval()(**inputs).logits)
    fresh = backbone.load(dtype="float32")
    assert audio_token_ids(reloaded) == audio_token_ids(fresh) and len(audio_token_ids(fresh)) == 3  # <|AUDIO|>, bos, eos
    assert warm_start(config, []) == path  # a finished warm start is reused


def test_example_config_loads_and_bad_keys_are_named(tmp_path, capsys):
    from leaf_plugins.training.warm_start import load_warm_start_config

    config = load_warm_start_config(CONFIG)
    assert (config.backbone.name, config.task.name, config.epochs) == ("tiny-qwen2-audio", "spoken-translation", 6)
    bad = tmp_path / "bad.yaml"
    bad.write_text("epocs: 3\n")
    assert main(["warm-start", str(bad)]) == 2
    assert "unknown key 'epocs'. Did you mean 'epochs'?" in capsys.readouterr().err
