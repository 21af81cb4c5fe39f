"""`python -m berth.localcloud local up ...` (the same command as `berth local up`)."""

from berth.localcloud.cli import main

main()
