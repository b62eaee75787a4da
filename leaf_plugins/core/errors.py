"""Errors that name the culprit and suggest the fix."""

from __future__ import annotations

import difflib
from typing import Iterable

__all__ = [
    "LeafError", "ConfigError", "ConfigNotice", "NonFiniteError", "UnknownNameError", "DuplicateNameError",
    "PluginLoadError", "suggest",
]


class LeafError(Exception):
    """Base class of every error leaf-plugins raises on bad input."""


class ConfigError(LeafError, ValueError):
    """A configuration value is invalid."""


class ConfigNotice(UserWarning):
    """A configuration was adjusted on the user's behalf (the notice says what, where
    it was given and why); ``leaf`` prints it as a ``note:`` line."""


class NonFiniteError(LeafError, ValueError):
    """A reward, surprisal, log-prob, advantage, loss or gradient is NaN or infinite."""


class UnknownNameError(LeafError, KeyError):
    """A name (estimator, backbone, task, reward) is not registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class DuplicateNameError(LeafError):
    """Two plugins registered the same name."""


class PluginLoadError(LeafError):
    """A plugin could not be imported or failed while registering."""


def suggest(name: str, known: Iterable[str]) -> str:
    """``" Did you mean 'x'?"``: a sentence naming the closest known names, or ``""``."""
    matches = difflib.get_close_matches(str(name), [str(k) for k in known], n=3, cutoff=0.6)  # keys may be null
    if not matches:
        return ""
    return " Did you mean " + " or ".join(repr(m) for m in matches) + "?"
