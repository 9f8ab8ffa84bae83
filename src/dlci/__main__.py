"""Allow ``python -m dlci``."""

from dlci.cli import main

raise SystemExit(main())
