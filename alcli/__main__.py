"""`python -m alcli` is the `alcli` command."""
from .cli import main

main()
