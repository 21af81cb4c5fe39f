"""`python -m berth_tools.localcloud local up ...` (the same command as `berth local up`)."""

from berth_tools.localcloud.cli import main

main()
