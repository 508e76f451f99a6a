"""The shell commands the documentation gives: every fenced shell block of README.md, DEVELOPERS.md and docs/*.md,
and the usage lines in the comments at the top of the launch scripts (launch/*).

A block counts as shell when its fence says bash / sh / shell, or when it has no language and a line of it starts
with a command this project documents (python, bash, sbatch, pip, launch/...). A command is one logical line
(backslash continuations joined) split at ``&&``, ``||``, ``;`` and ``|``; comments, redirections and optional
parts written ``[--flag value]`` are resolved as a reader would: an optional part without ``...`` in it is taken,
one with ``...`` (a placeholder for more flags) is dropped. ``NAME=value`` lines and ``export`` set variables for the
rest of their page (``$R`` in the README's translation block); leading ``NAME=value`` words are the command's
environment.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re
import shlex

SHELL_LANGUAGES = ("bash", "sh", "shell", "console")
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
_PROGRAM = re.compile(r"^\s*(?:[A-Z_]+=\S*\s+)*(?:python3?|bash|sbatch|pip|nice|sacrebleu|launch/)")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_OPTIONAL = re.compile(r"(?<!\S)\[([^\[\]]*)\]")  # a [...] word, not .[extras]
_SEPARATORS = ("&&", "||", ";", "|", "&")
_REDIRECTIONS = (">", ">>", "<", "2>", "2>&1", ">&")


@dataclasses.dataclass(frozen=True)
class Command:
  """One documented command: where it is (``source``: file and line), its words after the shell's parsing
  (``argv``) and the ``NAME=value`` words before them (``env``)."""
  source: str
  argv: tuple[str, ...]
  env: tuple[tuple[str, str], ...] = ()

  @property
  def text(self) -> str:
    """The command as one line (env words first): what the skip list and the failure messages name."""
    return " ".join([f"{name}={value}" for name, value in self.env] + [shlex.quote(a) for a in self.argv])


def _logical_lines(block: str, first_line: int):
  """(line number, text) of each logical line: continuations joined, optional parts resolved."""
  lines = block.split("\n")
  index = 0
  while index < len(lines):
    start, text = index, lines[index]
    while text.rstrip().endswith("\\") and index + 1 < len(lines):
      index += 1
      text = text.rstrip()[:-1] + " " + lines[index].strip()
    index += 1
    text = _OPTIONAL.sub(lambda m: "" if "..." in m.group(1) or not m.group(1).startswith("-") else m.group(1), text)
    yield first_line + start, text


def _words(text: str) -> list[str]:
  """Shell words of ``text`` with comments removed and operators (``&&``, ``|``, ``>``) as words of their own."""
  lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
  lexer.whitespace_split = True
  return list(lexer)


def _simple_commands(words: list[str]):
  """Splits words at command separators and drops redirections with their targets."""
  command: list[str] = []
  skip_next = False
  for word in words:
    if skip_next:
      skip_next = False
    elif word in _SEPARATORS:
      if command:
        yield command
      command = []
    elif word in _REDIRECTIONS or re.fullmatch(r"\d?>+&?\d?", word):
      skip_next = not word.endswith("&1")
    else:
      command.append(word)
  if command:
    yield command


def _expand(text: str, variables: dict[str, str]) -> str:
  """``$NAME`` / ``${NAME}`` of the block's own variables replaced by their values (others are kept)."""
  return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?",
                lambda m: variables.get(m.group(1), m.group(0)), text)


def commands_in_block(block: str, source: str, first_line: int, variables: dict[str, str] | None = None) -> list[Command]:
  """The commands of one shell block (``first_line``: the line number of its first line in ``source``); the
  variables it sets are added to ``variables`` (a page's blocks share them, as one shell session would)."""
  variables = {} if variables is None else variables
  found = []
  for number, text in _logical_lines(block, first_line):
    for words in _simple_commands(_words(_expand(text, variables))):
      env = []
      while words and _ASSIGNMENT.match(words[0]):
        name, value = words.pop(0).split("=", 1)
        env.append((name, value))
      if not words:  # NAME=value alone: a variable of the block
        variables.update(env)
      elif words[0] == "export":
        variables.update(word.split("=", 1) for word in words[1:] if "=" in word)
      else:
        found.append(Command(f"{source}:{number}", tuple(words), tuple(env)))
  return found


def markdown_commands(path: pathlib.Path, repo: pathlib.Path) -> list[Command]:
  """The commands of every shell block of one Markdown file."""
  text = path.read_text(encoding="utf-8")
  found, variables = [], {}
  for match in _FENCE.finditer(text):
    language, block = match.group(1), match.group(2)
    if language not in SHELL_LANGUAGES and not (language == "" and any(map(_PROGRAM.match, block.split("\n")))):
      continue
    first_line = text.count("\n", 0, match.start(2)) + 1
    found += commands_in_block(block, str(path.relative_to(repo)), first_line, variables)
  return found


def launch_usage_commands(path: pathlib.Path, repo: pathlib.Path) -> list[Command]:
  """The usage lines in a launch script's leading comment: comment lines indented past ``#`` that run a script."""
  lines = path.read_text(encoding="utf-8").split("\n")
  block, first = [], None
  for number, line in enumerate(lines, 1):
    if not line.startswith("#"):
      if number > 1:
        break
      continue
    body = line[1:]
    usage = body.startswith("   ") and ("launch/" in body or block and block[-1].rstrip().endswith("\\"))
    if usage:
      first = first or number
      block.append(body.strip())
  return commands_in_block("\n".join(block), str(path.relative_to(repo)), first or 1) if block else []


def documented_commands(repo: pathlib.Path) -> list[Command]:
  """Every documented command, in file order."""
  pages = [repo / "README.md", repo / "DEVELOPERS.md", *sorted((repo / "docs").glob("*.md"))]
  found = [command for page in pages for command in markdown_commands(page, repo)]
  for script in sorted((repo / "launch").iterdir()):
    found += launch_usage_commands(script, repo)
  return found
