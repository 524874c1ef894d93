"""What a shell command line runs: its simple commands, each with its wrappers taken off, and
whether the whole line is exactly one plain simple command (the only shape the hook may approve).

Design note. The hook needs two answers from one line, with opposite failure modes:

- *Which commands does it run?* (to cap heavy work): every simple command, wherever it stands —
  after `;`, `&&`, `|`, a newline, inside `{ }`, `( )`, `if`/`while` bodies, `$(...)`, backticks,
  a `bash -c '<literal>'`, a heredoc fed to a shell — with the wrappers agents type taken off
  (`timeout 60`, `nice -n 10`, `env X=1`, `uv run`, `npx`, ...). A miss here only costs the cap.
- *Is the line one plain simple command?* (to answer "allow" without the harness asking): a miss
  here widens what runs unasked, so it is strict: no separator, pipe (but into `head`, `tail` or
  `wc` with options alone), `&`, newline, substitution, process substitution, heredoc, `$` other
  than `$NAME`/`${NAME}`, redirection other than between the usual fds or to/from `/dev/null`;
  a literal command word found on the PATH (no `/`: `./pytest` may be anything);
  assignments (before it, or through `env`) only of names on a short
  list that cannot make any program run other code (`CI`, `TERM`, `LANG`, ...; never `PATH`,
  `LD_*`, `PYTHONPATH`, ...). An optional `cd <plain word> &&` may come first (agents write it before nearly every
  command; `cd` runs nothing).

Rejected: `shlex` alone (it knows quotes, not operators: `a;b` is one word to it, and it has no
notion of `$(...)` inside double quotes); bashlex (a real bash grammar, but its import took 2.3-4.4 s
against 0.2-0.3 s for `python -c pass` on a loaded 2-core machine, on every matching command, and
it raises on some of what agents type, `case` for one, where we still want the commands for the
cap). This lexer knows quoting, escapes, every expansion that can run
code, comments, heredocs and the operators; what it does not understand (`case`, an unclosed
quote) makes `parse` raise `Unparsed`, and the caller treats the line as not plain.

Pure: no I/O. Standard library only (on the hook's path).

Size: past 600 lines and still one concept: one reader of the shell's grammar (words, quotes,
separators, compound commands, heredocs, `bash -c`) that both answers share; split in two, the
two answers would read one line two ways.
"""

from __future__ import annotations

