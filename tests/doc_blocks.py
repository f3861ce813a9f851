"""Fenced code blocks of the Markdown docs, and the shell commands in them.

Used by test_docs.py. A block is what lies between a line "```lang" and a line "```".
The line right above the opening fence may hold one HTML comment that says what the
test does with the block:

- `<!-- not run: <reason> -->`: the block is not run; the reason says why, in words.
- `<!-- file: <path> -->`: the block is the text of a file that later blocks read; the
  test writes it to `<path>` in the page's working directory.

Without a comment, ```python blocks are executed and ```bash / ```sh / ```console
blocks have their commands run; ```text blocks are pictures, trees or program output,
with nothing to run. Any other block needs one of the two comments.
"""

import dataclasses
import os
import re
import shlex

PYTHON = ("python",)
SHELL = ("bash", "sh", "shell", "console")
PROSE = ("text",)

_FENCE = re.compile(r"^```([\w-]*)\s*$")
_MARK = re.compile(r"^<!--\s*(not run|file):\s*(.*?)\s*-->$")
# Environment settings a run block may make: the docs run in one TensorFlow process.
_ALLOWED_ENV = {"KERAS_BACKEND": "tensorflow"}


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block: its page, the line of its opening fence, language and text."""

    page: str
    line: int
    lang: str
    text: str
    mark: str = ""  # "", "not run" or "file"
    mark_value: str = ""  # the reason, or the file's path

    @property
    def where(self):
        return f"{self.page}:{self.line}"


def extract_blocks(path, page=None):
    """The fenced blocks of the Markdown file `path`, in order."""
    page = page or os.fspath(path)
    with open(path, encoding="utf-8") as file:
        lines = file.read().splitlines()
    blocks = []
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{page}:{index + 1}: a fenced block is never closed")
        mark = _MARK.match(lines[index - 1].strip()) if index else None
        blocks.append(
            Block(
                page=page,
                line=index + 1,
                lang=match.group(1),
                text="\n".join(lines[index + 1 : end]) + "\n",
                mark=mark.group(1) if mark else "",
                mark_value=mark.group(2) if mark else "",
            )
        )
        index = end + 1
    return blocks


def block_problem(block):
    """Why `block` neither runs nor says why not, or None when it is fine."""
    if block.mark == "not run":
        if len(block.mark_value.split()) < 3:
            return f"{block.where}: 'not run' needs a reason in words. Received: {block.mark_value!r}"
        return None
    if block.mark == "file":
        if not block.mark_value or os.path.isabs(block.mark_value) or ".." in block.mark_value.split("/"):
            return f"{block.where}: 'file' needs a relative path. Received: {block.mark_value!r}"
        return None
    if block.lang in PYTHON + PROSE:
        return None
    if block.lang in SHELL:
        try:
            shell_commands(block.text, console=block.lang == "console")
        except ValueError as error:
            return f"{block.where}: {error} (mark the block `<!-- not run: why -->` if it cannot run)"
        return None
    return (
        f"{block.where}: a ```{block.lang or '(no language)'} block that is not run must say why "
        "with `<!-- not run: reason -->` above it (or be a `<!-- file: path -->`)"
    )


@dataclasses.dataclass(frozen=True)
class Command:
    """A `kt-*` (or `python -m training.*`) command line, as the test runs it in-process."""

    text: str
    command: str  # the module name in keras_transformer.cli: "train", "average_checkpoints"
    argv: tuple
    stdin: str = ""  # a file to read standard input from
    stdout: str = ""  # a file to write standard output to


def shell_commands(text, console=False):
    """The `Command`s of a shell block: one per line (backslash continues a line).

    `#` starts a comment. In a console block only lines starting with "$ " are
    commands. Raises `ValueError` for anything the test cannot run in-process: other
    programs, pipes, or environment settings other than KERAS_BACKEND=tensorflow.
    """
    lines, pending = [], ""
    for line in text.splitlines():
        if console and not pending:
            if not line.startswith("$ "):
                continue  # program output
            line = line[2:]
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.strip() and not line.strip().startswith("#"):
            lines.append(line.strip())
    return [_command(line) for line in lines]


def _command(line):
    tokens = shlex.split(line, comments=True)
    while tokens and re.match(r"^[A-Za-z_]\w*=", tokens[0]):
        key, value = tokens.pop(0).split("=", 1)
        if _ALLOWED_ENV.get(key) != value:
            raise ValueError(f"`{line}` sets {key}={value}, which the docs test cannot do in its process")
    stdin = stdout = ""
    words = []
    tokens = iter(tokens)
    for token in tokens:
        if token == "<":
            stdin = next(tokens)
        elif token == ">":
            stdout = next(tokens)
        elif token in ("|", "||", "&&", ";", "&", ">>", "2>", "2>&1"):
            raise ValueError(f"`{line}` uses {token!r}, which the docs test does not run")
        else:
            words.append(token)
    if not words:
        raise ValueError(f"`{line}` runs nothing")
    program = os.path.basename(words[0])
    if program.startswith("kt-"):
        command, argv = program[3:].replace("-", "_"), words[1:]
    elif program in ("python", "python3") and words[1:2] == ["-m"] and words[2].startswith("training."):
        command, argv = words[2].split(".", 1)[1], words[3:]
    else:
        raise ValueError(f"`{line}` runs {words[0]!r}, not a kt-* command")
    return Command(text=line, command=command, argv=tuple(argv), stdin=stdin, stdout=stdout)


def tree_paths(text):
    """The paths named by a text tree (two spaces of indent per level; names end in / or .py)."""
    paths, stack = [], []
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        name = stripped.split(" ", 1)[0] if stripped else ""
        if not (name.endswith("/") or name.endswith(".py")):
            continue
        depth = (len(line) - len(stripped)) // 2
        stack = stack[:depth] + [name.rstrip("/")]
        paths.append("/".join(stack) + ("/" if name.endswith("/") else ""))
    return paths


def relative_links(path):
    """The local link targets of a Markdown file: `[text](target)`, no URLs or anchors."""
    with open(path, encoding="utf-8") as file:
        text = file.read()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t.split("#", 1)[0] for t in targets if "://" not in t and not t.startswith("#")]
