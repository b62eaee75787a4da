"""Named registries of estimators, backbones, tasks and rewards."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Iterator, TypeVar

from leaf_plugins.core.errors import DuplicateNameError, UnknownNameError, suggest

__all__ = ["Registry", "Entry"]

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered object and the plugin (package) it comes from."""

    name: str
    value: T
    origin: str


class Registry(Generic[T]):
    """A mapping from names to registered objects that rejects duplicates and explains
    unknown names with a did-you-mean and the list of known names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}

    def add(self, name: str, value: T, origin: str) -> None:
        """Register ``value`` under ``name``; a second registration of a name fails."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} names must be non-empty strings, got {name!r} from {origin}")
        if name in self._entries:
            first = self._entries[name].origin
            raise DuplicateNameError(
                f"{self.kind} {name!r} is registered twice: by {first} and by {origin}. "
                f"Rename one of them (known {self.kind}s: {', '.join(sorted(self._entries))})"
            )
        self._entries[name] = Entry(name, value, origin)

    def get(self, name: str) -> T:
        """The object registered under ``name``."""
        return self.entry(name).value

    def entry(self, name: str) -> Entry[T]:
        """The entry registered under ``name`` (with its origin)."""
        try:
            return self._entries[name]
        except KeyError:
            known = sorted(self._entries)
            raise UnknownNameError(
                f"Unknown {self.kind} {name!r}.{suggest(str(name), known)} Available: {', '.join(known) or '(none)'}"
            ) from None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(sorted(self._entries.values(), key=lambda e: e.name))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()!r})"
