"""A part of a long job that several processes or machines share (``--shard I/N``): the suite's
students (``kdw reproduce``), a teacher cache's pieces (``kdw cache``)."""

from __future__ import annotations

from dataclasses import dataclass

from workbench.core.errors import WorkbenchError


@dataclass(frozen=True)
class Shard:
    """The ``index``-th (from 1) of ``count`` disjoint parts of a list of work: every
    ``count``-th item from the ``index``-th on."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``"2/4"`` → ``Shard(2, 4)``; anything else a one-line error."""
        index, slash, count = text.partition("/")
        if not (slash and index.strip().isdigit() and count.strip().isdigit()):
            raise WorkbenchError(f"--shard {text!r}: write I/N, e.g. 2/4 (the 2nd of 4 parts)")
        shard = cls(int(index), int(count))
        if not 1 <= shard.index <= shard.count:
            raise WorkbenchError(f"--shard {text}: I must be between 1 and N ({shard.count})")
        return shard

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def positions(self, total: int) -> list[int]:
        """The positions in a list of ``total`` items that this shard takes."""
        return list(range(self.index - 1, total, self.count))
