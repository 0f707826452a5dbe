"""``python -m agentguard`` runs the command line."""

from agentguard.cli import main

raise SystemExit(main())
