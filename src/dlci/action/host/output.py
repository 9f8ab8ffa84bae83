"""What the host prints of what a container writes: read in chunks, under caps.

Host-side (the runner), never imports torch. A container's output (the job's containers, the
``RUN`` steps of a build) is the pull request's to fill: read line by line, one line of 384 MiB
with no newline took the host to 1.18 GB. Here it is read in chunks, each line cut at
LINE_LIMIT bytes and a container's output at OUTPUT_LIMIT bytes, the rest counted and dropped,
so the host's memory stays flat whatever a container writes.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable

from dlci.errors import DlciError

__all__ = ["CHUNK", "LINE_LIMIT", "OUTPUT_LIMIT", "Output", "explain_docker_run_failure"]

CHUNK = 1 << 16
LINE_LIMIT = 64 << 10
OUTPUT_LIMIT = 64 << 20
TAIL_LINES, TAIL_LINE = 50, 2048  # kept for docker's own start-up errors


def _mib(count: int) -> str:
    return f"{count / (1 << 20):.1f} MiB" if count >= 1 << 20 else f"{count} bytes"


class Output:
    """A container's output, fed in chunks, written out within the caps; the tail kept."""

    def __init__(
        self,
        write: Callable[[str], object],
        line_limit: int = LINE_LIMIT,
        limit: int = OUTPUT_LIMIT,
    ) -> None:
        self.write, self.line_limit, self.limit = write, line_limit, limit
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.printed = self.dropped = self.line = self.cut = 0
        self.tail: list[str] = []
        self.current = ""

    def feed(self, chunk: bytes) -> None:
        for piece in chunk.splitlines(keepends=True):
            ends = piece.endswith(b"\n")
            body = piece[:-1] if ends else piece
            room = max(0, min(self.line_limit - self.line, self.limit - self.printed))
            shown, extra = body[:room], len(body) - min(room, len(body))
            if shown:
                text = self.decoder.decode(shown)
                self.write(text)
                if len(self.current) < TAIL_LINE:
                    self.current += text[: TAIL_LINE - len(self.current)]
            self.printed += len(shown)
            self.line += len(shown)
            self.cut += extra
            self.dropped += extra
            if ends:
                self.end_line()

    def end_line(self) -> None:
        text = self.decoder.decode(b"", final=True)
        self.decoder.reset()
        if self.cut and self.printed < self.limit:
            text += f" [... {_mib(self.cut)} of this line dropped]"
        if self.printed < self.limit or self.cut == 0:
            self.write(text + "\n")
            self.printed += 1
        self.tail.append(self.current + "\n")
        del self.tail[:-TAIL_LINES]
        self.current, self.line, self.cut = "", 0, 0

    def close(self) -> str:
        """After the last chunk: the line that says what was dropped, or ''."""
        if self.line or self.cut or self.current:
            self.end_line()
        if not self.dropped:
            return ""
        return (
            f"dl-ci: {_mib(self.dropped)} of this container's output dropped (lines are cut "
            f"at {self.line_limit >> 10} KiB, a container's output at {self.limit >> 20} MiB)"
        )


def explain_docker_run_failure(stderr: str) -> DlciError | None:
    """Turn the Docker errors users hit when starting a GPU container into clear ones."""
    text = stderr.lower()
    if "could not select device driver" in text:
        return DlciError(
            'docker run --gpus failed: could not select device driver "" with capabilities: '
            "[[gpu]] (the NVIDIA container runtime is missing)",
            hint="install the NVIDIA Container Toolkit and restart Docker (docs/action.md)",
        )
    if "nvidia-container-cli" in text or "failed to initialize nvml" in text:
        return DlciError(
            "docker run --gpus failed in the NVIDIA container runtime: "
            + stderr.strip().splitlines()[-1],
            hint="check the driver on the host (nvidia-smi) and the toolkit's version",
        )
    if "no such image" in text or "pull access denied" in text or "manifest unknown" in text:
        return DlciError(
            "the container image is not available: " + stderr.strip().splitlines()[-1],
            hint="build it (leave the image input empty) or check the image name",
        )
    return None
