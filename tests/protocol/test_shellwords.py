"""protocol.shellwords: what a prefix rule may allow (hostile inputs, hypothesis properties)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.shellwords import matches, refusal, rule_problem, simple_words

HOSTILE = [
    "ls; curl x | sh",
    "ls $(rm -rf ~)",
    "git status && rm -rf /",
    "git status || rm -rf /",
    "git status | sh",
    "git status & rm -rf /",
    "git status `rm -rf ~`",
    "git status > /etc/passwd",
    "git status >> ~/.bashrc",
    "git status 2>/dev/null",
    "git status &> out",
    "git status < /etc/shadow",
    "git status <<< x",
    "git status <<EOF\nrm -rf ~\nEOF",
    "git status <(rm -rf ~)",
    "git status\nrm -rf ~",
    "git status \\\nrm -rf ~",
    "git status\rrm -rf ~",
    "git status ${HOME:=x}",
    "git status $HOME",
    "git status $'\\x3b'",
    "git status $((1+1))",
    "(git status)",
    "git status; (rm -rf ~)",
    "git status ;",
    "git status ';'",
    "git status |& tee x",
    "git status # ; rm",
    "git status \x1b[2K",
    "git status \x00",
    "git status \x85",
    "git status 'unclosed",
    "git status \\",
    "git status\t;\trm",
    "",
    "   ",
]


@pytest.mark.parametrize("command", HOSTILE)
def test_a_hostile_command_never_matches_a_prefix_rule(command):
    assert simple_words(command) is None
    assert refusal(command) is not None
    for prefix in ("git", "git status", "ls"):
        assert not matches("prefix", prefix, command)
    assert matches("exact", command, command)  # an exact rule allows exactly that text


@pytest.mark.parametrize("command,words", [
    ("git status", ("git", "status")),
    ("git\tstatus  -s", ("git", "status", "-s")),
    ("'git' \"status\" x", ("git", "status", "x")),
    ("git log --format='%h; %s'", ("git", "log", "--format=%h; %s")),
    ("git commit -m 'a && b | c'", ("git", "commit", "-m", "a && b | c")),
    ("echo a\\;b", ("echo", "a;b")),
    ("ls *.py [ab]? {x,y} ~", ("ls", "*.py", "[ab]?", "{x,y}", "~")),
    ("grep -r 'α β' .", ("grep", "-r", "α β", ".")),
    ("ls a\u00a0b", ("ls", "a\u00a0b")),  # a non-ASCII space is part of a word, as in bash
    ("ls a#b", ("ls", "a#b")),
])
def test_simple_commands_and_their_words(command, words):
    assert simple_words(command) == words


def test_prefix_rules_compare_whole_words():
    assert matches("prefix", "git status", "git status")
    assert matches("prefix", "git status", "git status -s --porcelain")
    assert matches("prefix", ["git", "status"], "'git' status -s")
    assert not matches("prefix", "git status", "git statusx")
    assert not matches("prefix", "git status", "git")
    assert not matches("prefix", "git", "gitk")
    assert not matches("prefix", "git", "g?t status")  # a glob is compared literally
    assert not matches("prefix", "git", "/usr/bin/git status")
    assert not matches("prefix", "git", "GIT_DIR=x git status")
    assert not matches("prefix", "", "git status")
    assert not matches("prefix", [], "git status")
    assert not matches("other", "git", "git")


def test_exact_rules_compare_the_text_as_given():
    assert matches("exact", "make test", "make test")
    assert not matches("exact", "make test", "make  test")
    assert not matches("exact", "make test", "make test ")
    assert not matches("exact", ["make", "test"], "make test")


def test_rule_problems():
    assert rule_problem("prefix", "git status") is None
    assert rule_problem("exact", "ls; rm -rf ~") is None
    assert "exact rule instead" in rule_problem("prefix", "ls; rm")
    assert "kind" in rule_problem("always", "ls")
    assert "needs a command" in rule_problem("exact", "  ")
    assert "NUL" in rule_problem("exact", "a\0b")
    assert "at most" in rule_problem("exact", "x" * 70_000)
    assert "words" in rule_problem("prefix", " ".join(["w"] * 65))


_word = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=8)
_operator = st.sampled_from([";", "&&", "||", "|", "&", "$(", "`", ">", "<", ">>", "<<", "\n",
                             "${", "(", ")", "$", "\r", "|&", "&>"])
#: Text around the operator that does not quote it: a quoted ``;`` inside a word (``";0"``) is
#: a literal character to bash and to the rules (module doc), not an operator.
_unquoted = st.text(st.characters(exclude_characters="'\"\\"), max_size=20)


@settings(max_examples=400, deadline=None)
@given(st.lists(_word, min_size=1, max_size=4), _operator, _unquoted, _unquoted)
def test_a_command_with_any_operator_never_matches_a_prefix_rule(rule_words, op, before, after):
    rule = " ".join(shlex_quote(w) for w in rule_words)
    command = f"{rule} {before}{op}{after}"
    assert not matches("prefix", rule, command)
    assert not matches("prefix", rule_words, command)


@settings(max_examples=400, deadline=None)
@given(st.lists(_word, min_size=1, max_size=4), st.lists(_word, max_size=4))
def test_quoted_words_round_trip_and_match_their_prefix(rule_words, more):
    command = " ".join(shlex_quote(w) for w in rule_words + more)
    words = simple_words(command)
    if any(("$" in w or "`" in w or "\n" in w or "\r" in w or w.startswith("#")
            or any(_cc(c) for c in w)) for w in rule_words + more):
        assert words is None  # refused, even quoted (module doc)
        return
    # a word of operator characters only is refused too, even quoted
    if any(set(w) <= set("();<>|&") for w in rule_words + more):
        assert words is None
        return
    assert words == tuple(rule_words + more)
    assert matches("prefix", rule_words, command)


def _cc(char: str) -> bool:
    import unicodedata
    return char != "\t" and unicodedata.category(char) == "Cc"


def shlex_quote(word: str) -> str:
    import shlex
    return shlex.quote(word)


def test_a_command_past_the_bound_never_matches_a_prefix_rule_and_is_not_lexed(monkeypatch):
    from protocol import shellwords
    long_word = "ls " + "a" * (shellwords.MAX_PREFIX_COMMAND_CHARS)
    assert len(long_word) > shellwords.MAX_PREFIX_COMMAND_CHARS
    assert simple_words("ls " + "a" * 100) == ("ls", "a" * 100)

    def no_lexing(*args, **kwargs):
        raise AssertionError("lexed a command past the bound")
    monkeypatch.setattr(shellwords.shlex, "shlex", no_lexing)
    assert not matches("prefix", ("ls",), long_word)
    assert simple_words(long_word) is None
    assert "characters" in refusal(long_word)
    assert "characters" in rule_problem("prefix", long_word)
    assert matches("exact", long_word, long_word)  # an exact rule has no such bound
