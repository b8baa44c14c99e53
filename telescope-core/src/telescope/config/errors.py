"""The one error type of the config layer: every problem, each a user-facing message."""

from __future__ import annotations


class ConfigError(Exception):
    """An invalid configuration; ``problems`` holds one user-facing message each."""

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        where = f" ({self.source})" if self.source else ""
        if len(self.problems) == 1:
            return f"invalid configuration{where}: {self.problems[0]}"
        lines = "\n".join(f"  - {p}" for p in self.problems)
        return f"invalid configuration{where}:\n{lines}"
