"""Tables: collected per section, printed as text and written as Markdown."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Table:
    """One section's table plus the notes that explain it."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: peers or parts that could not run, with the reason
    skipped: list[str] = field(default_factory=list)
    #: how many leading columns are text (left-aligned); the rest are figures
    text_columns: int = 1

    def add(self, *cells: object) -> None:
        self.rows.append([str(c) for c in cells])

    def text(self) -> str:
        widths = [len(c) for c in self.columns]
        for r in self.rows:
            for i, c in enumerate(r):
                widths[i] = max(widths[i], len(c))

        def line(cells: list[str]) -> str:
            out = []
            for i, c in enumerate(cells):
                # first column left-aligned, figures right-aligned
                out.append(c.ljust(widths[i]) if i < self.text_columns else c.rjust(widths[i]))
            return "  ".join(out).rstrip()

        parts = [f"== {self.title} ==", line(self.columns), line(["-" * w for w in widths])]
        parts += [line(r) for r in self.rows]
        parts += [f"could not run: {s}" for s in self.skipped]
        parts += [f"note: {n}" for n in self.notes]
        return "\n".join(parts)

    def markdown(self) -> str:
        parts = [f"### {self.title}", ""]
        parts.append("| " + " | ".join(self.columns) + " |")
        rule = ["---" if i < self.text_columns else "---:" for i in range(len(self.columns))]
        parts.append("|" + "|".join(rule) + "|")
        parts += ["| " + " | ".join(r) + " |" for r in self.rows]
        if self.skipped:
            parts.append("")
            parts += [f"- **could not run**: {s}" for s in self.skipped]
        if self.notes:
            parts.append("")
            parts += [f"- {n}" for n in self.notes]
        return "\n".join(parts)
