"""`python -m ddmd` -> cli.main(). Nothing else."""

from ddmd.cli import main

main()
