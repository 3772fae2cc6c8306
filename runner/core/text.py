"""Text from the guest, the model or a file, made safe to show: the one owner of that cleaning.

Guest output, model text, spec fields and cassette fields are attacker-controlled.
Two kinds of character in them can lie to the reader:

* terminal control sequences (``ESC [ ...``, C0 and C1 controls), which can
  repaint the user's terminal or hide a line;
* Unicode format characters (category ``Cf``): the bidirectional overrides,
  embeddings and isolates (U+202A-202E, U+2066-2069) that make ``gnp.exe``
  read as ``exe.png``, the marks U+200E/U+200F/U+061C, zero-width spaces,
  the byte-order mark, and the invisible "tag" characters that can smuggle
  text past a reader.

:func:`clean_text` strips the first kind only; it is what the *model* is sent
of the guest's output (that text is part of every recorded request, so it is
never changed here). Everything shown to a *person* (the terminal, tables,
JUnit XML, the HTML report, ATIF) passes :func:`printable` or
:func:`one_line`, which strip both kinds and make the text encodable.

Text from a recording that lands in Markdown (the README's results block, a
``--format github`` table) is one line *and* escaped for Markdown
(:func:`md_cell`, :func:`md_code`): a model name holding a newline and
``<!-- results:end -->``, a ``|``, a link or an HTML tag must stay that text,
never become the file's structure.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]|"
                      r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_ANY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]+")

# Unicode's format characters (general category Cf, Unicode 14, Python 3.11's tables);
# tests/unit/test_hostile_readers.py checks this list against the running interpreter's.
FORMAT_RANGES = (
    (0x00AD, 0x00AD), (0x0600, 0x0605), (0x061C, 0x061C), (0x06DD, 0x06DD), (0x070F, 0x070F),
    (0x0890, 0x0891), (0x08E2, 0x08E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x2064), (0x2066, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD),
    (0x110CD, 0x110CD), (0x13430, 0x13438), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001), (0xE0020, 0xE007F),
)
_FORMAT = re.compile("[" + "".join(f"{chr(a)}-{chr(b)}" if a != b else re.escape(chr(a))
                                   for a, b in FORMAT_RANGES) + "]+")


def clean_text(text: str) -> str:
    """``text`` without terminal control sequences (keeps newlines and tabs).

    What the model is sent of guest output; for anything a person reads use
    :func:`printable`, which also removes bidirectional and other format characters.
    """
    return _CONTROL.sub("", text)


def neutralize(text: str) -> str:
    """``text`` without Unicode format characters (bidi overrides and isolates, zero-width
    characters, tags): what is shown is then the characters in the order they are stored."""
    return _FORMAT.sub("", text)


def one_line(text: str, limit: int = 200, *, keep_end: bool = False) -> str:
    """``text`` fit to show, on one line, at most ``limit`` characters (cut at a word, with an
    ellipsis, by :func:`head`; or, with ``keep_end``, in the middle by :func:`ends`)."""
    text = _ANY_CONTROL.sub(" ", neutralize(clean_text(str(text)))).strip()
    text = (ends if keep_end else head)(" ".join(text.split()), limit)
    return text.encode("utf-8", "replace").decode("utf-8")


def head(text: str, limit: int) -> str:
    """The start of ``text`` in at most ``limit`` characters, cut at a word boundary with "…".

    A reader of a cut "why" should never have to guess a word: so the cut
    falls at the last space, unless that would throw away more than half (a
    long path or a word longer than the limit is then cut inside, still marked).
    """
    if len(text) <= limit:
        return text
    cut = text[:limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:-") + "…"


def tail(text: str, limit: int) -> str:
    """The end of ``text`` in at most ``limit`` characters, starting at a word boundary with "…".

    What a probe keeps of a long output is its end (where the error is), and
    starting mid-word (``d parameter "listen"``) misleads the reader; so the
    cut falls after the first whitespace, unless that would throw away more than
    half of what is kept (then it is cut inside, still marked).
    """
    if len(text) <= limit:
        return text
    cut = text[len(text) - (limit - 1):]
    if not text[len(text) - limit].isspace():  # the kept part starts inside a word
        space = next((i for i, ch in enumerate(cut) if ch.isspace()), len(cut))
        if space < limit // 2:
            cut = cut[space:]
    return "…" + cut.lstrip()


def ends(text: str, limit: int) -> str:
    """The start and the end of ``text`` in at most ``limit`` characters, " … " between them.

    A verdict's reason is "probe name: what was seen", and what was seen ends
    with the error (``Permission denied``) while its start is often a
    harmless warning: a cut at the end alone would keep the warning and lose
    the error, one at the start alone would lose which probe it was. So about
    two fifths go to the start (:func:`head`) and the rest to the end
    (:func:`tail`), both cut at words.
    """
    if len(text) <= limit or limit < 12:  # too short to hold both ends: the start alone
        return head(text, limit)
    front = head(text, limit * 2 // 5)
    back = tail(text, limit - len(front) - 1)
    return front.removesuffix("…").rstrip() + " … " + back.removeprefix("…")


def reason_first(message: str, value: object, limit: int = 60) -> str:
    """A validator's message about ``value`` (``[{...100 items...}] is too long``, as
    jsonschema words them: the value's ``repr``, then the reason) as one line whose reason is
    never cut: the ``repr`` is cut to ``limit`` characters (:func:`head`), the rest kept.

    A plain cut of the whole message at its end lost the reason behind a long value, so the
    reader saw only the start of a list.
    """
    shown = repr(value)
    if len(shown) > limit and shown in message:
        message = message.replace(shown, head(shown, limit), 1)
    return one_line(message, max(200, limit + 100), keep_end=True)


def printable(text: str) -> str:
    """``text`` fit to show a person: control sequences and format characters stripped, and
    encodable (lone surrogates, as from a YAML ``"\\udc80"``, become ``?``)."""
    return neutralize(clean_text(text)).encode("utf-8", "replace").decode("utf-8")


# Every ASCII character Markdown (CommonMark, GitHub's tables) or inline HTML reads as markup
# anywhere in a line: a backslash before any ASCII punctuation makes it that character.
_MARKDOWN = re.compile(r"([\\`*_\[\]<>|&~$])")


def md_cell(text: str, limit: int = 200) -> str:
    """``text`` as one line of Markdown text, fit for a table cell or a sentence: :func:`one_line`
    (at most ``limit`` characters), then every character Markdown or HTML would read as markup
    (``|`` a new cell, ``<`` a tag or comment, ``[`` a link, a backtick, emphasis, ``&`` an
    entity, the backslash itself) backslash-escaped, so it shows as typed. Plain names
    (``qwen2.5-coder-1.5b``, ``easy-tier``) come out unchanged."""
    return _MARKDOWN.sub(r"\\\1", one_line(text, limit))


def md_code(text: str, limit: int = 200) -> str:
    """``text`` as a one-line Markdown code span (a folder name in prose): :func:`one_line`,
    fenced by one backtick more than the longest run of them in it (Markdown's own rule, as
    nothing inside a code span can be escaped), padded with a space when it holds any."""
    body = one_line(text, limit)
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if longest else ""
    return f"{fence}{pad}{body}{pad}{fence}"
