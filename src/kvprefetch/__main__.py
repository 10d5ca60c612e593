"""``python -m kvprefetch`` runs the CLI (useful where the console script is not installed)."""

from .cli import main

main()
