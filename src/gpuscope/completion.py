"""``gpuscope completion bash|zsh``: shell completion written from the argparse tree itself.

The script holds, for every command path (``gpuscope``, ``gpuscope alerts``, ``gpuscope alerts
list``, ...), the subcommands and options it accepts, so it follows the parser with no second list
to keep; bash and zsh each get a small native function over that table.
"""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator

SHELLS = ("bash", "zsh")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subparsers here and nowhere public
        choices = action.choices
        if action.nargs == argparse.PARSER and isinstance(choices, dict):
            return dict(choices)
    return {}


def walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every subcommand's parser below it, depth first."""
    yield parser
    for sub in _subparsers(parser).values():
        yield from walk(sub)


def command_words(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, list[str]]]:
    """(command path joined by ``_``, the words that may follow it) for every command, depth first."""
    subs = _subparsers(parser)
    options = sorted(opt for action in parser._actions for opt in action.option_strings)
    yield path, [*sorted(subs), *options]
    for name, sub in subs.items():
        yield from command_words(sub, f"{path}_{name}" if path else name)


def _table(parser: argparse.ArgumentParser) -> str:
    """``_gpuscope_words PATH``: sets ``cands`` to the words that may follow a command path."""
    cases = "\n".join(
        f"        {shlex.quote(path or '_')}) cands={shlex.quote(' '.join(words))} ;;"
        for path, words in command_words(parser)
    )
    return f"""_gpuscope_words() {{
    case "$1" in
{cases}
        *) cands="" ;;
    esac
}}
"""


# the command path is the words so far that name subcommands; options and their values are skipped
_BASH = """_gpuscope_complete() {
    local cur cmdpath word cands i
    cur="${COMP_WORDS[COMP_CWORD]}"
    cmdpath=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${COMP_WORDS[i]}"
        [[ "$word" == -* ]] && continue
        _gpuscope_words "${cmdpath:-_}"
        [[ " $cands " == *" $word "* ]] && cmdpath="${cmdpath:+${cmdpath}_}$word"
    done
    _gpuscope_words "${cmdpath:-_}"
    COMPREPLY=($(compgen -W "$cands" -- "$cur"))
}

complete -o default -F _gpuscope_complete gpuscope
"""

_ZSH = """_gpuscope() {
    local cmdpath word cands i
    cmdpath=""
    for ((i = 2; i < CURRENT; i++)); do
        word="${words[i]}"
        [[ "$word" == -* ]] && continue
        _gpuscope_words "${cmdpath:-_}"
        [[ " $cands " == *" $word "* ]] && cmdpath="${cmdpath:+${cmdpath}_}$word"
    done
    _gpuscope_words "${cmdpath:-_}"
    compadd -- ${=cands}
}

compdef _gpuscope gpuscope
"""


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell`` (bash or zsh)."""
    if shell not in SHELLS:
        raise ValueError(f"shell must be one of {', '.join(SHELLS)}, got {shell!r}")
    header = f'# gpuscope completion for {shell}: eval "$(gpuscope completion {shell})" in your shell rc\n'
    if shell == "zsh":
        return "#compdef gpuscope\n" + header + _table(parser) + "\n" + _ZSH
    return header + _table(parser) + "\n" + _BASH
