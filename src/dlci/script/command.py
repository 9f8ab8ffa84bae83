"""The command after ``--``: which interpreter runs what, with which arguments (no torch)."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from dlci.errors import DlciError

TARGET_DOC = (
    "write a Target for it (docs/target.md): a function that returns the model, an optimizer "
    "factory, a loader and, where the step is its own, a train_step"
)
USAGE = "dlci memorize -- python train.py --its --own --args (or -- python -m package.module)"
LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch", "deepspeed")
# options of the interpreter that take a value (python -W ignore train.py)
VALUED_FLAGS = ("-W", "-X", "--check-hash-based-pycs")
EPOCH_WORDS = re.compile(r"epoch|iter|step|niter", re.IGNORECASE)


@dataclass(frozen=True)
class ScriptCommand:
    """``python [flags] train.py args`` or ``python [flags] -m package.module args``."""

    python: str  # the interpreter as given (a bare python: the one dl-ci runs in)
    flags: tuple[str, ...]  # the interpreter's own options (-u, -W ignore, ...)
    script: str  # a path, or a module name when ``module``
    module: bool
    args: tuple[str, ...]

    def text(self) -> str:
        """The command as the user gave it, for the report's target."""
        head = ["python", *self.flags, *(["-m"] if self.module else []), self.script]
        return shlex.join([*head, *self.args])


INTERPRETER = re.compile(r"python[0-9.]*(\.exe)?")


def command_words(target: str) -> list[str] | None:
    """The words of a training command given where a Target is named (the action's and the
    configuration's ``target``), or None for a ``module:function``: script mode's command
    starts with a Python interpreter.

    >>> command_words("python train.py --epochs 3"), command_words("pkg.train:make_target")
    (['python', 'train.py', '--epochs', '3'], None)
    """
    try:
        words = shlex.split(target)
    except ValueError:  # an unbalanced quote: not a command; the Target loader names it
        return None
    if words and INTERPRETER.fullmatch(os.path.basename(words[0])):
        return words
    return None


def split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """dl-ci's own arguments, and the command after the first ``--`` (empty without one).

    >>> split_command(["--budget", "pr", "--", "python", "t.py", "--", "x"])
    (['--budget', 'pr'], ['python', 't.py', '--', 'x'])
    """
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def parse_command(words: Sequence[str]) -> ScriptCommand:
    """The command after ``--``, checked: an interpreter, then a script or ``-m`` module."""
    words = list(words)
    if not words:
        raise DlciError("nothing follows --", hint=f"give the training command: {USAGE}")
    head = os.path.basename(words[0])
    if any(head == name or name in words[:3] for name in LAUNCHERS) or (
        len(words) > 2 and words[1] == "-m" and words[2] in LAUNCHERS
    ):
        raise DlciError(
            f"script mode cannot run a distributed launcher ({shlex.join(words[:3])}): it "
            "follows one process, one optimizer and one DataLoader",
            hint="run the script as one process (python train.py ...) to test that it learns, "
            f"or {TARGET_DOC}; dlci memorize --nproc N runs a Target under torchrun",
        )
    if not INTERPRETER.fullmatch(head):
        raise DlciError(
            f"the command after -- starts with {words[0]!r}, not a Python interpreter",
            hint=f"name the interpreter first: {USAGE}",
        )
    python = words[0]
    flags: list[str] = []
    rest = words[1:]
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c", "-"):
        flags.append(rest.pop(0))
        if flags[-1] in VALUED_FLAGS and rest:
            flags.append(rest.pop(0))
    if rest and rest[0] in ("-c", "-"):
        raise DlciError(
            f"python {rest[0]}: script mode runs a script file or a module",
            hint=f"put the code in a file: {USAGE}",
        )
    if rest and rest[0] == "-m":
        if len(rest) < 2:
            raise DlciError("python -m needs a module name", hint=USAGE)
        return ScriptCommand(python, tuple(flags), rest[1], True, tuple(rest[2:]))
    if not rest:
        raise DlciError("the command after -- names no script", hint=USAGE)
    if not os.path.isfile(rest[0]):
        raise DlciError(
            f"{rest[0]}: no such script", hint="run dlci from the folder the command works in"
        )
    return ScriptCommand(python, tuple(flags), rest[0], False, tuple(rest[1:]))


def epoch_arguments(args: Sequence[str], parsed: Sequence[tuple[str, str]]) -> list[str]:
    """The script's arguments that count its epochs, steps or iterations, as ``--name value``.

    ``parsed`` is what the script's own argparse parser found (option, value); the command
    line is read too (``--trainer.max_iters=30`` from a parser of its own).

    >>> epoch_arguments(["--epochs", "3", "--lr", "1"], [("--epochs", "3")])
    ['--epochs 3']
    >>> epoch_arguments(["--trainer.max_iters=30"], [])
    ['--trainer.max_iters 30']
    """
    found: dict[str, str] = {}
    for option, value in parsed:
        if EPOCH_WORDS.search(option):
            found.setdefault(option, value)
    words = list(args)
    for index, word in enumerate(words):
        if not word.startswith("-") or not EPOCH_WORDS.search(word.split("=")[0]):
            continue
        name, _, value = word.partition("=")
        if not value and index + 1 < len(words):
            value = words[index + 1]
        if re.fullmatch(r"-?\d+", value):
            found.setdefault(name, value)
    return [f"{name} {value}" for name, value in found.items()]


def raise_hint(arguments: list[str], epochs: int) -> str:
    """What to raise when the script ended before the tier: its own epoch argument.

    >>> print(raise_hint(["--epochs 3"], 1000))  # doctest: +NORMALIZE_WHITESPACE
    the script ended by its own count: raise --epochs (now 3) to at least 1000 (the tier's
    epochs; one memorised batch is one epoch)
    """
    tail = f"to at least {epochs} (the tier's epochs; one memorised batch is one epoch)"
    if not arguments:
        return (
            "the script ended by its own count, and no argument of its command line counts "
            f"epochs, steps or iterations: raise its epoch count {tail}"
        )
    names = " or ".join(f"{a.split(' ')[0]} (now {a.split(' ')[1]})" for a in arguments)
    return f"the script ended by its own count: raise {names} {tail}"
