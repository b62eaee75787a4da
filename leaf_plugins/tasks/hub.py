"""Metadata rows from the Hugging Face hub (``datasets.load_dataset``), kept apart from the
local readers: it needs network access, which this project's CI does not have. Rows are
handed to the same parsers as the local files."""

from __future__ import annotations

from typing import Any, Iterator

from leaf_plugins.tasks.errors import DataError

__all__ = ["hub_rows"]


def hub_rows(repo_id: str, split: str, config: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, row)`` for each row of ``repo_id`` (a hub id or a local dataset folder)
    split ``split``. ``Audio`` columns are left undecoded (``{bytes, path}``): datasets'
    torchcodec decoder is not required."""
    import datasets

    try:
        dataset = datasets.load_dataset(repo_id, config, split=split)
    except Exception as error:  # hub, network and builder errors all mean "cannot load this"
        raise DataError(f"cannot load {repo_id!r} (config {config!r}, split {split!r}) with "
                        f"datasets.load_dataset: {type(error).__name__}: {error}") from error
    for name, feature in dataset.features.items():
        if isinstance(feature, datasets.Audio):
            dataset = dataset.cast_column(name, datasets.Audio(decode=False))
    for index, row in enumerate(dataset):
        yield f"{repo_id} split {split!r} row {index}", row
