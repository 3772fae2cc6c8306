"""Where a long text is cut for a reader: at a word, marked, within the limit (core.text)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runner.core.text import ends, head, one_line, tail

WORDS = st.lists(st.text(alphabet="abcdefgh/:.\"", min_size=1, max_size=12), min_size=1,
                 max_size=40).map(" ".join)


def test_head_cuts_at_a_word_boundary() -> None:
    why = "the collector runs: collector failed " * 10
    cut = head(why, 60)
    assert len(cut) <= 60 and cut.endswith("…") and why.startswith(cut[:-1])
    assert not why[len(cut) - 1].isalnum()  # the next character ends a word: none cut in two
    assert head("short", 60) == "short"
    assert head("x" * 100, 10) == "x" * 9 + "…"  # no boundary at all: cut, still marked


def test_tail_starts_at_a_word_boundary() -> None:
    out = 'nginx: [emerg] invalid parameter "listen" in /etc/nginx/sites-enabled/default:23'
    assert tail(out, 200) == out
    assert tail(out, 60) == '…parameter "listen" in /etc/nginx/sites-enabled/default:23'
    assert tail("x" * 100, 10) == "…" + "x" * 9  # no boundary at all: cut, still marked


def test_one_line_cuts_at_a_word() -> None:
    assert one_line("alpha beta\ngamma delta", 15) == "alpha beta…"


def test_a_reason_cut_in_the_middle_keeps_the_probe_and_the_error() -> None:
    # What the bench line shows of a failed episode: the start is which probe, the end the
    # error; a warning in between is what may go (found when ssh's "Permanently added ...
    # to the list of known hosts" hid the "Permission denied" after it).
    why = ("user can log in over ssh with the deploy key: exit 255, wanted 0: Warning: "
           "Permanently added '10.0.2.15' (ED25519) to the list of known hosts. "
           "deploy@10.0.2.15: Permission denied (publickey).")
    cut = one_line(why, 120, keep_end=True)
    assert len(cut) <= 120 and " … " in cut
    assert cut.startswith("user can log in over ssh") and cut.endswith("Permission denied (publickey).")
    assert one_line(why, 120).endswith("…")  # the default still keeps the start only
    assert ends("short", 60) == "short"


@given(WORDS, st.integers(min_value=1, max_value=80))
def test_a_cut_in_the_middle_keeps_within_the_limit_and_the_text_s_ends(text: str, limit: int) -> None:
    cut = ends(text, limit)
    assert len(cut) <= limit
    if len(text) <= limit:
        assert cut == text
    elif " … " in cut:
        front, back = cut.split(" … ", 1)
        assert text.startswith(front) and text.endswith(back)


@given(WORDS, st.integers(min_value=4, max_value=80))
def test_cuts_keep_within_the_limit_and_never_split_a_word_they_could_keep(
        text: str, limit: int) -> None:
    front, back = head(text, limit), tail(text, limit)
    assert len(front) <= limit and len(back) <= limit
    if len(text) <= limit:
        assert front == back == text
        return
    assert front.endswith("…") and back.startswith("…")
    assert text.startswith(front[:-1]) and text.endswith(back[1:])
    kept = back[1:]
    start = len(text) - len(kept)
    # the kept end starts at a word unless that would have thrown away more than half of it
    if start > 0 and not text[start - 1].isspace():
        assert len(kept) >= limit // 2
