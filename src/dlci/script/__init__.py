"""Script mode: the user's own training script, unchanged, under ``dlci memorize -- python
train.py ...`` and ``dlci profile -- python train.py ...`` (docs/script-mode.md).

The parent side (command.py, run.py) imports no torch: it parses the command after ``--``,
chooses the tier, starts the script in a child process and writes the reports. The child
side (child.py) installs the hooks (hooks.py) before the script starts and drives the gate
from the script's own optimizer steps (gate.py: memorize; trace.py: profile).
"""
