"""Which commands a session's approval rule allows (PROTOCOL.md §3.4): pure, no I/O.

Theory of operation: a rule is ``exact`` (the exact command text, compared as given: no
normalising of spaces or quotes, so it allows that one text and nothing else, whatever the
text holds) or ``prefix`` (leading words: it allows any command that is ONE simple command
whose first words, after the shell's quote removal, are the rule's words; any further words
may follow). :func:`simple_words` decides "one simple command" and gives its words;
:func:`matches` applies a rule. The bash tool runs its command as ``bash -c``, so the words
must be the ones bash would see, and everything that could make bash run *another*
command, or the same command with output or input elsewhere, refuses -- fail closed: a
refused command is not refused to run, it is only asked about like any call.

A command is NOT a simple command (``simple_words`` returns None) when it holds, anywhere,
quoted or not (a quoted one is refused too: simpler to trust, and still only asked):

* ``$`` -- ``$(...)``, ``${...}``, ``$VAR``, ``$'...'``, arithmetic ``$((...))``: an
  expansion's text is not known before it runs (``${x:=...}`` assigns, ``$(...)`` runs);
* a backtick (command substitution);
* a newline or carriage return (a second command line; ``\\``-newline continuations, and
  here-docs, which need a newline), or any other control character (``Cc``: NUL, ESC, C1):
  the person must see what runs;
* an unbalanced quote or a trailing backslash (shlex cannot split it; neither would bash).

and when a shell token (``shlex`` in POSIX mode with ``punctuation_chars``) is made of
operator characters only, i.e. one of ``;`` ``&`` ``&&`` ``|`` ``||`` ``<`` ``>`` ``>>``
``<<`` (here-docs, here-strings) ``<(`` ``(`` ``)`` (subshells, process substitution) ``;;``
``|&`` ``&>`` -- even quoted (``ls ';'``): shlex cannot tell a quoted ``;`` from an operator,
so both refuse. Operator characters inside a word (``'a;b'``, ``a\\;b``) are literal to bash
and to us. A word that begins with ``#`` starts a comment in bash: refused too (words after
it would be words to us and not to bash). No word at all (blank text) is not a command.

Allowed, and why: globs (``*``, ``?``, ``[``), braces (``{a,b}``), ``~``, ``!``, ``=`` and
non-ASCII text. They only make *arguments* of the same program: a prefix rule's words are
compared literally (``g?t`` is not ``git``; a rule whose words hold a glob matches only the
same literal word), and the words after the prefix may be anything by the rule's meaning.
Tabs separate words as spaces do (bash's blanks); non-ASCII spaces are part of a word in
bash and here. So a prefix rule is as wide as its program: ``git`` allows ``git -c
alias.x=!sh ...``; prefer ``git status``.

A command longer than :data:`MAX_PREFIX_COMMAND_CHARS` is not a simple command either, and
this is decided before any lexing: ``shlex`` is quadratic in a word's length (a 1 MB word
took the daemon's event loop 95 s), and the gate runs on that loop. :func:`simple_words`
lexes once; a caller matching many rules lexes the command once (:func:`matches_words`).
"""

from __future__ import annotations

import shlex
import unicodedata
from typing import Literal, Sequence

__all__ = ["MAX_PREFIX_COMMAND_CHARS", "MAX_RULE_CHARS", "MAX_RULE_WORDS", "RuleKind",
           "matches", "matches_words", "refusal", "rule_problem", "simple_words"]

RuleKind = Literal["exact", "prefix"]
#: An exact rule's text, at most (characters); a prefix rule's words, at most.
MAX_RULE_CHARS = 65_536
MAX_RULE_WORDS = 64
#: A command a prefix rule may match, at most (characters; longer: asked, never lexed). 4,096
#: is POSIX's smallest ``LINE_MAX``/``_POSIX_ARG_MAX`` and far above a command a person reads
#: and approves by its words, while ``shlex`` over it stays in the milliseconds (module doc).
MAX_PREFIX_COMMAND_CHARS = 4_096
#: shlex's punctuation characters (``punctuation_chars=True``): a token of only these is an
#: operator to bash (or a quoted one, refused alike: module doc).
_OPERATOR_CHARS = frozenset("();<>|&")
_NEVER = {"$": "an expansion ($)", "`": "a command substitution (`)",
          "\n": "a newline", "\r": "a carriage return"}


def refusal(command: str) -> str | None:
    """Why ``command`` is not one simple command (a phrase), or None when it is one."""
    return _lexed(command)[0]


def _lexed(command: str) -> tuple[str | None, tuple[str, ...]]:
    """``(refusal, words)``: why ``command`` is not one simple command (None when it is one)
    and, when it is, its words; lexed at most once, never past the bound (module doc)."""
    if len(command) > MAX_PREFIX_COMMAND_CHARS:
        return f"more than {MAX_PREFIX_COMMAND_CHARS} characters", ()
    for char, why in _NEVER.items():
        if char in command:
            return why, ()
    for char in command:
        if char != "\t" and unicodedata.category(char) == "Cc":
            return f"a control character (U+{ord(char):04X})", ()
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.commenters = ""
    lexer.whitespace_split = True
    try:
        words = tuple(lexer)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        return f"text the shell cannot split ({exc})", ()
    if not words:
        return "no command", ()
    for word in words:
        if word and set(word) <= _OPERATOR_CHARS:
            return f"the operator {word!r}", ()
    # A '#' that starts a word (unquoted) starts a comment; the lexer keeps quotes' '#' too,
    # so any word that starts with '#' refuses (module doc: fail closed).
    if any(word.startswith("#") for word in words):
        return "a comment (#)", ()
    return None, words


def simple_words(command: str) -> tuple[str, ...] | None:
    """The words of ``command`` when it is one simple command (module doc), else None."""
    why, words = _lexed(command)
    return words if why is None else None


def rule_problem(kind: str, command: str) -> str | None:
    """Why a rule of ``kind`` over ``command`` cannot be made (a sentence), or None."""
    if kind not in ("exact", "prefix"):
        return f"a rule's kind is exact or prefix, not {kind!r}"
    if not command.strip():
        return "a rule needs a command: the exact text, or the leading words for a prefix"
    if len(command) > MAX_RULE_CHARS:
        return f"a rule's command is at most {MAX_RULE_CHARS} characters"
    if "\0" in command:
        return "a rule's command must not contain NUL"
    if kind == "prefix":
        why, words = _lexed(command)
        if why is not None:
            shown = command if len(command) <= 200 else command[:200] + "..."
            return (f"a prefix rule is words of one simple command; {shown!r} holds {why} "
                    "(allow that exact command with an exact rule instead)")
        if len(words) > MAX_RULE_WORDS:
            return f"a prefix rule has at most {MAX_RULE_WORDS} words"
    return None


def matches(kind: str, rule: str | Sequence[str], command: str) -> bool:
    """Whether a rule allows ``command``: ``exact`` with ``rule`` the exact text; ``prefix``
    with ``rule`` its words (a sequence) or a command string of them (module doc)."""
    if kind == "exact":
        return isinstance(rule, str) and command == rule
    if kind != "prefix":
        return False
    words = simple_words(rule) if isinstance(rule, str) else tuple(rule)
    return matches_words(words, simple_words(command))


def matches_words(rule_words: Sequence[str] | None, command_words: Sequence[str] | None) -> bool:
    """Whether a prefix rule's words lead a command's words (:func:`simple_words` of it, None
    when it is not one simple command): the command lexed once for every rule."""
    if not rule_words or command_words is None:
        return False
    return tuple(command_words[:len(rule_words)]) == tuple(rule_words)
