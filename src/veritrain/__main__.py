"""`python -m veritrain` is the same as the `veritrain` command."""

from veritrain.cli import main

main()
