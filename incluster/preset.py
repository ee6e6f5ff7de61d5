"""A router's preset (models.ini) read as llama.cpp b10729 reads it (common/preset.cpp, its PEG grammar), and
which models a new preset reloads (tools/server/server-models.cpp, the reload's compare): the one reading the
keeper drains by and the change preview says what a library edit does by.

The grammar, line by line (newline ::= "\\r\\n" / "\\n" / "\\r"): a header ``[name]``, a key line
``ident ws "=" ws value`` (ident ::= [a-zA-Z_][a-zA-Z0-9_.-]*; the value ends where blanks then a ``;`` or
``#`` comment, or the line's end, begin), a comment line or a blank one. The section ``[*]`` is global
(common_preset_context::load_from_ini); keys before any header form a section named ``default``. A model's
settings are the global ones overridden by its own section's (cascade); ``version`` is skipped. On a reload
the router unloads a running model whose settings differ, host, port and alias aside
(preset_options_for_compare), or that the new preset no longer lists, and keeps every other child running. Keys are compared as written: the router
compares the options they name, and the render writes each flag under one name.

Standard library only: shipped to the router's pod with the keeper (library.py), and imported by the program
as ``incluster.preset``."""

import re

NEWLINE = re.compile(r"\r\n|\n|\r")
_HEADER = re.compile(r"\[[ \t]*([^\]]+)\][ \t]*(?:[;#].*)?")
_KEY = re.compile(r"([a-zA-Z_][a-zA-Z0-9_.-]*)[ \t]*=[ \t]*(.*?)[ \t]*(?:[;#].*)?")
GLOBAL = "*"
BEFORE_ANY_HEADER = "default"  # COMMON_PRESET_DEFAULT_NAME
# Settings the reload does not compare (preset_options_for_compare unsets them; the loader skips version).
NOT_COMPARED = frozenset({"host", "port", "alias", "version"})


def lines(text):
    """The preset's lines at llama.cpp's own newlines (never at U+2028 and the other separators
    str.splitlines() knows); a last newline ends a line and starts none."""
    split = NEWLINE.split(text)
    if split and split[-1] == "":
        split.pop()
    return split


def section_of(line):
    """The section a header line opens, or None for any other line."""
    match = _HEADER.fullmatch(line)
    return match.group(1).strip() if match else None


def sections(text):
    """Section -> {key: value} (a key given twice: the last; a section given twice: the last); keys before any
    header under BEFORE_ANY_HEADER."""
    parsed, current = {BEFORE_ANY_HEADER: {}}, BEFORE_ANY_HEADER
    for line in lines(text):
        header = section_of(line)
        if header is not None:
            current = header
            parsed[current] = {}  # a section given twice starts over, as llama.cpp's loader reads it
            continue
        match = _KEY.fullmatch(line)
        if match:
            parsed[current][match.group(1)] = match.group(2)
    return parsed


def settings(parsed, name):
    """A model's settings as the router compares them: the global ones overridden by its section's."""
    merged = {**parsed.get(GLOBAL, {}), **parsed.get(name, {})}
    return {key: value for key, value in merged.items() if key not in NOT_COMPARED}


def models(parsed):
    """The models a parsed preset lists: every section but the global one, and the keys before any header
    only where there are some (load_from_ini skips an empty one)."""
    names = set(parsed) - {GLOBAL}
    if not parsed.get(BEFORE_ANY_HEADER):
        names.discard(BEFORE_ANY_HEADER)
    return names


def reloaded(old_text, new_text):
    """The models of both presets whose settings differ: a reload unloads each of them if it runs."""
    old, new = sections(old_text), sections(new_text)
    return sorted(name for name in models(old) & models(new) if settings(old, name) != settings(new, name))


def removed(old_text, new_text):
    """The models the new preset no longer lists: a reload unloads each of them if it runs, and forgets it."""
    return sorted(models(sections(old_text)) - models(sections(new_text)))