import re

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RUN = re.compile(r"[^\s;&|<>()\\'\"$`*?\[~{}]+")  # characters that are only themselves in a word
_BLANKS = re.compile(r"[ \t\r]+")
_SPECIAL_START = frozenset(" \t\r\\#\n<>;&|()0123456789")
_VAR = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{[A-Za-z_][A-Za-z0-9_]*\}|[0-9?#$!@*-])")
_OPS = ("&&", "||", ";;", "|&", ";", "&", "|", "(", ")", "\n")
_REDIRS = ("&>>", "<<<", "<<-", "<<", ">>", "<&", ">&", "<>", ">|", "&>", "<", ">")
# The only assignments a plain line may make (before the command, or through `env`): names that
# change how a program prints or what it targets, never which code runs. A list of the harmful
# ones could not be whole (PATH, LD_*, PYTHONPATH, NODE_OPTIONS, PERL5OPT, GIT_SSH_COMMAND, ... all
# run code of the caller's choosing), so any other name makes the line not plain: the harness
# asks, as it would without us.
_SAFE_ASSIGN = re.compile(
    r"CI|DEBUG|VERBOSE|TERM|COLUMNS|LINES|NO_COLOR|FORCE_COLOR|CLICOLOR(?:_FORCE)?|TZ|LANG|LANGUAGE"
    r"|LC_[A-Z]+|PYTHONUNBUFFERED|PYTHONDONTWRITEBYTECODE|PYTHONHASHSEED|PYTHONIOENCODING"
    r"|NODE_ENV|RUST_LOG|RUST_BACKTRACE|CARGO_TERM_COLOR|GOOS|GOARCH|CGO_ENABLED|GOFLAGS_COLOR"
    r"|TEST_ENV|RAILS_ENV|RACK_ENV|APP_ENV"
)
_RESERVED = frozenset(
    "if then elif else fi while until do done { } ! function select coproc".split()
)
_SHELLS = frozenset("bash sh dash zsh ksh".split())
_PIPE_FILTERS = frozenset("head tail wc".split())


MAX_LENGTH = (
    100_000  # characters: a longer line is not read (never plain; the cap still searches it)
)
MAX_NESTED = 500  # substitutions, `bash -c` scripts and heredoc scripts read in one line


class Unparsed(ValueError):
    """A line this lexer does not understand: it may run anything."""


class Word:
    """One shell word: its value with quotes removed (variables left as written), and whether it
    is plain (nothing in it runs code: only quoting, escapes and `$NAME`/`${NAME}`) and literal
    (plain and without any variable: its value is exactly what the program gets)."""

    __slots__ = ("bare", "literal", "plain", "quoted", "value")

    def __init__(self, value: str, plain: bool, literal: bool, quoted: bool, bare: int = 0):
        self.value = value
        self.plain = plain
        self.literal = literal
        self.quoted = quoted
        self.bare = bare  # how many characters of value came before any quote or escape


class Simple:
    """One simple command: its assignments, words and redirections as written (`words` of Word),
    and `argv`, the words with the wrappers taken off (the command that does the work)."""

    __slots__ = ("argv", "assigns", "env_assigns", "redirs", "words", "wrapped_by_sudo")

    def __init__(self) -> None:
        self.assigns: list[Word] = []
        self.env_assigns: list[str] = []  # `env NAME=value ...`'s, taken off with the wrapper
        self.words: list[Word] = []
        self.redirs: list[tuple[str, Word | None]] = []
        self.argv: list[str] = []
        self.wrapped_by_sudo = False


class Line:
    """A parsed line: every simple command it runs (`commands`, nested ones included) and `plain`,
    the single plain simple command the whole line is, if it is one (else None)."""

    __slots__ = ("commands", "plain")

    def __init__(self, commands: list[Simple], plain: Simple | None):
        self.commands = commands
        self.plain = plain


class _Lexer:
    """Tokens of a line: ("word", Word), ("op", text), ("redir", op, target Word or None) and
    ("heredoc", op, delimiter Word, body). Commands found inside substitutions go to `nested`."""

    def __init__(self, text: str, depth: int, budget: list[int]):
        self.s = text
        self.i = 0
        self.depth = depth
        self.budget = budget
        self.tokens: list[tuple] = []
        self.nested: list[Simple] = []
        self.pending: list[list] = []  # heredocs waiting for their body (after the next newline)

    def run(self) -> list[tuple]:
        s = self.s
        while self.i < len(s):
            c = s[self.i]
            if c not in _SPECIAL_START:
                self.tokens.append(("word", self._word()))
            elif c in " \t\r":
                self.i = _BLANKS.match(s, self.i).end()  # type: ignore[union-attr]
            elif c == "\\" and s.startswith("\\\n", self.i):
                self.i += 2
            elif c == "#" and self._at_word_start():
                end = s.find("\n", self.i)
                self.i = len(s) if end < 0 else end
            elif c == "\n":
                self.tokens.append(("op", "\n"))
                self.i += 1
                self._heredoc_bodies()
            elif c in "<>" and s.startswith("(", self.i + 1):
                self.tokens.append(("word", self._word()))
            elif self._redir_here():
                continue
            elif c in ";&|()":
                op = next(o for o in _OPS if s.startswith(o, self.i))
                self.tokens.append(("op", op))
                self.i += len(op)
            else:
                self.tokens.append(("word", self._word()))
        if self.pending:
            raise Unparsed("a heredoc without its body")
        return self.tokens

    def _at_word_start(self) -> bool:
        return self.i == 0 or self.s[self.i - 1] in " \t\n;&|()<>"

    def _redir_here(self) -> bool:
        s, j = self.s, self.i
        if s[j] not in "<>&0123456789":
            return False
        while j < len(s) and s[j].isdigit():
            j += 1
        if j > self.i and not self._at_word_start():
            return False
        op = next((o for o in _REDIRS if s.startswith(o, j)), None)
        if op is None:
            return False
        if op in ("<&", ">&") and s.startswith("-", j + 2):  # close a descriptor
            self.tokens.append(("redir", s[self.i : j + 3], None))
            self.i = j + 3
            return True
        fd = s[self.i : j]
        self.i = j + len(op)
        while self.i < len(s) and s[self.i] in " \t":
            self.i += 1
        if self.i >= len(s) or s[self.i] in "\n;&|()<>":
            raise Unparsed(f"redirection {op} without a target")
        target = self._word()
        if op in ("<<", "<<-"):
            entry = ["heredoc", op, target, None]
            self.pending.append(entry)
            self.tokens.append(entry)  # type: ignore[arg-type]  # its body comes after a newline
        else:
            self.tokens.append(("redir", fd + op, target))
        return True

    def _heredoc_bodies(self) -> None:
        s = self.s
        while self.pending:
            entry = self.pending.pop(0)
            delimiter: Word = entry[2]
            lines = []
            while True:
                if self.i >= len(s):
                    raise Unparsed(f"heredoc {delimiter.value!r} is not closed")
                end = s.find("\n", self.i)
                end = len(s) if end < 0 else end
                line = s[self.i : end]
                self.i = min(end + 1, len(s))
                if (line.lstrip("\t") if entry[1] == "<<-" else line) == delimiter.value:
                    break
                lines.append(line)
            body = "\n".join(lines)
            entry[3] = body
            if not delimiter.quoted:  # the body is expanded: what runs in it runs
                self._expansions_in(body)

    def _expansions_in(self, text: str) -> None:
        """Commands run by `$(...)` and backticks inside a heredoc body that is expanded."""
        i = 0
        while i < len(text):
            if text[i] == "\\":
                i += 2
            elif text.startswith("$(", i) and not text.startswith("$((", i):
                end = _matching_paren(text, i + 2)
                self._nest(text[i + 2 : end])
                i = end + 1
            elif text[i] == "`":
                end = text.find("`", i + 1)
                if end < 0:
                    raise Unparsed("an unclosed backtick in a heredoc")
                self._nest(text[i + 1 : end])
                i = end + 1
            else:
                i += 1

    def _nest(self, inner: str) -> None:
        if self.depth > 20:
            raise Unparsed("substitutions nested too deep")
        self.nested.extend(parse(inner, self.depth + 1, self.budget).commands)

    def _word(self) -> Word:
        s = self.s
        out: list[str] = []
        plain = literal = True
        quoted = False
        bare = -1
        while self.i < len(s):
            run = _RUN.match(s, self.i)
            if run:
                out.append(run.group())
                self.i = run.end()
                continue
            c = s[self.i]
            if bare < 0 and c in "\\'\"$`":
                bare = len("".join(out))
            if c in " \t\r\n;&|<>" and not (c in "<>" and s.startswith("(", self.i + 1)):
                break
            if c in "()":
                break
            if c == "\\":
                if self.i + 1 < len(s) and s[self.i + 1] != "\n":
                    out.append(s[self.i + 1])
                quoted = True
                self.i += 2
            elif c == "'":
                end = s.find("'", self.i + 1)
                if end < 0:
                    raise Unparsed("an unclosed single quote")
                out.append(s[self.i + 1 : end])
                quoted = True
                self.i = end + 1
            elif c == '"':
                quoted = True
                self.i += 1
                while True:
                    if self.i >= len(s):
                        raise Unparsed("an unclosed double quote")
                    d = s[self.i]
                    if d == '"':
                        self.i += 1
                        break
                    if d == "\\" and self.i + 1 < len(s) and s[self.i + 1] in '$`"\\\n':
                        out.append(s[self.i + 1])
                        self.i += 2
                    elif d in "$`":
                        p, lit = self._dollar_or_backtick(out)
                        plain, literal = plain and p, literal and lit
                    else:
                        out.append(d)
                        self.i += 1
            elif c in "$`":
                p, lit = self._dollar_or_backtick(out)
                plain, literal = plain and p, literal and lit
            elif c in "<>" and s.startswith("(", self.i + 1):  # process substitution
                end = _matching_paren(s, self.i + 2)
                self._nest(s[self.i + 2 : end])
                out.append(s[self.i : end + 1])
                plain = literal = False
                self.i = end + 1
            else:
                if c in "*?[~{}":
                    literal = False  # a glob, ~ or a brace expansion: the program gets another word
                out.append(c)
                self.i += 1
        value = "".join(out)
        if value in ("{", "}") and not quoted:
            literal = True  # the reserved words themselves
        return Word(value, plain, literal, quoted, len(value) if bare < 0 else bare)

    def _dollar_or_backtick(self, out: list[str]) -> tuple[bool, bool]:
        """Consume one expansion at self.i; answers (plain, literal) for it."""
        s, i = self.s, self.i
        if s[i] == "`":
            j = i + 1
            while j < len(s) and s[j] != "`":
                j += 2 if s[j] == "\\" else 1
            if j >= len(s):
                raise Unparsed("an unclosed backtick")
            self._nest(s[i + 1 : j].replace("\\`", "`"))
            out.append(s[i : j + 1])
            self.i = j + 1
            return False, False
        if s.startswith("$((", i):
            end = _matching_paren(s, i + 2)  # the inner ( ... ); then the outer )
            if not s.startswith(")", end + 1):
                raise Unparsed("an unclosed arithmetic expansion")
            out.append(s[i : end + 2])
            self.i = end + 2
            return False, False  # an array subscript in it can run a command
        if s.startswith("$(", i):
            end = _matching_paren(s, i + 2)
            self._nest(s[i + 2 : end])
            out.append(s[i : end + 1])
            self.i = end + 1
            return False, False
        m = _VAR.match(s, i)
        if m:
            out.append(m.group())
            self.i = m.end()
            return True, False
        if s.startswith("${", i):
            end = s.find("}", i)
            if end < 0:
                raise Unparsed("an unclosed ${")
            inner = s[i + 2 : end]
            if "$(" in inner or "`" in inner:
                self._expansions_in(inner)
            out.append(s[i : end + 1])
            self.i = end + 1
            return False, False  # ${x:-...}, ${x:=...}, ${!x}: not just a name
        if s.startswith("$'", i):  # ANSI-C quoting: a literal, but not ours to decode
            end = i + 2
            while end < len(s) and s[end] != "'":
                end += 2 if s[end] == "\\" else 1
            if end >= len(s):
                raise Unparsed("an unclosed $'")
            out.append(s[i : end + 1])
            self.i = end + 1
            return False, False
        out.append("$")  # a lone $ is itself
        self.i = i + 1
        return True, True


def _matching_paren(s: str, start: int) -> int:
    """The index of the `)` that closes a `(` just before `start`, skipping quotes."""
    depth, i = 1, start
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "'":
            end = s.find("'", i + 1)
            if end < 0:
                raise Unparsed("an unclosed single quote")
            i = end + 1
            continue
        if c == '"':
            i += 1
            while i < len(s) and s[i] != '"':
                i += 2 if s[i] == "\\" else 1
            i += 1
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise Unparsed("an unclosed (")


def parse(text: str, depth: int = 0, budget: list[int] | None = None) -> Line:
    """The simple commands `text` runs, and the plain one it is (if it is exactly one). Unparsed
    for what this lexer does not understand, and for a line past MAX_LENGTH or MAX_NESTED (the
    hook must answer within the harness's timeout whatever the model wrote)."""
    if len(text) > MAX_LENGTH:
        raise Unparsed(f"a line of {len(text)} characters (more than {MAX_LENGTH})")
    budget = [0] if budget is None else budget
    budget[0] += 1
    if budget[0] > MAX_NESTED:
        raise Unparsed(f"more than {MAX_NESTED} nested scripts in one line")
    lexer = _Lexer(text, depth, budget)
    tokens = lexer.run()
    commands: list[Simple] = []
    current: Simple | None = None
    skip_until_separator = False
    top: list[Simple] = []  # the commands at the top level, in order, with what joins them
    joins: list[str] = []
    for token in tokens:
        kind = token[0]
        if kind == "op":
            if current is not None:
                top.append(current)
                commands.append(current)
                current = None
            joins.append(token[1])
            skip_until_separator = skip_until_separator and token[1] not in (";", "\n", "&")
            continue
        if skip_until_separator:
            continue
        if kind == "word":
            word: Word = token[1]
            if current is None or not current.words:
                if word.literal and word.value in _RESERVED and current is None:
                    joins.append(word.value)
                    continue
                if word.literal and word.value in ("for", "select") and current is None:
                    skip_until_separator = True  # `for x in a b c;`: no command until `;`/newline
                    joins.append(word.value)
                    continue
                if word.literal and word.value in ("case", "[[", "esac"):
                    raise Unparsed(f"`{word.value}` is not understood here")
                if current is None:
                    current = Simple()
                if _is_assignment(word.value) and word.value.find("=") < word.bare:
                    current.assigns.append(word)
                    continue
            assert current is not None
            current.words.append(word)
        else:  # redir or heredoc
            if current is None:
                current = Simple()
            current.redirs.append((token[1], token[2]))
            if kind == "heredoc":
                current.redirs[-1] = ("<<body", Word(token[3] or "", False, False, True))
    if current is not None:
        top.append(current)
        commands.append(current)
    found: list[Simple] = []
    for command in commands:
        found.append(command)
        found.extend(_unwrap(command, depth, budget))
    found.extend(lexer.nested)
    return Line(found, _plain_line(top, joins, tokens, lexer.nested))


def _is_assignment(value: str) -> bool:
    name, eq, _ = value.partition("=")
    return bool(eq) and _NAME.fullmatch(name.rstrip("+")) is not None


# Wrappers: the words that run another command, and the options of theirs that take a value.
_WRAPPER_VALUES: dict[str, frozenset[str]] = {
    "timeout": frozenset(("-s", "--signal", "-k", "--kill-after")),
    "nice": frozenset(("-n", "--adjustment")),
    "ionice": frozenset(("-c", "--class", "-n", "--classdata")),
    "env": frozenset(("-u", "--unset", "-C", "--chdir")),
    "command": frozenset(),
    "exec": frozenset(("-a",)),
    "nohup": frozenset(),
    "stdbuf": frozenset(("-i", "-o", "-e")),
    "time": frozenset(("-f", "--format", "-o", "--output")),
    "npx": frozenset(("-p", "--package", "-c", "--call")),
    "sudo": frozenset(("-u", "--user", "-g", "--group", "-C", "-D", "-h", "-p", "-r", "-t")),
}
_RUNNERS: dict[str, frozenset[str]] = {  # `<tool> run ...`
    "uv": frozenset(
        "--with --with-editable --with-requirements --python -p --directory --project "
        "--package --extra --group --env-file --index --default-index --only-group "
        "--no-group --config-file --cache-dir".split()
    ),
    "poetry": frozenset(("-C", "--directory", "-P", "--project")),
    "pdm": frozenset(("-p", "--project")),
    "hatch": frozenset(("-e", "--env")),
    "pnpm": frozenset(("-C", "--dir", "--filter", "-F")),
}


def _without_options(rest: list[str], takes: frozenset[str]) -> list[str]:
    """A wrapper's words after its options (those in `takes` with their value) and a `--`."""
    rest = list(rest)
    while rest and rest[0].startswith("-") and rest[0] != "--":
        flag = rest.pop(0)
        if flag in takes and rest:
            rest.pop(0)
    if rest and rest[0] == "--":
        rest.pop(0)
    return rest


def _unwrap(command: Simple, depth: int, budget: list[int]) -> list[Simple]:
    """Sets command.argv (the words with wrappers taken off); answers the commands a
    `bash -c '<literal>'` in it runs (parsed), or a shell's heredoc script."""
    argv = [w.value for w in command.words]
    while argv:
        head = argv[0].rsplit("/", 1)[-1]
        if head in _WRAPPER_VALUES:
            if head == "command" and len(argv) > 1 and argv[1] in ("-v", "-V"):
                argv = []
                break
            if head == "sudo":
                command.wrapped_by_sudo = True
            rest = _without_options(argv[1:], _WRAPPER_VALUES[head])
            if head == "env" and any(f.startswith(("-S", "--split-string")) for f in argv[1:]):
                argv = []  # env -S splits a string of its own: not ours to read
                break
            if head == "env":
                while rest and _is_assignment(rest[0]):
                    command.env_assigns.append(rest.pop(0))
            if head == "timeout" and rest:
                rest.pop(0)  # the duration
            argv = rest
        elif head in _RUNNERS and len(argv) > 1 and argv[1] in ("run", "exec"):
            rest = _without_options(argv[2:], _RUNNERS[head])
            argv = rest
        else:
            break
    command.argv = argv
    if argv and argv[0].rsplit("/", 1)[-1] in _SHELLS:
        script = _shell_script(argv)
        if script is not None:
            return parse(script, depth + 1, budget).commands if depth < 20 else []
        bodies = [w.value for op, w in command.redirs if op == "<<body" and w is not None]
        if len(argv) == 1 and bodies:
            return parse(bodies[0], depth + 1, budget).commands if depth < 20 else []
    return []


def _shell_script(argv: list[str]) -> str | None:
    """The script of `bash -c SCRIPT` (also `-lc`, `-ec`, `-x -c`), else None."""
    for at, word in enumerate(argv[1:], 1):
        if not word.startswith("-") or word == "--":
            return None
        if not word.startswith("--") and "c" in word[1:]:
            return argv[at + 1] if at + 1 < len(argv) else None
    return None


def _safe_redir(op: str, target: Word | None) -> bool:
    if target is None:  # n<&- / n>&-: close
        return True
    if op.endswith(("<<body", "<<<")):
        return False
    value = target.value
    if not target.literal:
        return False
    if op.endswith("&"):  # n>&m, n<&m: between descriptors
        return value in ("0", "1", "2", "-") or value == "/dev/null"
    return value == "/dev/null"


def _plain_line(top: list[Simple], joins: list[str], tokens: list, nested: list) -> Simple | None:
    """The one plain simple command the line is: `[cd W &&] [A=v...] cmd args [safe redirs]
    [| head|tail|wc options]`, every word plain, the command word literal. Else None."""
    if nested:
        return None
    if any(t[0] == "heredoc" for t in tokens):
        return None
    ops = [j for j in joins]
    commands = list(top)
    # an optional leading `cd <plain word> &&`
    if len(commands) >= 2 and ops[:1] == ["&&"]:
        first = commands[0]
        if (
            [w.value for w in first.words[:1]] == ["cd"]
            and first.words[0].literal
            and len(first.words) == 2
            and first.words[1].plain
            and not first.assigns
            and not first.redirs
        ):
            commands, ops = commands[1:], ops[1:]
    # an optional trailing `| head|tail|wc <options>`
    if len(commands) == 2 and ops == ["|"]:
        last = commands[1]
        if (
            last.words
            and last.words[0].literal
            and last.words[0].value in _PIPE_FILTERS
            and not last.assigns
            and not last.redirs
            and all(
                w.literal and (w.value.startswith("-") or w.value.isdigit()) for w in last.words[1:]
            )
        ):
            commands, ops = commands[:1], []
    if len(commands) != 1 or ops:
        return None
    command = commands[0]
    if not command.words or not command.words[0].literal or command.wrapped_by_sudo:
        return None
    if "/" in command.argv[0] if command.argv else True:
        return None  # `./pytest`, `/tmp/x/make`: a program of anyone's making, not the named one
    if not all(w.plain for w in command.words):
        return None
    for word in command.assigns:
        name = word.value.split("=", 1)[0].rstrip("+")
        if not word.plain or not _SAFE_ASSIGN.fullmatch(name):
            return None
    if any(not _SAFE_ASSIGN.fullmatch(a.split("=", 1)[0]) for a in command.env_assigns):
        return None
    if not all(_safe_redir(op, target) for op, target in command.redirs):
        return None
    if command.argv and command.argv[0].rsplit("/", 1)[-1] in _SHELLS:
        script = _shell_script(command.argv)
        inner_word = next((w for w in command.words if w.value == script), None)
        if script is None or inner_word is None or not inner_word.literal:
            return None  # a shell reading stdin, a file or a script with variables in it
        try:
            inner = parse(script, 1, [0])
        except Unparsed:
            return None
        return inner.plain
    return command
