"""Finding NaN and infinite values cheaply: one sum per tensor and a single host
synchronisation for all of them; locations are looked up only when something is bad."""

from __future__ import annotations

from typing import Mapping

import torch

from leaf_plugins.core.errors import NonFiniteError

__all__ = ["nonfinite_fields", "check_finite"]


def nonfinite_fields(fields: Mapping[str, torch.Tensor | None]) -> list[str]:
    """The names of the tensors in ``fields`` that hold a NaN or an infinity (``None``
    and empty entries are skipped), in the mapping's order.

    Fast path: one sum per field (a NaN or an infinity makes the sum non-finite; no
    ``[N, T]`` temporary is allocated) and one ``isfinite`` over the ``[F]`` sums with a
    single host sync. Only a field whose sum is not finite, because it holds a bad value
    or because huge finite values overflowed, gets the exact elementwise check."""
    names = [name for name, value in fields.items() if value is not None and value.numel()]
    if not names:
        return []
    sums = torch.stack([fields[name].sum().double() for name in names])  # [F]
    finite = torch.isfinite(sums)  # [F]
    if bool(finite.all()):  # the one host sync
        return []
    suspects = [name for name, ok in zip(names, finite.tolist()) if not ok]
    return [name for name in suspects if not bool(torch.isfinite(fields[name]).all())]


def check_finite(
    fields: Mapping[str, torch.Tensor | None], group_ids: torch.Tensor, what: str = "", hint: str = ""
) -> None:
    """Raise ``NonFiniteError`` when a tensor of ``fields`` (``[N]`` or ``[N, T]``, row
    ``i`` belonging to response ``i``) is not finite, naming the field, the first bad
    response index, its group id, the token position (per-token fields), the value and
    how many values are bad.

    :param group_ids: ``[N]`` group id of each response.
    :param what: the origin of the values, put before the message (``"estimator 'leaf'"``).
    :param hint: a sentence put after it (what to do).
    """
    bad = nonfinite_fields(fields)
    if not bad:
        return
    problems = []
    for name in bad:
        value = fields[name]
        assert value is not None
        where = (~torch.isfinite(value)).nonzero()  # [M, value.dim()]
        first = where[0].tolist()
        row = first[0]
        token = f", token {first[1]}" if len(first) > 1 else ""
        others = f" ({len(where) - 1} more non-finite value{'s' if len(where) > 2 else ''})" if len(where) > 1 else ""
        problems.append(f"{name} of response {row} (group id {int(group_ids[row])}{token}) is "
                        f"{float(value[tuple(first)])}{others}")
    prefix = f"{what}: " if what else ""
    raise NonFiniteError(prefix + "; ".join(problems) + (f". {hint}" if hint else ""))
