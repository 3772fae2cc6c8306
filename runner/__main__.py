"""Allow `python -m runner`."""

from runner.app.cli import main

raise SystemExit(main())
