"""``python -m agentguard`` runs the command line."""

try:  # Ctrl-C while the command line is imported ends it as quietly as later (exit 130)
    from agentguard.cli import main

    code = main()
except KeyboardInterrupt:
    code = 130
raise SystemExit(code)
