"""One error format for everything the user must fix: one line, the config path, the fix."""

from __future__ import annotations

# More than this many problems in one line stops being readable; the count of the rest is given.
SHOWN_PROBLEMS = 3


def one_line(text: str) -> str:
    """An error message as exactly one printable line: control characters, line breaks and lone
    surrogates (which a stack value can hold) are shown escaped, never echoed raw."""
    return "".join(c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF else repr(c)[1:-1] for c in text)


class Problems(Exception):
    """Things the user must fix, each (config path, what is wrong and the fix). ``str()`` is one
    line: a heading, the first few problems, and how many more there are."""

    heading = "problems"

    def __init__(self, problems: list[tuple[str, str]]):
        if not problems:
            raise ValueError("Problems needs at least one problem")
        # A fact that several servers share (their pool's backend) is one problem, said once.
        self.problems = list(dict.fromkeys(problems))
        problems = self.problems
        shown = "; ".join(f"{path}: {message}" for path, message in problems[:SHOWN_PROBLEMS])
        more = len(problems) - SHOWN_PROBLEMS
        super().__init__(one_line(f"{self.heading}: {shown}" + (f" (and {more} more)" if more > 0 else "")))


class ConfigError(Problems):
    """Invalid stack config."""

    heading = "invalid stack config"


class CapacityError(Problems):
    """A capacity plan that does not fit: each problem names pool or model, estimate and budget."""

    heading = "capacity plan does not fit"
