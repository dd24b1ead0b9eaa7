"""What the modes' generative tests share: a drawn stream of landings, views and compactions, and cutting it up."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st


@dataclass
class Stream:
    """A shape and its actions: ("land", increment, files), ("view",), ("compact",)."""

    shape: str
    actions: list[tuple[Any, ...]]

    def header(self) -> str:
        return f"shape {self.shape}"

    def file_name(self, i: int) -> str:
        raise NotImplementedError  # each mode's test names its landed files as its model does

    def __repr__(self) -> str:  # hypothesis prints this for a failing example
        lines = [self.header()]
        for a in self.actions:
            if a[0] == "land":
                lines.append(f"land {a[1]}:")
                lines += [f"  {self.file_name(i)}: {rows}" for i, rows in enumerate(a[2])]
            else:
                lines.append(a[0])
        return "\n".join(lines)


def cuts(draw: st.DrawFn, items: list[Any], most: int) -> list[list[Any]]:
    """``items`` cut into at most ``most`` consecutive (possibly empty) pieces."""
    points = sorted(draw(st.lists(st.integers(0, len(items)), max_size=most - 1)))
    bounds = [0, *points, len(items)]
    return [items[a:b] for a, b in itertools.pairwise(bounds)]
