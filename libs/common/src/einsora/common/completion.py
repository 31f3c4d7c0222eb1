"""`einsora completion bash|zsh`: shell completion, generated from the `einsora` parser itself.

The script is made by walking the parser's subcommands, options and choices, so it completes
exactly what this install's parser accepts: `einsora la<TAB>` gives `launch`, `einsora launch
--<TAB>` its options, `einsora solo --log-format <TAB>` the formats. Nothing is asked of the
parser at completion time (no Python runs on each TAB), and no completion library is needed.

zsh runs the same function through its `bashcompinit` layer, which zsh ships.
"""

from __future__ import annotations

import argparse
import re
import sys

SHELLS = ("bash", "zsh")

# Words that go into the script verbatim, inside single quotes and `case` patterns; choices
# that are anything else (a space, a quote) are left out rather than escaped.
_SAFE = re.compile(r"^[A-Za-z0-9_.,:/@+%-]+$")


class Node:
    """What may follow one command path (`""`, `"agent"`, `"agent join"`).

    A plain class, not a dataclass: `dataclasses` imports `inspect`, a cost every
    `einsora --help` would pay for a command it rarely runs.
    """

    def __init__(self) -> None:
        self.subcommands: list[str] = []
        self.options: list[str] = []
        self.takes_value: list[str] = []
        """Options whose next word is their value, not a subcommand."""
        self.choices: dict[str, list[str]] = {}
        """The values an option takes, when it names them."""
        self.positional: list[str] = []
        """The choices of positional arguments (`launch notebook`)."""


def walk(parser: argparse.ArgumentParser, path: str = "") -> dict[str, Node]:
    """Every command path of `parser` and what may follow it."""
    nodes: dict[str, Node] = {}
    node = nodes[path] = Node()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                node.subcommands.append(name)
                nodes.update(walk(sub, f"{path} {name}".strip()))
        elif action.option_strings:
            if action.help == argparse.SUPPRESS:
                continue
            node.options.extend(action.option_strings)
            if action.nargs != 0:
                node.takes_value.extend(action.option_strings)
                if action.choices is not None:
                    for option in action.option_strings:
                        node.choices[option] = [str(c) for c in action.choices]
        elif action.choices is not None:
            node.positional.extend(str(c) for c in action.choices)
    return nodes


def bash_script(parser: argparse.ArgumentParser) -> str:
    """A script that, sourced in bash, completes `einsora`'s subcommands, options and choices."""
    prog = parser.prog
    fn = "_" + re.sub(r"\W", "_", prog)
    nodes = walk(parser)
    node_cases = []
    choice_cases = []
    for path, node in nodes.items():
        node_cases.append(
            f"        {_quote(path)}) subs={_words(node.subcommands)}; "
            f"opts={_words(node.options)}; vals={_words(node.takes_value)}; "
            f"pos={_words(node.positional)} ;;"
        )
        for option, values in node.choices.items():
            choice_cases.append(f"        {_quote(f'{path}|{option}')}) vals={_words(values)} ;;")
    return "\n".join(
        [
            f"# {prog} completion for bash, generated from its parser by `{prog} completion bash`.",
            f"# Load it with: source <({prog} completion bash)",
            "",
            f"{fn}_node() {{",
            "    # What may follow the command path $1: subcommands, options, the options that",
            "    # take a value, positional choices.",
            "    subs=''; opts=''; vals=''; pos=''",
            '    case "$1" in',
            *node_cases,
            "    esac",
            "}",
            "",
            f"{fn}_choices() {{",
            "    # The values of option $2 at command path $1, when the parser names them.",
            "    vals=''",
            '    case "$1|$2" in',
            *choice_cases,
            "    esac",
            "}",
            "",
            f"{fn}() {{",
            # Names chosen not to clash with zsh's specials (path, words) under bashcompinit.
            "    local cur word i skip lastopt cmdpath subs opts vals pos",
            "    COMPREPLY=()",
            '    cur="${COMP_WORDS[COMP_CWORD]}"',
            "    cmdpath=''",
            "    skip=0",
            "    lastopt=''",
            "    for ((i = 1; i < COMP_CWORD; i++)); do",
            '        word="${COMP_WORDS[i]}"',
            # `--opt=value` arrives as three words, `--opt`, `=`, `value`.
            '        [[ "$word" == "=" ]] && continue',
            "        if ((skip)); then skip=0; continue; fi",
            f'        {fn}_node "$cmdpath"',
            '        case "$word" in',
            "            -*)",
            '                if [[ " $vals " == *" $word "* ]]; then',
            '                    skip=1; lastopt="$word"',
            "                fi ;;",
            "            *)",
            '                if [[ " $subs " == *" $word "* ]]; then',
            '                    cmdpath="${cmdpath:+$cmdpath }$word"',
            "                fi ;;",
            "        esac",
            "    done",
            '    [[ "$cur" == "=" ]] && cur=""',
            "    if ((skip)); then",
            f'        {fn}_choices "$cmdpath" "$lastopt"',
            '        COMPREPLY=($(compgen -W "$vals" -- "$cur"))',
            "        return 0",
            "    fi",
            f'    {fn}_node "$cmdpath"',
            '    if [[ "$cur" == -* ]]; then',
            '        COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
            "    else",
            '        COMPREPLY=($(compgen -W "$subs $pos" -- "$cur"))',
            "    fi",
            "    return 0",
            "}",
            "",
            # An option's free value (a path, a URL) falls back to the shell's own completion.
            f"complete -o bashdefault -o default -F {fn} {prog}",
            "",
        ]
    )


def zsh_script(parser: argparse.ArgumentParser) -> str:
    """The bash script, run by zsh's `bashcompinit`."""
    prog = parser.prog
    return "\n".join(
        [
            f"#compdef {prog}",
            f"# {prog} completion for zsh, generated from its parser by `{prog} completion zsh`.",
            f"# Load it with: source <({prog} completion zsh)",
            "autoload -U +X compinit && { (( $+functions[compdef] )) || compinit; }",
            "autoload -U +X bashcompinit && bashcompinit",
            "",
            bash_script(parser),
        ]
    )


def register(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    root: argparse.ArgumentParser,
) -> None:
    """`einsora completion SHELL`, which prints the script for `root` as it is when run."""
    parser = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print a script that completes einsora's commands and options. Load it "
        "with `source <(einsora completion bash)` (or zsh), or save it where your shell "
        "loads completions from.",
    )
    parser.add_argument("shell", choices=SHELLS)

    def run(args: argparse.Namespace) -> int:
        script = bash_script(root) if args.shell == "bash" else zsh_script(root)
        sys.stdout.write(script)
        return 0

    parser.set_defaults(func=run)


def _words(words: list[str]) -> str:
    return "'" + " ".join(w for w in words if _SAFE.match(w)) + "'"


def _quote(pattern: str) -> str:
    # A case pattern in single quotes matches literally; every word in it passed _SAFE or is a
    # command name, which argparse took from our own code.
    return "'" + pattern.replace("'", "") + "'"
